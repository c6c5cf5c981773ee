"""The set-based materializer against the per-schedule one, on PostgreSQL.

Differential: random schedules of every kind, misfire policy, window and bound; each path
runs from the same database state inside a rolled-back savepoint, and both must leave the
same occurrence, outbox and schedule rows and report the same counts.
"""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from celery_scheduler.core import ids
from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.core.enums import MisfirePolicy, OccurrenceState
from django_app import conf
from django_app.materialize.per_schedule import MaterializeReport, trigger_for
from django_app.materialize.set_based import materialize_due_bulk
from django_app.models import Occurrence, OutboxEntry, Schedule, ShardLease, Tenant
from django_app.wiring import materialize_due
from tests.integration.plans import read_by

NOW = datetime(2026, 3, 29, 0, 30, tzinfo=UTC)  # Europe's spring-forward night
MINUTE = timedelta(minutes=1)
pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

CRONS = [
    ("* * * * *", "UTC"),
    ("*/5 * * * *", "UTC"),
    ("0 * * * *", "Asia/Kolkata"),
    ("30 2 * * *", "Europe/Berlin"),
    ("*/7 1-3 * * *", "Europe/London"),
    ("15 20 * * *", "America/New_York"),
]
#: Cursor offsets from NOW that many random schedules share.
SHARED_OFFSETS = [-3600, -600, -60, 60, 120]


class _Undo(Exception):
    pass


def random_schedule(rng: random.Random, tenant: Tenant) -> Schedule:
    sid = uuid.UUID(int=rng.getrandbits(128), version=4)
    kind = rng.choice(["CRON", "CRON", "INTERVAL", "ONE_OFF", "ONE_OFF"])
    fields: dict[str, Any] = {"kind": kind}
    # Half the cursors from a small grid: schedules sharing timing and cursor (the top of
    # the hour) share one plan in the bulk path, which must not conflate different ones.
    offset = rng.choice(SHARED_OFFSETS) if rng.random() < 0.5 else None
    cursor = NOW + timedelta(seconds=offset or rng.randint(-4 * 3600, 3 * 60))
    if kind == "CRON":
        fields["cron"], fields["timezone"] = rng.choice(CRONS)
    elif kind == "INTERVAL":
        fields["interval_seconds"] = rng.choice([30, 45, 60, 600, 3600])
        if rng.random() < 0.5:  # else anchored on created_at
            fields["start_at"] = cursor - timedelta(seconds=rng.randint(0, 900))
    else:
        fields["run_at"] = cursor = NOW + timedelta(seconds=rng.randint(-2 * 3600, 5 * 60))
    if kind != "ONE_OFF" and rng.random() < 0.2:
        fields["end_at"] = NOW + timedelta(seconds=rng.randint(-3600, 120))
    return Schedule.objects.create(  # type: ignore[misc]  # next_run_at: a property
        id=sid,
        tenant=tenant,
        name=f"s-{sid.hex[:8]}",
        task="billing.tasks.noop",
        shard=ids.shard_for(sid, conf.get().shard_count),
        next_run_at=cursor,
        misfire_policy=rng.choice(list(MisfirePolicy)).value,
        max_lateness_seconds=rng.choice([0, 60, 600, 3600]),
        catchup_cap=rng.choice([0, 1, 3]),
        flexible_window_seconds=rng.choice([0, 0, 0, 120]),
        priority=rng.randint(0, 9),
        **fields,
    )


def snapshot() -> dict[str, Any]:
    return {
        "occurrences": sorted(
            Occurrence.objects.values_list(
                "id",
                "schedule_id",
                "schedule_version",
                "tenant_id",
                "scheduled_for",
                "available_at",
                "state",
                "reason",
                "finished_at",
                "created_at",
            )
        ),
        "outbox": sorted(
            OutboxEntry.objects.values_list(
                "occurrence_id", "tenant_id", "shard", "available_at", "priority", "sent_at"
            )
        ),
        "schedules": sorted(
            Schedule.objects.values_list("id", "version", "state", "next_run_at", "updated_at")
        ),
    }


