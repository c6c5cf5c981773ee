"""Index definitions whose shape differs by database."""

from __future__ import annotations

from typing import Any

from django.db import models


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
