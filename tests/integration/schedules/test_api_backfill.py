"""backfill: run the fire times of a past range, once, paced at the tenant's catch-up rate."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from celery_scheduler import api, errors
from celery_scheduler.api_types import BackfillReport, as_json
from celery_scheduler.core import ids
from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.publishers import RecordingPublisher
from django_app.models import Occurrence, OutboxEntry, Schedule
from django_app.operations.reconcile import reconcile
from django_app.relay.batch import relay_due
from django_app.wiring import materialize_due
from django_app.worker import claim
from django_app.worker.claim import ClaimOutcome

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC)
START = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
END = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)  # 12 fire times of */5


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(NOW)


def make(clock: FrozenClock, **overrides: Any) -> Schedule:
    values: dict[str, Any] = {"name": "report", "task": "billing.ping", "cron": "*/5 * * * *"}
    values.update(overrides)
    return api.create_schedule(clock=clock, **values)


def backfilled(schedule: Schedule) -> list[Occurrence]:
    return list(
        Occurrence.objects.filter(schedule=schedule, schedule_version=0).order_by("scheduled_for")
    )


def test_backfill_runs_each_fire_time_once_with_deterministic_ids(clock: FrozenClock) -> None:
    s = make(clock)
    report = api.backfill(s.id, START, END, clock=clock)

    assert isinstance(report, BackfillReport)
    assert (report.fire_times, len(report.created), report.already_backfilled) == (12, 12, 0)
    rows = backfilled(s)
    assert [o.scheduled_for for o in rows] == [START + timedelta(minutes=5 * i) for i in range(12)]
    assert all(o.manual and o.state == "SCHEDULED" for o in rows)
    assert OutboxEntry.objects.filter(occurrence__in=rows, sent_at__isnull=True).count() == 12

    again = api.backfill(s.id, START, END, clock=clock)
    assert (len(again.created), again.already_backfilled) == (0, 12)
    # Overlapping ranges share their times.
    wider = api.backfill(s.id, START - timedelta(minutes=10), END, clock=clock)
    assert (len(wider.created), wider.already_backfilled) == (2, 12)
    publisher = RecordingPublisher()
    relay_due(clock=clock, publisher=publisher)
    assert len(publisher.sent) == 14
    assert len({m.task_id for m in publisher.sent}) == 14
    as_json(report)


def test_backfill_does_not_rerun_times_that_already_ran(clock: FrozenClock) -> None:
    s = make(clock)
    ran = START + timedelta(minutes=5)
    missed = START + timedelta(minutes=10)
    for at, state in ((ran, "SUCCEEDED"), (missed, "MISSED")):
        Occurrence.objects.create(
            id=ids.occurrence_id(s.id, s.version, at), schedule=s, schedule_version=s.version,
            tenant_id=s.tenant_id, scheduled_for=at, available_at=at, state=state,
        )  # fmt: skip
    report = api.backfill(s.id, START, END, clock=clock)
    assert report.already_ran == 1
    assert ran not in {o.scheduled_for for o in backfilled(s)}
    assert missed in {o.scheduled_for for o in backfilled(s)}  # a missed time does run


def test_backfill_is_released_at_the_tenant_catchup_rate(
    clock: FrozenClock, tenant_factory: Any
) -> None:
    tenant_factory("paced", catchup_rate=6)  # one every 10 s
    s = make(clock, tenant="paced")
    report = api.backfill(s.id, START, END, clock=clock)
    releases = sorted(o.available_at for o in backfilled(s))
    assert releases == [NOW + timedelta(seconds=10 * i) for i in range(12)]
    assert (report.releases_from, report.releases_until) == (releases[0], releases[-1])
    # A second backfill of the same tenant queues behind the first.
    other = make(clock, tenant="paced", name="other")
    api.backfill(other.id, START, START + timedelta(minutes=10), clock=clock)
    assert sorted(o.available_at for o in backfilled(other)) == [
        NOW + timedelta(seconds=120),
        NOW + timedelta(seconds=130),
    ]
    publisher = RecordingPublisher()
    relay_due(clock=clock, publisher=publisher)
    assert len(publisher.sent) == 1  # only the first is due now


def test_backfill_overlap_policy_skips_while_one_runs(clock: FrozenClock) -> None:
    s = make(clock)  # the schedule's own policy is ALLOW
    api.backfill(s.id, START, START + timedelta(minutes=10), overlap_policy="SKIP_IF_RUNNING",
                 clock=clock)  # fmt: skip
    first, second = backfilled(s)
    assert claim.claim(first.id, worker="w", clock=clock).claimed
    assert claim.claim(second.id, worker="w", clock=clock).outcome is (ClaimOutcome.SKIPPED_OVERLAP)


def test_backfill_runs_while_paused_and_is_not_a_run_nor_unexpected(clock: FrozenClock) -> None:
    s = make(clock, max_runs=1)
    api.pause_schedule(s.id, clock=clock)
    api.backfill(s.id, START, START + timedelta(minutes=5), clock=clock)
    (occ,) = backfilled(s)
    assert claim.claim(occ.id, worker="w", clock=clock).claimed
    s.refresh_from_db()
    assert (s.runs_count, s.state) == (0, "PAUSED")
    report = reconcile(start=START, end=END, now=clock.now())
    assert report.unexpected == []
    d = api.describe_schedule(s.id, clock=clock)
    assert d.recent[0].origin == "backfill"


@pytest.mark.parametrize(
    ("start", "end", "field"),
    [
        (END, START, "end"),
        (START, START, "end"),
        (START, NOW + timedelta(hours=1), "end"),  # not a past range
        (datetime(2026, 3, 1, 9, 0), END, "start"),  # naive
        ("yesterday", END, "start"),
        (START - timedelta(days=400), END, "end"),  # too many fire times
    ],
)
def test_bad_ranges_name_the_field_and_write_nothing(
    clock: FrozenClock, start: Any, end: Any, field: str
) -> None:
    s = make(clock)
    with pytest.raises(errors.ValidationError) as info:
        api.backfill(s.id, start, end, clock=clock)
    assert info.value.field == field
    assert not Occurrence.objects.exists()


def test_bad_overlap_policy_and_canceled_schedule(clock: FrozenClock) -> None:
    s = make(clock)
    with pytest.raises(errors.ValidationError) as info:
        api.backfill(s.id, START, END, overlap_policy="SOMETIMES", clock=clock)
    assert info.value.field == "overlap_policy"
    api.cancel_schedule(s.id, clock=clock)
    with pytest.raises(errors.InvalidStateTransition):
        api.backfill(s.id, START, END, clock=clock)
    assert not Occurrence.objects.exists()


def test_backfill_is_scoped_to_the_tenant(clock: FrozenClock, tenant_factory: Any) -> None:
    tenant_factory("a")
    tenant_factory("b")
    s = make(clock, tenant="a")
    with pytest.raises(errors.ScheduleNotFound):
        api.backfill(s.id, START, END, tenant="b", clock=clock)
    assert not Occurrence.objects.exists()


def at(hour: int, minute: int) -> datetime:
    return datetime(2026, 3, 1, hour, minute, tzinfo=UTC)


@pytest.mark.parametrize("policy", ["CATCH_UP", "FIRE_ONCE"])
def test_a_resume_does_not_run_again_what_a_backfill_ran_while_paused(
    clock: FrozenClock, policy: str
) -> None:
    s = make(clock, misfire_policy=policy)
    api.pause_schedule(s.id, clock=clock)
    clock.set(at(12, 31))
    # Up to 12:30 included: the time FIRE_ONCE keeps of the paused-over ones.
    assert len(api.backfill(s.id, at(12, 5), at(12, 31), clock=clock).created) == 6
    api.resume_schedule(s.id, clock=clock)
    publisher = RecordingPublisher()
    for _ in range(6):  # up to 12:36: the resumed schedule plans what it catches up, then 12:35
        materialize_due(clock=clock, horizon=timedelta(0))
        relay_due(clock=clock, publisher=publisher)
        clock.advance(60)
    runs = Counter(m.scheduled_for for m in publisher.sent)
    assert max(runs.values()) == 1, runs
    assert set(runs) == {at(12, m) for m in (5, 10, 15, 20, 25, 30, 35)}
    # The reconciler finds the backfills where the resumed version would have run.
    report = reconcile(start=at(12, 0), end=at(12, 36), now=clock.now())
    assert report.absent == [], report.absent


def test_a_backfill_refuses_times_an_active_schedule_has_not_planned_yet(
    clock: FrozenClock,
) -> None:
    # The beats were down from 12:05 to 12:31: the schedule still has those times to plan
    # (by its misfire policy, CATCH_UP here). Backfilled too, they would run twice.
    s = make(clock, misfire_policy="CATCH_UP")
    materialize_due(clock=clock, horizon=timedelta(0))
    clock.set(at(12, 31))
    with pytest.raises(errors.ValidationError) as info:
        api.backfill(s.id, at(11, 50), at(12, 30), clock=clock)
    assert info.value.field == "end"
    assert "12:05" in str(info.value)
    assert not backfilled(s)
    # Up to the cursor it goes through; once planned, the times the policy missed can be.
    assert len(api.backfill(s.id, at(11, 50), at(12, 5), clock=clock).created) == 3