def run_undone(fn: Callable[[], MaterializeReport]) -> tuple[MaterializeReport, dict[str, Any]]:
    """Run ``fn`` in a savepoint, take the resulting rows, then roll everything back."""
    result: list[Any] = []
    try:
        with transaction.atomic():
            result.append(fn())
            result.append(snapshot())
            raise _Undo
    except _Undo:
        pass
    return result[0], result[1]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_bulk_path_writes_exactly_what_the_per_schedule_path_writes(seed: int) -> None:
    rng = random.Random(seed)
    tenants = [
        Tenant.objects.create(slug=f"t{seed}-a"),
        Tenant.objects.create(slug=f"t{seed}-b", catchup_rate=6),
    ]
    schedules = [random_schedule(rng, rng.choice(tenants)) for _ in range(120)]
    # Some keys exist already (another node got there first): conflicts, not duplicates.
    for s in rng.sample(schedules, 15):
        assert s.next_run_at is not None
        first = trigger_for(s).first_at_or_after(s.next_run_at)
        if first is None:
            continue
        Occurrence.objects.create(
            id=ids.occurrence_id(s.id, s.version, first),
            schedule=s,
            schedule_version=s.version,
            tenant_id=s.tenant_id,
            scheduled_for=first,
            available_at=first,
            state=OccurrenceState.SUCCEEDED.value,
        )
    clock = FrozenClock(NOW)
    horizon = 2 * MINUTE
    # The per-schedule side is pinned: on PostgreSQL materialize_due defaults to the bulk path.
    with override_settings(CELERY_SCHEDULER={"max_missed_per_pass": 4, "bulk_materialize": 0}):
        single_report, single_rows = run_undone(
            lambda: materialize_due(clock=clock, horizon=horizon, batch_size=9)
        )
    with override_settings(CELERY_SCHEDULER={"max_missed_per_pass": 4}):
        bulk_report, bulk_rows = run_undone(
            lambda: materialize_due_bulk(clock=clock, horizon=horizon, batch_size=9)
        )
    assert single_report.occurrences_created > 50
    assert single_report.missed > 20
    assert single_report.completed > 5
    assert single_report.conflicts >= 1
    assert single_report.history_jumped >= 1
    assert bulk_rows == single_rows
    assert bulk_report == single_report


#: Each differs from BASE in one input of the plan; all share the cursor NOW - 30 min.
VARIANTS: list[dict[str, Any]] = [
    {},
    {"cron": "*/5 * * * *"},
    {"timezone": "Asia/Kolkata"},
    {"misfire_policy": "CATCH_UP"},
    {"misfire_policy": "CATCH_UP", "catchup_cap": 3},
    {"max_lateness_seconds": 3600},
    {"end_at": NOW - timedelta(minutes=10)},
    {"start_at": NOW - timedelta(minutes=5)},
    {"kind": "INTERVAL", "cron": "", "interval_seconds": 420},
    {
        "kind": "INTERVAL",
        "cron": "",
        "interval_seconds": 420,
        "start_at": NOW - timedelta(hours=1, seconds=13),
    },
]
BASE: dict[str, Any] = {
    "kind": "CRON", "cron": "*/3 * * * *", "timezone": "UTC", "misfire_policy": "FIRE_ONCE",
    "max_lateness_seconds": 600, "catchup_cap": 10,
}  # fmt: skip


def test_schedules_sharing_a_cursor_get_their_own_plans_in_one_batch() -> None:
    """The bulk path shares one plan between schedules with equal timing inputs; each
    variant differs in one input and must be planned as the per-schedule path plans it."""
    tenant = Tenant.objects.create(slug="variants")
    cursor = NOW - timedelta(minutes=30)
    for variant in VARIANTS * 3:  # three of each: shared plans and distinct ones
        sid = uuid.uuid4()
        Schedule.objects.create(  # type: ignore[misc]  # next_run_at: a property
            id=sid, tenant=tenant, name=sid.hex[:8], task="billing.tasks.noop",
            shard=ids.shard_for(sid, conf.get().shard_count), next_run_at=cursor,
            **{**BASE, **variant},
        )  # fmt: skip
    clock = FrozenClock(NOW)
    with override_settings(CELERY_SCHEDULER={"bulk_materialize": 0}):
        single_report, single_rows = run_undone(
            lambda: materialize_due(clock=clock, horizon=2 * MINUTE)
        )
    bulk_report, bulk_rows = run_undone(
        lambda: materialize_due_bulk(clock=clock, horizon=2 * MINUTE)
    )
    assert len({o[4] for o in single_rows["occurrences"]}) > 10  # the variants' times differ
    assert bulk_rows == single_rows
    assert bulk_report == single_report


def make(tenant: Tenant, **fields: Any) -> Schedule:
    sid = uuid.uuid4()
    return Schedule.objects.create(  # type: ignore[misc]  # next_run_at: a property
        id=sid,
        tenant=tenant,
        name=sid.hex[:8],
        task="billing.tasks.noop",
        kind="ONE_OFF",
        run_at=NOW,
        next_run_at=NOW,
        shard=ids.shard_for(sid, conf.get().shard_count),
        **fields,
    )


