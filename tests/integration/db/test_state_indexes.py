"""PostgreSQL: the occurrence's indexes by state leave SUCCEEDED rows out (migration 0026),
the run path's reads by state still go through them, and ``index_swap.replace`` rebuilds an
index of the partitioned table partition by partition, concurrently, under its own name."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection, models

from celery_scheduler.core.enums import OccurrenceState as S
from django_app.compat import PostgresPartialIndex
from django_app.db import index_swap, partitions
from django_app.models import NOT_SUCCEEDED, Occurrence, Schedule
from tests.integration.worker_support import make_schedule

pytestmark = [
    pytest.mark.skipif(
        os.environ.get("DATABASE_URL", "").split(":")[0] not in ("postgres", "postgresql"),
        reason="partial indexes by state are PostgreSQL's",
    ),
]
STATE_INDEXES = (
    "occurrence_schedule_state",
    "occurrence_state_time",
    "occurrence_tenant_state_time",
)
DAY = datetime(2026, 12, 3, tzinfo=UTC)
NOW = DAY + timedelta(hours=12)


def _slot() -> str:
    """The occurrence partition that holds DAY (created here if the clock has none)."""
    width = timedelta(days=1)
    partitions.ensure(DAY, width=width, ahead=0, wait=True)
    return partitions.slot_name(partitions.tables()[0], DAY, width)


def _seed(schedule: Schedule, state: S, n: int, *, start: int = 0) -> None:
    """``n`` rows of ``schedule`` in ``state``, one second apart from DAY + ``start`` s."""
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO django_app_occurrence (id, schedule_id, schedule_version, tenant_id, "
            "scheduled_for, available_at, state, manual, overlap_policy, attempt_count, "
            "fencing_token, lease_owner, lease_expires_at, created_at, last_error, reason) "
            "SELECT gen_random_uuid(), %(s)s, 1, %(t)s, %(at)s + g * interval '1 second', "
            "%(at)s, %(state)s, false, '', 0, 0, '', %(lease)s, %(at)s, '', '' "
            "FROM generate_series(%(start)s, %(start)s + %(n)s - 1) g",
            {
                "s": schedule.id, "t": schedule.tenant_id, "at": DAY, "state": state.value,
                "n": n, "start": start, "lease": NOW - timedelta(minutes=1),
            },
        )  # fmt: skip


def _index_tuples(slot: str) -> dict[str, float]:
    """Entries per index of ``slot``, exact after a VACUUM (by the parent index's name)."""
    with connection.cursor() as cur:
        cur.execute(f"VACUUM {slot}")
        cur.execute(
            "SELECT pi.relname, ci.reltuples FROM pg_index x JOIN pg_class ci ON ci.oid = "
            "x.indexrelid JOIN pg_inherits h ON h.inhrelid = ci.oid JOIN pg_class pi ON "
            "pi.oid = h.inhparent WHERE x.indrelid = %s::regclass",
            [slot],
        )
        return dict(cur.fetchall())


@pytest.mark.django_db(transaction=True)
def test_a_completed_row_leaves_the_state_indexes_and_an_unfinished_one_stays(
    tenant: Any,
) -> None:
    slot = _slot()
    schedule = make_schedule(tenant)
    _seed(schedule, S.RUNNING, 300)
    _seed(schedule, S.DEAD, 5, start=300)
    _seed(schedule, S.ENQUEUED, 7, start=305)
    # The completion's write: RUNNING -> SUCCEEDED, as the worker's completion makes it.
    done = Occurrence.objects.filter(state=S.RUNNING.value).update(state=S.SUCCEEDED.value)
    assert done == 300
    entries = _index_tuples(slot)
    assert entries["occurrence_admin_time"] == 312  # every row, as before
    for name in STATE_INDEXES:
        assert entries[name] == 12, (name, entries)


def _index_names(node: dict[str, Any]) -> Iterator[str]:
    if "Index Name" in node:
        yield node["Index Name"]
    for child in node.get("Plans", []):
        yield from _index_names(child)


def _plan_indexes(queryset: Any) -> set[str]:
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cur:
        cur.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        plan = cur.fetchone()[0][0]["Plan"]
    return {name.rsplit("_", 1)[0] for name in _index_names(plan)}


@pytest.mark.django_db(transaction=True)
def test_the_run_paths_reads_by_state_go_through_the_partial_indexes(tenant: Any) -> None:
    slot = _slot()
    schedule = make_schedule(tenant)
    _seed(schedule, S.SUCCEEDED, 20_000)
    _seed(schedule, S.RUNNING, 3, start=20_000)
    _seed(schedule, S.ENQUEUED, 3, start=20_003)
    _seed(schedule, S.DEAD, 3, start=20_006)
    with connection.cursor() as cur:
        cur.execute(f"ANALYZE {slot}")
    rows = Occurrence.objects
    reads = {
        "reaper": (rows.lease_expired(NOW), "occurrence_state_time"),
        "dead count": (rows.filter(state=S.DEAD.value), "occurrence_state_time"),
        "tenant running": (
            rows.running_leased(NOW - timedelta(hours=1)).filter(tenant_id=tenant.id),
            "occurrence_tenant_state_time",
        ),
        "waiting line": (
            rows.unclaimed().filter(tenant_id=tenant.id).order_by("scheduled_for"),
            "occurrence_tenant_state_time",
        ),
        "overlap": (
            rows.filter(schedule_id=schedule.id, state=S.RUNNING.value),
            "occurrence_schedule_state",
        ),
    }
    for what, (queryset, index) in reads.items():
        used = _plan_indexes(queryset)
        # The one named, or (the planner's pick on these rows) another of the three.
        assert index in used or used & set(STATE_INDEXES), (what, used)
    # And the rows they find are the unfinished ones, not the 20,000 SUCCEEDED.
    assert rows.lease_expired(NOW).count() == 3
    assert rows.unclaimed().filter(tenant_id=tenant.id).count() == 3


def _definitions(name: str) -> dict[str, tuple[str, bool]]:
    """``name`` and its partitions' indexes: index name -> (definition's WHERE, valid)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT c.relname, pg_get_indexdef(x.indexrelid), x.indisvalid FROM pg_index x "
            "JOIN pg_class c ON c.oid = x.indexrelid WHERE c.relname = %(n)s OR c.oid IN "
            "(SELECT inhrelid FROM pg_inherits WHERE inhparent = %(n)s::regclass)",
            {"n": name},
        )
        return {n: (d.partition(" WHERE ")[2], v) for n, d, v in cur.fetchall()}


@pytest.mark.django_db(transaction=True)
def test_replace_builds_each_partition_concurrently_and_keeps_the_name(tenant: Any) -> None:
    slot = _slot()
    _seed(make_schedule(tenant), S.SUCCEEDED, 50)
    fields = ["state", "scheduled_for"]
    partial = PostgresPartialIndex(
        fields=fields, condition=NOT_SUCCEEDED, name="occurrence_state_time"
    )
    whole = models.Index(fields=fields, name="occurrence_state_time")
    table = partitions.tables()[0]
    parts = sorted(p.name for p in partitions.partitions(table))
    assert slot in parts
    # A run that stopped half way left an invalid parent index under the temporary name.
    with connection.cursor() as cur:
        cur.execute(f"CREATE INDEX occurrence_state_time__new ON ONLY {table} (state)")
    statements: list[str] = []

    def record(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        statements.append(sql)
        return execute(sql, params, many, context)

    try:
        with connection.execute_wrapper(record), connection.schema_editor(atomic=False) as editor:
            index_swap.replace(editor, Occurrence, partial, whole)
        built = [s for s in statements if s.startswith("CREATE INDEX")]
        assert built[0].startswith(f'CREATE INDEX "occurrence_state_time__new" ON ONLY "{table}"')
        on_parts = sorted(s.split(" ON ")[1].split()[0].strip('"') for s in built[1:])
        assert on_parts == parts
        assert all(s.startswith("CREATE INDEX CONCURRENTLY") for s in built[1:])
        after = _definitions("occurrence_state_time")
        assert set(after) == {"occurrence_state_time"} | {
            f"occurrence_state_time_{p.rsplit('_', 1)[-1]}" for p in parts
        }
        assert all(where == "" and valid for where, valid in after.values()), after
    finally:
        with connection.schema_editor(atomic=False) as editor:
            index_swap.replace(editor, Occurrence, whole, partial)
    back = _definitions("occurrence_state_time")
    assert len(back) == len(parts) + 1
    assert all("SUCCEEDED" in where and valid for where, valid in back.values()), back
