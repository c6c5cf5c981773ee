"""PostgreSQL: the tenants list counts the last minute's publishes through ``outbox_sent_at``
(a BRIN index on every outbox partition, migration 0028), not by reading every outbox row
the retention window keeps."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from celery_scheduler.core.clock import FrozenClock
from django_app import tenants
from django_app.db import partitions
from django_app.models import OutboxEntry

pytestmark = [pytest.mark.django_db, pytest.mark.postgres]
DAY = timedelta(days=1)
INDEX = "outbox_sent_at"


def _brin_indexes(options: bool = False) -> dict[str, Any]:
    """Every outbox partition (the default one too) -> its BRIN index (with ``options``:
    the index's name and storage parameters)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT t.relname, x.relname, x.reloptions FROM pg_inherits i"
            " JOIN pg_class t ON t.oid = i.inhrelid"
            " JOIN pg_index ix ON ix.indrelid = t.oid"
            " JOIN pg_class x ON x.oid = ix.indexrelid"
            " JOIN pg_am am ON am.oid = x.relam"
            " WHERE i.inhparent = %s::regclass AND am.amname = 'brin'",
            [OutboxEntry._meta.db_table],
        )
        return {part: (name, opts) if options else name for part, name, opts in cur.fetchall()}


def _outbox_partitions() -> set[str]:
    return {p.name for p in partitions.partitions(OutboxEntry._meta.db_table)}


def _plan_of_published_count(now: datetime) -> str:
    """The plan of the tenants list's published count, sequential scans priced out: it
    names the index only if the index can answer the query."""
    published = OutboxEntry.objects.published_since(now - tenants.PUBLISHED_WINDOW, now)
    sql, params = published.values_list("tenant_id").query.sql_with_params()
    with connection.cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off")
        cur.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        return json.dumps(cur.fetchone()[0])


def test_every_outbox_partition_has_the_sent_at_index(frozen_clock: FrozenClock) -> None:
    partitions.ensure(frozen_clock.now(), width=DAY, ahead=2, behind=2, wait=True)
    found = _brin_indexes(options=True)
    assert set(found) == _outbox_partitions()
    assert len(found) >= 6  # the default partition, the slots from migrate and these
    for part, (index, options) in found.items():
        assert index == partitions.child_index_name(INDEX, part)
        assert options == ["autosummarize=on"], (part, options)


def test_the_published_count_reads_the_index_not_every_row(frozen_clock: FrozenClock) -> None:
    partitions.ensure(frozen_clock.now(), width=DAY, ahead=1, behind=1, wait=True)
    plan = _plan_of_published_count(frozen_clock.now())
    assert "Seq Scan" not in plan, plan
    assert INDEX in plan, plan


@pytest.mark.django_db(transaction=True)
def test_migration_0028_builds_the_index_on_every_partition_and_drops_it() -> None:
    assert set(_brin_indexes()) == _outbox_partitions()
    try:
        MigrationExecutor(connection).migrate([("django_app", "0027_outbox_fillfactor")])
        assert _brin_indexes() == {}
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())
    found = _brin_indexes()
    assert set(found) == _outbox_partitions()
    assert set(found.values()) == {partitions.child_index_name(INDEX, p) for p in found}
