"""Migration 0023 moves each schedule's cursor into its ScheduleCursor row, and back.

Rows written under the old schema (``next_run_at`` on the schedule) get a cursor row with
the same cursor and copies of shard, version and "is ACTIVE"; unmigrating puts the cursors
back on the schedules. Runs on SQLite, PostgreSQL and MariaDB.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

MIGRATION = ("django_app", "0023_schedule_cursor")
PARENT = ("django_app", "0020_partitioned_history")
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.mark.django_db(transaction=True)
def test_cursor_moves_to_its_row_and_back() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate([PARENT])
    apps = executor.loader.project_state([PARENT]).apps
    tenant = apps.get_model("django_app", "Tenant").objects.create(slug="globex")
    schedule_model = apps.get_model("django_app", "Schedule")
    rows = [
        ("ACTIVE", 3, 2, NOW),
        ("PAUSED", 5, 1, NOW.replace(hour=13)),
        ("CANCELED", 0, 4, None),
    ]
    made = {}
    for state, shard, version, cursor in rows:
        s = schedule_model.objects.create(
            tenant=tenant, name=state, task="billing.ping", kind="CRON", cron="* * * * *",
            state=state, shard=shard, version=version, next_run_at=cursor,
        )  # fmt: skip
        made[s.id] = (shard, version, state == "ACTIVE", cursor)

    executor = MigrationExecutor(connection)
    executor.migrate([MIGRATION])
    apps = executor.loader.project_state([MIGRATION]).apps
    cursor_model = apps.get_model("django_app", "ScheduleCursor")
    moved = {
        c.schedule_id: (c.shard, c.version, c.active, c.next_run_at)
        for c in cursor_model.objects.all()
    }
    assert moved == made

    executor = MigrationExecutor(connection)
    executor.migrate([PARENT])
    apps = executor.loader.project_state([PARENT]).apps
    back = dict(apps.get_model("django_app", "Schedule").objects.values_list("id", "next_run_at"))
    assert back == {sid: values[3] for sid, values in made.items()}

    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())
