"""The materializer against a real database (SQLite by default, PostgreSQL via DATABASE_URL)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import override_settings

from celery_scheduler import metrics
from celery_scheduler.core import ids
from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.core.enums import MisfirePolicy, OccurrenceState, ScheduleState
from django_app import conf
from django_app.materialize import per_schedule
from django_app.materialize.per_schedule import MaterializeReport, trigger_for
from django_app.models import (
    Occurrence,
    OutboxEntry,
    Schedule,
    ScheduleCursor,
    ShardLease,
    Tenant,
)

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
pytestmark = pytest.mark.django_db
#: Each test runs every materializer (the ``materializer`` fixture, ``tests/contracts.py``);
#: one whose claim is about the per-schedule transactions says so in its name.
Materializer = Callable[..., MaterializeReport]
#: Pins the per-schedule path behind ``django_app.wiring.materialize_due`` (PostgreSQL defaults
#: to the set-based one), for a test elsewhere whose claim is about its transactions.
per_schedule_path = override_settings(CELERY_SCHEDULER={"bulk_materialize": False})


def make_schedule(tenant: Tenant, **fields: Any) -> Schedule:
    """A Schedule row as the lifecycle API would leave it (shard and cursor set)."""
    sid = fields.pop("id", None) or uuid.uuid4()
    fields.setdefault("kind", "CRON")
    if fields["kind"] == "CRON":
        fields.setdefault("cron", "* * * * *")
    fields.setdefault("next_run_at", NOW)
    return Schedule.objects.create(
        id=sid,
        tenant=tenant,
        name=fields.pop("name", f"s-{sid.hex[:6]}"),
        task="billing.tasks.noop",
        shard=ids.shard_for(sid, conf.get().shard_count),
        **fields,
    )


def states(schedule: Schedule) -> dict[datetime, str]:
    return {
        o.scheduled_for: o.state
        for o in Occurrence.objects.filter(schedule=schedule).order_by("scheduled_for")
    }


def at(*minutes_from_now: int) -> list[datetime]:
    return [NOW + m * MINUTE for m in minutes_from_now]


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(NOW)


def test_due_schedule_gets_occurrences_outbox_and_cursor(
    materializer: Materializer, tenant: Tenant, clock: FrozenClock
) -> None:
    s = make_schedule(tenant, priority=7)
    report = materializer(clock=clock, horizon=2 * MINUTE)
    assert report.schedules_seen == 1
    assert report.occurrences_created == 3
    assert report.conflicts == report.missed == report.stale_cursor == 0
    occs = list(Occurrence.objects.filter(schedule=s).order_by("scheduled_for"))
    assert [o.scheduled_for for o in occs] == at(0, 1, 2)
    for o in occs:
        assert o.id == ids.occurrence_id(s.id, s.version, o.scheduled_for)
        assert o.state == OccurrenceState.SCHEDULED
        assert o.available_at == o.scheduled_for  # strict: no window
        assert o.tenant_id == tenant.id
        box = OutboxEntry.objects.get(occurrence=o)
        assert (box.available_at, box.shard, box.priority, box.sent_at) == (
            o.available_at,
            s.shard,
            7,
            None,
        )
    s.refresh_from_db()
    assert s.next_run_at == NOW + 3 * MINUTE
    assert s.state == ScheduleState.ACTIVE


def test_second_run_is_a_no_op_and_schedules_outside_horizon_are_not_touched(
    materializer: Materializer, tenant: Tenant, clock: FrozenClock
) -> None:
    s = make_schedule(tenant)
    far = make_schedule(tenant, next_run_at=NOW + timedelta(hours=1), cron="0 * * * *")
    materializer(clock=clock, horizon=MINUTE)
    again = materializer(clock=clock, horizon=MINUTE)
    assert again.schedules_seen == 0
    assert Occurrence.objects.filter(schedule=s).count() == 2
    assert not Occurrence.objects.filter(schedule=far).exists()
    far.refresh_from_db()
    assert far.next_run_at == NOW + timedelta(hours=1)


def test_only_active_schedules_and_requested_shards(
    materializer: Materializer, tenant: Tenant, clock: FrozenClock
) -> None:
    paused = make_schedule(tenant, state=ScheduleState.PAUSED.value)
    active = make_schedule(tenant)
    other = [x for x in range(conf.get().shard_count) if x != active.shard]
    assert materializer(clock=clock, shards=other).schedules_seen == 0
    assert materializer(clock=clock, shards=[active.shard]).schedules_seen == 1
    assert not Occurrence.objects.filter(schedule=paused).exists()


def test_batches_cover_every_due_schedule(
    materializer: Materializer, tenant: Tenant, clock: FrozenClock
) -> None:
    many = [make_schedule(tenant, next_run_at=NOW - k * MINUTE) for k in range(7)]
    report = materializer(clock=clock, horizon=timedelta(0), batch_size=2)
    assert report.schedules_seen == 7
    for s in many:
        s.refresh_from_db()
        assert s.next_run_at == NOW + MINUTE


@pytest.mark.parametrize(
    ("policy", "fired", "missed"),
    [
        (MisfirePolicy.SKIP, [-1, 0, 1], range(-10, -1)),
        (MisfirePolicy.FIRE_ONCE, [-2, -1, 0, 1], range(-10, -2)),
        (MisfirePolicy.CATCH_UP, [-4, -3, -2, -1, 0, 1], range(-10, -4)),
    ],
)
def test_ten_minute_outage_under_each_policy(
    materializer: Materializer,
    tenant: Tenant,
    clock: FrozenClock,
    policy: MisfirePolicy,
    fired: list[int],
    missed: range,
) -> None:
    """Cursor 10 minutes in the past, per-minute cron, max lateness 60 s, catch-up cap 3.

    Late = more than 60 s before now: 11:50..11:58 (nine). 11:59 is exactly 60 s late, so on
    time. The horizon is one minute, so 12:00 and 12:01 are due too.
    """
    s = make_schedule(
        tenant,
        next_run_at=NOW - 10 * MINUTE,
        misfire_policy=policy.value,
        max_lateness_seconds=60,
        catchup_cap=3,
    )
    report = materializer(clock=clock, horizon=MINUTE)
    expected = dict.fromkeys(at(*fired), "SCHEDULED") | dict.fromkeys(at(*missed), "MISSED")
    assert states(s) == dict(sorted(expected.items()))
    assert report.occurrences_created == len(fired)
    assert report.missed == len(missed)
    sent = set(OutboxEntry.objects.values_list("occurrence__scheduled_for", flat=True))
    assert sent == set(at(*fired))  # MISSED occurrences are never published
    reasons = set(
        Occurrence.objects.filter(state="MISSED").values_list("reason", flat=True).distinct()
    )
    assert all(r.startswith(f"misfire {policy.value}:") for r in reasons)
    s.refresh_from_db()
    assert s.next_run_at == NOW + 2 * MINUTE  # resumed from the cursor, not from now


def test_catch_up_is_released_at_the_tenant_rate(
    materializer: Materializer, tenant_factory: Callable[..., Tenant], clock: FrozenClock
) -> None:
    slow = tenant_factory("slow", catchup_rate=2)  # two per minute: one every 30 s
    s = make_schedule(
        slow,
        next_run_at=NOW - 10 * MINUTE,
        misfire_policy="CATCH_UP",
        max_lateness_seconds=60,
        catchup_cap=3,
    )
    materializer(clock=clock, horizon=timedelta(0))
    avail = dict(Occurrence.objects.filter(schedule=s).values_list("scheduled_for", "available_at"))
    assert [avail[t] for t in at(-4, -3, -2)] == [
        NOW,
        NOW + timedelta(seconds=30),
        NOW + timedelta(seconds=60),
    ]
    assert avail[NOW - MINUTE] == NOW - MINUTE  # on time: not throttled
    assert avail[NOW] == NOW


def test_flexible_window_jitter_is_deterministic(
    materializer: Materializer, tenant: Tenant, clock: FrozenClock
) -> None:
    s = make_schedule(tenant, flexible_window_seconds=300)
    materializer(clock=clock, horizon=10 * MINUTE)
    for o in Occurrence.objects.filter(schedule=s):
        assert o.available_at == ids.available_at(o.id, o.scheduled_for, 300)
        assert o.scheduled_for <= o.available_at < o.scheduled_for + timedelta(seconds=300)
        assert OutboxEntry.objects.get(occurrence=o).available_at == o.available_at


def test_one_off_completes_after_its_occurrence(
    materializer: Materializer, tenant: Tenant, clock: FrozenClock
) -> None:
    s = make_schedule(tenant, kind="ONE_OFF", run_at=NOW + 30 * timedelta(seconds=1))
    s.next_run_at = s.run_at
    s.save()
    report = materializer(clock=clock, horizon=MINUTE)
    assert report.completed == 1
    s.refresh_from_db()
    assert (s.state, s.next_run_at) == (ScheduleState.COMPLETED, None)
    assert list(states(s)) == [NOW + timedelta(seconds=30)]


def test_end_at_completes_and_start_at_is_respected(
    materializer: Materializer, tenant: Tenant, clock: FrozenClock
) -> None:
    ending = make_schedule(tenant, end_at=NOW + MINUTE)
    starting = make_schedule(tenant, next_run_at=NOW - 5 * MINUTE, start_at=NOW + MINUTE)
    materializer(clock=clock, horizon=5 * MINUTE)
    assert list(states(ending)) == at(0, 1)
    ending.refresh_from_db()
    assert (ending.state, ending.next_run_at) == (ScheduleState.COMPLETED, None)
    assert list(states(starting)) == at(1, 2, 3, 4, 5)


def test_interval_schedule_uses_elapsed_time_from_its_anchor(
    materializer: Materializer, tenant: Tenant, clock: FrozenClock
) -> None:
    anchor = NOW - timedelta(seconds=10)
    s = make_schedule(tenant, kind="INTERVAL", interval_seconds=45, start_at=anchor)
    assert trigger_for(s).next_after(anchor) == anchor + timedelta(seconds=45)
    materializer(clock=clock, horizon=2 * MINUTE)
    # 11:59:50 + 45k: 12:00:35 and 12:01:20 are due; 12:02:05 is past the horizon.
    assert list(states(s)) == [anchor + timedelta(seconds=45 * k) for k in (1, 2)]


def test_per_schedule_only_a_stale_version_or_cursor_rolls_back_everything(
    tenant: Tenant, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node that read the schedule before an update must not write anything of the old one."""
    s = make_schedule(tenant)

    real_plan = per_schedule.plan_pass

    def update_behind_its_back(*args: Any, **kwargs: Any) -> Any:
        # Simulates the lifecycle API committing an update between read and write.
        Schedule.objects.filter(id=s.id).update(version=2)  # the cursor row's copy too
        ScheduleCursor.objects.filter(pk=s.id).update(next_run_at=NOW + 5 * MINUTE)
        return real_plan(*args, **kwargs)

    monkeypatch.setattr(per_schedule, "plan_pass", update_behind_its_back)
    report = per_schedule.materialize_due(clock=clock, horizon=MINUTE)
    assert report.stale_cursor == 1
    assert report.occurrences_created == 0
    assert not Occurrence.objects.exists()
    assert not OutboxEntry.objects.exists()
    s.refresh_from_db()
    assert (s.version, s.next_run_at) == (2, NOW + 5 * MINUTE)  # not moved back


