"""Trigram indexes for the admin's schedule search, on PostgreSQL only, when pg_trgm is there.

The admin searches schedules with ``name ILIKE '%term%' OR task ILIKE '%term%'`` (Django's
``icontains``: ``UPPER(col::text) LIKE UPPER(...)``). Without an index that is a scan of every
schedule, twice per page (the rows and their count). A GIN trigram index on the same
expressions answers terms of three characters or more from the index. ``pg_trgm`` ships with
PostgreSQL and is a trusted extension (PostgreSQL 13+: the database owner may create it);
where it cannot be created the migration leaves the search as it was, and says so.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import migrations

logger = logging.getLogger(__name__)

INDEXES = {
    "schedule_name_trgm": "name",
    "schedule_task_trgm": "task",
}


def create(apps: Any, schema_editor: Any) -> None:
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    table = connection.ops.quote_name(apps.get_model("django_app", "Schedule")._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute("SAVEPOINT cs_trgm")
        try:
            cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
        except Exception as exc:  # no privilege, or the contrib package is not installed
            cursor.execute("ROLLBACK TO SAVEPOINT cs_trgm")
            logger.warning("pg_trgm unavailable (%s): the admin's schedule search scans", exc)
            return
        cursor.execute("RELEASE SAVEPOINT cs_trgm")
        for name, column in INDEXES.items():
            cursor.execute(
                f"CREATE INDEX IF NOT EXISTS {name} ON {table} "
                f'USING gin (UPPER("{column}"::text) gin_trgm_ops)'
            )


def drop(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        for name in INDEXES:
            cursor.execute(f"DROP INDEX IF EXISTS {name}")


class Migration(migrations.Migration):
    dependencies = [
        ("django_app", "0014_admin_overview_lag_indexes"),
    ]

    operations = [migrations.RunPython(create, drop, elidable=False)]
