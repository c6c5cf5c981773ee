"""The lifecycle API against a real database (SQLite by default, PostgreSQL in CI)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from celery_scheduler import api, errors
from celery_scheduler.core import ids
from celery_scheduler.core.clock import FrozenClock
from django_app.models import AuditEntry, Occurrence, OutboxEntry, Schedule, ScheduleVersion

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(NOW)


def make(clock: FrozenClock, **overrides: Any) -> Schedule:
    values: dict[str, Any] = {"name": "report", "task": "billing.ping", "cron": "*/5 * * * *"}
    values.update(overrides)
    return api.create_schedule(clock=clock, **values)


def materialize_fake(schedule: Schedule, at: datetime, state: str = "SCHEDULED") -> Occurrence:
    """An occurrence + outbox row as the materializer writes them."""
    occurrence = Occurrence.objects.create(
        id=ids.occurrence_id(schedule.id, schedule.version, at),
        schedule=schedule,
        schedule_version=schedule.version,
        tenant_id=schedule.tenant_id,
        scheduled_for=at,
        available_at=at,
        state=state,
    )
    OutboxEntry.objects.create(
        occurrence=occurrence, tenant_id=schedule.tenant_id, shard=schedule.shard, available_at=at
    )
    return occurrence


def test_create_sets_cursor_shard_and_first_version(clock: FrozenClock) -> None:
    schedule = make(clock, timezone="Europe/Berlin")
    assert schedule.next_run_at == datetime(2026, 3, 1, 12, 5, tzinfo=UTC)
    assert schedule.version == 1
    assert schedule.state == "ACTIVE"
    assert schedule.shard == ids.shard_for(schedule.id, 64)
    version = ScheduleVersion.objects.get(schedule=schedule)
    assert (version.version, version.cron, version.valid_to) == (1, "*/5 * * * *", None)


def test_interval_is_anchored_at_creation(clock: FrozenClock) -> None:
    schedule = make(clock, cron=None, interval=timedelta(seconds=90))
    assert schedule.kind == "INTERVAL"
    assert schedule.start_at == NOW
    assert schedule.next_run_at == NOW


def test_one_off_cursor_is_run_at(clock: FrozenClock) -> None:
    run_at = NOW + timedelta(minutes=10)
    schedule = make(clock, cron=None, run_at=run_at)
    assert (schedule.kind, schedule.next_run_at) == ("ONE_OFF", run_at)


@pytest.mark.parametrize(
    ("bounds", "field"),
    [
        ({"end_at": NOW + timedelta(days=1)}, "end_at"),
        ({"start_at": NOW + timedelta(days=3)}, "start_at"),
    ],
)
def test_a_one_off_outside_its_start_and_end_is_refused(
    clock: FrozenClock, bounds: dict[str, Any], field: str
) -> None:
    """Its run_at (in 2 days) would never fire: planning passes over it and completes."""
    with pytest.raises(errors.InvalidTiming, match="never fire") as refused:
        make(clock, cron=None, run_at=NOW + timedelta(days=2), **bounds)
    assert refused.value.field == field
    assert Schedule.objects.count() == 0


def test_idempotency_key_returns_same_schedule(clock: FrozenClock) -> None:
    first = make(clock, idempotency_key="nightly")
    again = make(clock, idempotency_key="nightly")
    assert again.id == first.id
    assert Schedule.objects.count() == 1


def test_idempotency_key_with_other_content_is_a_conflict(clock: FrozenClock) -> None:
    make(clock, idempotency_key="nightly")
    with pytest.raises(errors.IdempotencyConflict, match="nightly"):
        make(clock, idempotency_key="nightly", cron="0 * * * *")
    assert Schedule.objects.count() == 1


def test_a_keyed_one_off_replayed_after_its_run_at_returns_the_same_schedule(
    clock: FrozenClock,
) -> None:
    """A client retrying its create (a timeout, a lost response) after the one-off's run_at
    has passed gets its schedule back: the lateness refuses only a key that made nothing."""
    run_at = NOW + timedelta(minutes=1)
    first = make(clock, cron=None, run_at=run_at, idempotency_key="launch", actor="ci")
    clock.advance(timedelta(hours=1))
    again = make(clock, cron=None, run_at=run_at, idempotency_key="launch", actor="ci")
    assert again.id == first.id
    with pytest.raises(errors.IdempotencyConflict, match="launch"):
        make(clock, cron=None, run_at=run_at, idempotency_key="launch", name="other")
    for key in ("new", None):
        with pytest.raises(errors.InvalidTiming, match="beyond max_lateness") as late:
            make(clock, cron=None, run_at=run_at, idempotency_key=key)
        assert late.value.field == "run_at"
    assert Schedule.objects.count() == 1
    # The replay is audited as any replayed create is.
    assert AuditEntry.objects.filter(schedule_id=first.id, action="create").count() == 2


def test_idempotency_keys_are_per_tenant(clock: FrozenClock, tenant_factory: Any) -> None:
    other = tenant_factory("other")
    a = make(clock, idempotency_key="k")
    b = make(clock, idempotency_key="k", tenant=other)
    assert a.id != b.id


def test_update_bumps_version_and_invalidates_unclaimed(clock: FrozenClock) -> None:
    schedule = make(clock)
    pending = materialize_fake(schedule, datetime(2026, 3, 1, 12, 5, tzinfo=UTC))
    running = materialize_fake(schedule, datetime(2026, 3, 1, 12, 0, tzinfo=UTC), "RUNNING")
    done = materialize_fake(schedule, datetime(2026, 3, 1, 11, 55, tzinfo=UTC), "SUCCEEDED")

    result = api.update_schedule(schedule.id, clock=clock, args=[1, 2])

    assert (result.version, result.invalidated, result.still_running) == (2, 1, [running.id])
    assert result.describe() == (
        "report: active (version 2), 1 pending occurrence invalidated, 1 still running"
    )
    pending.refresh_from_db()
    assert pending.state == "CANCELED"
    assert OutboxEntry.objects.get(occurrence=pending).sent_at is not None
    assert Occurrence.objects.get(id=running.id).state == "RUNNING"
    assert Occurrence.objects.get(id=done.id).state == "SUCCEEDED"
    schedule.refresh_from_db()
    # Same trigger: the cursor goes back to the invalidated time so v2 re-materializes it.
    assert schedule.next_run_at == pending.scheduled_for
    assert schedule.args == [1, 2]
    assert Occurrence.objects.count() == 3  # nothing deleted


def test_update_of_timing_recomputes_cursor_from_now(clock: FrozenClock) -> None:
    schedule = make(clock)
    result = api.update_schedule(schedule.id, clock=clock, cron="0 9 * * *", timezone="Asia/Tokyo")
    assert result.schedule.next_run_at == datetime(2026, 3, 2, 0, 0, tzinfo=UTC)
    versions = list(ScheduleVersion.objects.filter(schedule=schedule).order_by("version"))
    assert [(v.version, v.valid_to) for v in versions] == [(1, NOW), (2, None)]


def test_update_rejects_bad_values_and_writes_nothing(clock: FrozenClock) -> None:
    schedule = make(clock)
    with pytest.raises(errors.InvalidCronExpression):
        api.update_schedule(schedule.id, clock=clock, cron="* * *")
    with pytest.raises(errors.ValidationError, match="Unknown schedule field"):
        api.update_schedule(schedule.id, clock=clock, colour="red")
    schedule.refresh_from_db()
    assert (schedule.version, schedule.cron) == (1, "*/5 * * * *")


def test_pause_resume_cancel_report_what_happened(clock: FrozenClock) -> None:
    schedule = make(clock)
    materialize_fake(schedule, datetime(2026, 3, 1, 12, 5, tzinfo=UTC))

    paused = api.pause_schedule(schedule.id, clock=clock)
    assert (paused.state, paused.version, paused.invalidated) == ("PAUSED", 2, 1)
    assert not api.pause_schedule(schedule.id, clock=clock).changed

    clock.advance(timedelta(minutes=1))
    resumed = api.resume_schedule(schedule.id, clock=clock)
    assert (resumed.state, resumed.version) == ("ACTIVE", 3)

    canceled = api.cancel_schedule(schedule.id, clock=clock)
    assert (canceled.state, canceled.version) == ("CANCELED", 4)
    assert canceled.schedule.next_run_at is None
    with pytest.raises(errors.InvalidStateTransition):
        api.resume_schedule(schedule.id, clock=clock)
    with pytest.raises(errors.InvalidStateTransition):
        api.update_schedule(schedule.id, clock=clock, name="x")


@pytest.mark.parametrize(
    ("policy", "expected_cursor"),
    [
        ("SKIP", datetime(2026, 3, 1, 13, 5, tzinfo=UTC)),  # next one after now
        ("FIRE_ONCE", datetime(2026, 3, 1, 13, 0, tzinfo=UTC)),  # latest missed only
        ("CATCH_UP", datetime(2026, 3, 1, 12, 50, tzinfo=UTC)),  # latest 3 missed
    ],
)
def test_resume_applies_misfire_policy(
    clock: FrozenClock, policy: str, expected_cursor: datetime
) -> None:
    schedule = make(clock, misfire_policy=policy, catchup_cap=3)
    api.pause_schedule(schedule.id, clock=clock)
    clock.advance(timedelta(hours=1))  # 12:00:30 -> 13:00:30; 12 fire times missed
    resumed = api.resume_schedule(schedule.id, clock=clock)
    assert resumed.schedule.next_run_at == expected_cursor


def test_run_now_writes_manual_occurrence_and_outbox(clock: FrozenClock) -> None:
    schedule = make(clock)
    occurrence = api.run_now(schedule.id, clock=clock)
    assert occurrence.manual
    assert occurrence.id == ids.occurrence_id(schedule.id, 1, NOW)
    assert OutboxEntry.objects.get(occurrence=occurrence).available_at == NOW


def test_unknown_schedule_id(clock: FrozenClock) -> None:
    with pytest.raises(errors.ScheduleNotFound):
        api.pause_schedule("00000000-0000-0000-0000-000000000000", clock=clock)
    with pytest.raises(errors.ScheduleNotFound):
        api.cancel_schedule("not-a-uuid", clock=clock)


def test_quota_on_schedule_count(clock: FrozenClock, tenant_factory: Any) -> None:
    small = tenant_factory("small", max_schedules=1)
    make(clock, tenant=small)
    with pytest.raises(errors.QuotaExceeded, match="max_schedules=1"):
        make(clock, tenant=small, name="second")


def test_preview_without_database() -> None:
    rows = api.preview(
        cron="30 2 * * *", timezone="Europe/Berlin", start=datetime(2026, 3, 28, tzinfo=UTC)
    )
    assert rows[0].utc == datetime(2026, 3, 28, 1, 30, tzinfo=UTC)
    # 29 March 2026: 02:30 does not exist in Berlin, so the next run is on the 30th.
    assert rows[1].utc == datetime(2026, 3, 30, 0, 30, tzinfo=UTC)
    assert "skipped" in rows[1].note
