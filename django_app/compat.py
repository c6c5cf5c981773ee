"""What differs between the supported Django versions (4.2 LTS, 5.2 LTS) and databases.

Django 5.1 renamed ``CheckConstraint(check=)`` to ``condition=`` (``check=`` warns from 5.1 and
is gone in 6.0), replaced ``LogEntry.objects.log_action`` by ``log_actions``, and gave SQLite
the ``transaction_mode`` and ``init_command`` OPTIONS (on 4.2 see :mod:`django_app.sqlite3`).
Models and migrations build their constraints here so both versions get the same schema,
and their indexes whose shape differs by database (:class:`PostgresPartialIndex`).
"""

from __future__ import annotations

from typing import Any

import django
from django.db import models

#: Django 5.1+: ``condition=``, ``log_actions`` and SQLite's ``transaction_mode`` exist.
DJANGO_51 = django.VERSION >= (5, 1)
#: Django 5.0+: ``Field(db_default=...)`` exists.
DJANGO_50 = django.VERSION >= (5, 0)


def db_default(value: Any) -> dict[str, Any]:
    """``{"db_default": value}`` on 5.0+ (rows inserted by raw SQL get it), ``{}`` on 4.2,
    where only the ORM's ``default`` applies (every insert path names the column)."""
    return {"db_default": value} if DJANGO_50 else {}


def check_constraint(*, condition: models.Q, name: str) -> models.CheckConstraint:
    """``CheckConstraint(condition=...)`` on 5.1+, ``CheckConstraint(check=...)`` on 4.2."""
    if DJANGO_51:
        return models.CheckConstraint(condition=condition, name=name)
    # The 4.2 spelling, which 5.2's stubs do not know.
    keyword: dict[str, Any] = {"check": condition}
    return models.CheckConstraint(name=name, **keyword)


def log_change(user_id: Any, obj: models.Model, message: str) -> None:
    """One CHANGE entry in Django's admin log (History) for ``obj``."""
    # deferred (app registry): models.py imports this module while the apps load
    from django.contrib.admin.models import CHANGE, LogEntry

    if DJANGO_51:
        LogEntry.objects.log_actions(
            user_id=user_id, queryset=[obj], action_flag=CHANGE, change_message=message,
            single_object=True,
        )  # fmt: skip
        return
    # deferred (app registry): models.py imports this module while the apps load
    from django.contrib.contenttypes.models import ContentType

    # log_action is the 4.2 API; 5.2's stubs no longer list it.
    log_action = getattr(LogEntry.objects, "log_action")  # noqa: B009
    log_action(
        user_id=user_id,
        content_type_id=ContentType.objects.get_for_model(obj, for_concrete_model=False).pk,
        object_id=obj.pk,
        object_repr=str(obj),
        action_flag=CHANGE,
        change_message=message,
    )


class PostgresPartialIndex(models.Index):
    """Partial (its ``condition``) on PostgreSQL, whole on SQLite and MariaDB.

    PostgreSQL proves that a query's ``state = 'RUNNING'`` falls inside
    ``WHERE NOT state = 'SUCCEEDED'``, so a partial index serves every query that names a
    state other than the excluded one. SQLite uses a partial index only for a query that
    repeats the condition's term word for word, and MariaDB has no partial indexes: there
    the whole index is what serves those queries.
    """

    def create_sql(
        self, model: type[models.Model], schema_editor: Any, using: str = "", **kwargs: Any
    ) -> Any:
        if schema_editor.connection.vendor == "postgresql":
            return super().create_sql(model, schema_editor, using=using, **kwargs)
        whole = models.Index(fields=list(self.fields), name=self.name)
        return whole.create_sql(model, schema_editor, using=using, **kwargs)


class PostgresBrinIndex(models.Index):
    """A BRIN index on PostgreSQL, a B-tree on SQLite and MariaDB (which have no BRIN).

    A BRIN index keeps one small summary (the least and greatest value) per range of table
    pages, not one entry per row: for a column that grows with the table's physical order,
    a range query reads the few page ranges that can hold matches, and an insert or update
    writes nothing into the index unless it widens its range's summary. A range the index
    has not summarized yet is read whole by every query, so ``autosummarize`` has autovacuum
    summarize each range as soon as the table's inserts move on to the next.
    """

    def create_sql(
        self, model: type[models.Model], schema_editor: Any, using: str = "", **kwargs: Any
    ) -> Any:
        if schema_editor.connection.vendor == "postgresql":
            statement = super().create_sql(model, schema_editor, using=" USING brin", **kwargs)
            # As django.contrib.postgres's BrinIndex(autosummarize=True) writes it.
            parts: dict[str, Any] = statement.parts
            parts["extra"] = f" WITH (autosummarize = on){parts['extra']}"
            return statement
        return super().create_sql(model, schema_editor, using=using, **kwargs)