@pytest.mark.parametrize(
    ("setting", "routed"),
    [
        ({}, True),
        ({"bulk_materialize": "auto"}, True),
        ({"bulk_materialize": True}, True),
        ({"bulk_materialize": False}, False),
    ],
)
def test_the_setting_routes_materialize_due_to_the_bulk_path(
    monkeypatch: Any, setting: dict[str, Any], routed: bool
) -> None:
    """On PostgreSQL the bulk path is the default ("auto"); False pins the per-schedule one."""
    tenant = Tenant.objects.create(slug="route")
    make(tenant)
    calls: list[int] = []
    import django_app.materialize.set_based as bulk

    real = bulk._write_batch

    def counting(read: list[bulk.DueSchedule], **kw: Any) -> MaterializeReport:
        calls.append(len(read))
        return real(read, **kw)

    monkeypatch.setattr(bulk, "_write_batch", counting)
    with override_settings(CELERY_SCHEDULER=setting):
        report = materialize_due(clock=FrozenClock(NOW), horizon=MINUTE)
    assert calls == ([1] if routed else [])
    assert report.occurrences_created == 1
    assert report.completed == 1


def test_stale_fencing_token_writes_nothing_for_that_shard() -> None:
    tenant = Tenant.objects.create(slug="fence")
    a, b = make(tenant), make(tenant)
    while b.shard == a.shard:
        b = make(tenant)
    ShardLease.objects.create(shard=a.shard, owner="n1", fencing_token=5)
    ShardLease.objects.create(shard=b.shard, owner="n1", fencing_token=7)
    report = materialize_due_bulk(
        clock=FrozenClock(NOW), shard_fencing={a.shard: 4, b.shard: 7}, horizon=MINUTE
    )
    assert report.fenced == 1
    assert report.occurrences_created == 1
    assert not Occurrence.objects.filter(schedule=a).exists()
    assert Occurrence.objects.filter(schedule=b).count() == 1
    a.refresh_from_db()
    assert a.next_run_at == NOW
    assert a.state == "ACTIVE"


def test_a_schedule_locked_by_a_lifecycle_call_is_skipped_not_waited_for() -> None:
    tenant = Tenant.objects.create(slug="locks")
    locked, free = make(tenant), make(tenant)
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with transaction.atomic():
            Schedule.objects.select_for_update().get(pk=locked.pk)
            holding.set()
            release.wait(10)
        connection.close()

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert holding.wait(10)
        report = materialize_due_bulk(clock=FrozenClock(NOW), horizon=MINUTE)
    finally:
        release.set()
        thread.join(10)
    assert report.occurrences_created == 1
    assert Occurrence.objects.filter(schedule=free).count() == 1
    assert not Occurrence.objects.filter(schedule=locked).exists()
    # Next pass (lock gone) picks it up.
    assert materialize_due_bulk(clock=FrozenClock(NOW), horizon=MINUTE).occurrences_created == 1


def test_rejected_batch_falls_back_to_the_per_schedule_path(monkeypatch: Any) -> None:
    tenant = Tenant.objects.create(slug="fallback")
    schedules = [make(tenant) for _ in range(3)]
    import django_app.materialize.set_based as bulk

    def reject(planned: Any, *, now: datetime) -> int:
        raise bulk._BatchRejected("simulated")

    monkeypatch.setattr(bulk, "_advance", reject)
    report = materialize_due_bulk(clock=FrozenClock(NOW), horizon=MINUTE)
    assert report.occurrences_created == 3
    assert report.completed == 3
    for s in schedules:
        assert Occurrence.objects.filter(schedule=s).count() == 1
        assert OutboxEntry.objects.filter(occurrence__schedule=s).count() == 1


def test_a_batch_reads_its_schedules_by_key_not_the_whole_table() -> None:
    """A shard's due rows are a small part of the schedule table; a batch locks and reads
    those by key. Seen failing on the one-join read, which PostgreSQL planned, from these
    statistics, as a hash join over a scan of all 3,000 schedules for a shard's ~47."""
    tenant = Tenant.objects.create(slug="bykey")
    rng = random.Random(3_000)  # fixed: the same shards, the same due count, every run
    sids = [uuid.UUID(int=rng.getrandbits(128), version=4) for _ in range(3_000)]
    Schedule.objects.bulk_create(
        Schedule(  # type: ignore[misc]  # next_run_at: a property
            id=sid, tenant=tenant, name=sid.hex[:8], task="billing.tasks.noop", kind="CRON",
            cron="30 * * * *", shard=ids.shard_for(sid, 64), next_run_at=NOW,
        )
        for sid in sids
    )  # fmt: skip
    with connection.cursor() as cur:
        cur.execute("ANALYZE django_app_schedule, django_app_schedulecursor")
    shard = ids.shard_for(sids[0], 64)
    due = sum(ids.shard_for(sid, 64) == shard for sid in sids)
    with transaction.atomic():
        with CaptureQueriesContext(connection) as captured:
            report = materialize_due_bulk(clock=FrozenClock(NOW), shards=[shard], horizon=MINUTE)
        assert report.occurrences_created == due
        transaction.set_rollback(True)
    batch_reads = [q for q in captured.captured_queries if "SKIP LOCKED" in q["sql"]]
    assert batch_reads
    with transaction.atomic():
        read = read_by(batch_reads, ("django_app_schedule",), price_out_scans=False)
        transaction.set_rollback(True)
    assert read <= due, (read, due)