def test_an_existing_occurrence_is_a_counted_conflict(
    materializer: Materializer, tenant: Tenant, clock: FrozenClock
) -> None:
    s = make_schedule(tenant)
    occ_id = ids.occurrence_id(s.id, s.version, NOW)
    Occurrence.objects.create(
        id=occ_id,
        schedule=s,
        schedule_version=1,
        tenant=tenant,
        scheduled_for=NOW,
        available_at=NOW,
    )
    m = metrics.reset()
    report = materializer(clock=clock, horizon=MINUTE)
    assert report.conflicts == 1
    assert m.value("celery_scheduler_uniqueness_conflicts_total") == 1
    assert m.value("celery_scheduler_materialized_total") == 1
    assert report.occurrences_created == 1
    assert not OutboxEntry.objects.filter(occurrence_id=occ_id).exists()
    assert Occurrence.objects.filter(schedule=s).count() == 2


def test_lost_fencing_token_writes_nothing(
    materializer: Materializer, tenant: Tenant, clock: FrozenClock
) -> None:
    s = make_schedule(tenant)
    ShardLease.objects.create(shard=s.shard, owner="new-owner", fencing_token=8)
    stale = materializer(clock=clock, shard_fencing={s.shard: 7})
    assert (stale.fenced, stale.occurrences_created) == (1, 0)
    assert not Occurrence.objects.exists()
    s.refresh_from_db()
    assert s.next_run_at == NOW
    current = materializer(clock=clock, shard_fencing={s.shard: 8}, horizon=timedelta(0))
    assert (current.fenced, current.occurrences_created) == (0, 1)


