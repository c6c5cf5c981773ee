"""Replace an index of a large table without blocking its writes, for migrations.

On PostgreSQL the new index is built beside the old one under a temporary name with
``CREATE INDEX CONCURRENTLY``: reads and writes go on while it builds. A partitioned table
cannot be indexed concurrently as a whole, so its index is created ``ON ONLY`` the parent
(invalid, empty), built concurrently on each partition, and each partition's index attached;
the parent's becomes valid once every partition has one. Then, in one short transaction
bounded by ``lock_timeout``, the old index is dropped and the new one takes its name (the
partitions' indexes are renamed after it, as :func:`django_app.db.partitions.name_indexes`
names them). Only that transaction takes a lock that stops writes, and it changes the
catalog only. A migration that ends half way (a timeout, a killed process) can be run again:
the leftovers of the temporary name are dropped first.

Inside a transaction (a test database, which Django builds in one) concurrent builds are not
allowed, and the plain statements are used. SQLite and MariaDB: the schema editor's own
remove and add.

:class:`ReplaceIndex` is the migration operation: to Django's migration state it is a
``RemoveIndex`` of the old definition and an ``AddIndex`` of the new, under the same name.
:class:`AddIndexConcurrently` builds a new index the same way, with nothing to swap.
"""

from __future__ import annotations

import re
from typing import Any

from django.db import models, transaction
from django.db.migrations.operations.base import Operation
from django.db.migrations.state import ProjectState

from django_app.db import partitions
from django_app.db import queries as sql

#: How long the swap's transaction waits for its lock on the table before the migration
#: fails (run it again: the built index is rebuilt, nothing is lost).
SWAP_LOCK_TIMEOUT_MS = 10_000

_CREATE = re.compile(
    r'^CREATE INDEX "?(?P<name>[^" ]+)"? ON "?(?P<table>[^" ]+)"? (?P<body>(USING \w+ )?\(.*)$'
)


def _body(model: type[models.Model], index: models.Index, schema_editor: Any) -> str:
    """The columns and ``WHERE`` clause of ``index`` as the schema editor would create it."""
    statement = str(index.create_sql(model, schema_editor))
    m = _CREATE.match(statement)
    if m is None:
        raise ValueError(f"unexpected index statement: {statement}")
    return m.group("body")


def replace(
    schema_editor: Any, model: type[models.Model], old: models.Index, new: models.Index
) -> None:
    """Replace ``old`` with ``new`` on ``model``'s table (see the module's docstring)."""
    if schema_editor.connection.vendor != "postgresql":
        schema_editor.remove_index(model, old)
        schema_editor.add_index(model, new)
        return
    temp = f"{new.name[:58]}__new"
    conn = schema_editor.connection
    parts = _build(schema_editor, model, new, temp)
    with transaction.atomic(using=conn.alias), conn.cursor() as cur:
        cur.execute(sql.lock_timeout(SWAP_LOCK_TIMEOUT_MS))
        cur.execute(sql.drop_index(old.name))
        cur.execute(sql.rename_index(temp, new.name))
        for part in parts:
            partitions.name_indexes(part)


def _build(
    schema_editor: Any, model: type[models.Model], index: models.Index, name: str
) -> list[str]:
    """Build ``index`` as ``name``, concurrently partition by partition outside a transaction
    (dropping what a run that ended half way left under that name first); returns the
    table's partitions ([] for a plain table)."""
    table = model._meta.db_table
    body = _body(model, index, schema_editor)
    conn = schema_editor.connection
    parts = (
        [p.name for p in partitions.partitions(table)] if partitions.is_partitioned(table) else []
    )
    with conn.cursor() as cur:
        cur.execute(sql.drop_index(name))
        for part in parts:
            cur.execute(sql.drop_index(partitions.child_index_name(name, part)))
        concurrently = not conn.in_atomic_block
        cur.execute(sql.create_index(name, table, body, only=bool(parts) and concurrently,
                                     concurrently=concurrently and not parts))  # fmt: skip
        if parts and concurrently:
            for part in parts:
                child = partitions.child_index_name(name, part)
                cur.execute(sql.create_index(child, part, body, concurrently=True))
                cur.execute(sql.attach_index(name, child))
    return parts


def add(schema_editor: Any, model: type[models.Model], index: models.Index) -> None:
    """Create ``index`` on ``model``'s table without blocking its writes on PostgreSQL (see
    the module's docstring; there is no old index to swap, so no lock is taken at the end)."""
    if schema_editor.connection.vendor != "postgresql":
        schema_editor.add_index(model, index)
        return
    for part in _build(schema_editor, model, index, index.name):
        partitions.name_indexes(part)


class AddIndexConcurrently(Operation):
    """Migration operation: Django's ``AddIndex``, built without blocking writes on
    PostgreSQL (:func:`add`); unapplied with the schema editor's drop. Needs a migration
    with ``atomic = False`` to build concurrently."""

    reduces_to_sql = False
    reversible = True

    def __init__(self, model_name: str, index: models.Index) -> None:
        self.model_name = model_name
        self.index = index

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        kwargs = {"model_name": self.model_name, "index": self.index}
        return self.__class__.__name__, [], kwargs

    def state_forwards(self, app_label: str, state: ProjectState) -> None:
        state.add_index(app_label, self.model_name.lower(), self.index)

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            add(schema_editor, model, self.index)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            schema_editor.remove_index(model, self.index)

    def describe(self) -> str:
        return f"Create index {self.index.name} on {self.model_name}"

    @property
    def migration_name_fragment(self) -> str:
        return f"{self.model_name.lower()}_{self.index.name.lower()}"


class ReplaceIndex(Operation):
    """Migration operation: ``old`` gives way to ``new`` (same name, new definition),
    built without blocking writes on PostgreSQL (:func:`replace`). Needs a migration with
    ``atomic = False`` to build concurrently."""

    reduces_to_sql = False
    reversible = True

    def __init__(self, model_name: str, old: models.Index, new: models.Index) -> None:
        if old.name != new.name:
            raise ValueError("ReplaceIndex keeps the index's name")
        self.model_name = model_name
        self.old = old
        self.new = new

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        kwargs = {"model_name": self.model_name, "old": self.old, "new": self.new}
        return self.__class__.__name__, [], kwargs

    def state_forwards(self, app_label: str, state: ProjectState) -> None:
        state.remove_index(app_label, self.model_name.lower(), self.old.name)
        state.add_index(app_label, self.model_name.lower(), self.new)

    def _swap(
        self, app_label: str, schema_editor: Any, state: ProjectState, old: Any, new: Any
    ) -> None:
        model = state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            replace(schema_editor, model, old, new)

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        self._swap(app_label, schema_editor, to_state, self.old, self.new)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        self._swap(app_label, schema_editor, to_state, self.new, self.old)

    def describe(self) -> str:
        return f"Replace index {self.new.name} on {self.model_name}"

    @property
    def migration_name_fragment(self) -> str:
        return f"replace_{self.new.name.lower()}"