def test_long_outage_writes_bounded_history(
    materializer: Materializer, tenant: Tenant, clock: FrozenClock, settings: Any
) -> None:
    settings.CELERY_SCHEDULER = {"max_missed_per_pass": 20}
    s = make_schedule(tenant, next_run_at=NOW - timedelta(days=7), misfire_policy="FIRE_ONCE")
    report = materializer(clock=clock, horizon=timedelta(0))
    assert report.history_jumped == 1
    assert 15 <= report.missed <= 20
    # The latest late one (11:54) + the six on time (11:55..12:00 within 300 s lateness).
    assert report.occurrences_created == 1 + 6
    missed = list(Occurrence.objects.filter(state="MISSED").order_by("scheduled_for"))
    assert missed[-1].scheduled_for == NOW - 7 * MINUTE  # recorded right up to the fired one
    s.refresh_from_db()
    assert s.next_run_at == NOW + MINUTE


def test_empty_fencing_map_means_no_shards(
    materializer: Materializer, tenant: Tenant, clock: FrozenClock
) -> None:
    make_schedule(tenant)
    assert materializer(clock=clock, shard_fencing={}).schedules_seen == 0
    assert not Occurrence.objects.exists()


def test_one_unreadable_schedule_does_not_block_the_others(
    materializer: Materializer, tenant: Tenant, clock: FrozenClock
) -> None:
    broken = make_schedule(tenant, timezone="Mars/Olympus_Mons", next_run_at=NOW - MINUTE)
    fine = make_schedule(tenant)
    report = materializer(clock=clock, horizon=timedelta(0))
    assert (report.schedules_seen, report.invalid, report.occurrences_created) == (2, 1, 1)
    assert list(states(fine)) == [NOW]
    broken.refresh_from_db()
    assert broken.next_run_at == NOW - MINUTE
