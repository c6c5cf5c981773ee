"""skip_occurrence: one fire time never runs; the schedule stays active."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from celery_scheduler import api, errors
from celery_scheduler.core import ids
from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.publishers import RecordingPublisher
from django_app.models import Occurrence, OutboxEntry, Schedule
from django_app.operations.reconcile import ABSENT, reconcile
from django_app.relay.batch import relay_due
from django_app.wiring import materialize_due
from django_app.worker import claim, finish

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC)
T5 = datetime(2026, 3, 1, 12, 5, tzinfo=UTC)
T10 = datetime(2026, 3, 1, 12, 10, tzinfo=UTC)
T15 = datetime(2026, 3, 1, 12, 15, tzinfo=UTC)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(NOW)


def make(clock: FrozenClock, **overrides: Any) -> Schedule:
    values: dict[str, Any] = {"name": "report", "task": "billing.ping", "cron": "*/5 * * * *"}
    values.update(overrides)
    return api.create_schedule(clock=clock, **values)


def run_until(clock: FrozenClock, until: datetime) -> RecordingPublisher:
    """Materialize and relay minute by minute up to ``until``."""
    publisher = RecordingPublisher()
    while clock.now() < until:
        clock.advance(60)
        materialize_due(clock=clock, horizon=timedelta(0))
        relay_due(clock=clock, publisher=publisher)
    return publisher


def published_times(publisher: RecordingPublisher) -> list[datetime]:
    return sorted(m.scheduled_for for m in publisher.sent)


def test_skip_next_before_it_is_materialized(clock: FrozenClock) -> None:
    s = make(clock)
    result = api.skip_occurrence(s.id, clock=clock)
    assert result.scheduled_for == T5
    assert result.occurrence_id is None
    assert api.describe_schedule(s.id, clock=clock).next_fire_times[0].utc == T10

    publisher = run_until(clock, T10 + timedelta(seconds=30))

    assert published_times(publisher) == [T10]
    skipped = Occurrence.objects.get(scheduled_for=T5)
    assert skipped.state == "CANCELED"
    assert skipped.reason.startswith("skipped by operator")
    assert not OutboxEntry.objects.filter(occurrence=skipped).exists()
    assert Schedule.objects.get(pk=s.id).state == "ACTIVE"
    report = reconcile(start=NOW, end=T10 + timedelta(seconds=1), now=clock.now())
    statuses = {i.scheduled_for: i.status for i in report.expected}
    assert statuses == {T5: "canceled", T10: "pending"}
    assert ABSENT not in statuses.values()
    assert api.describe_schedule(s.id, clock=clock).counters.skipped == 1


def test_skip_an_already_materialized_occurrence(clock: FrozenClock) -> None:
    s = make(clock)
    materialize_due(clock=clock, horizon=timedelta(minutes=10))
    occ = Occurrence.objects.get(scheduled_for=T10)
    result = api.skip_occurrence(s.id, scheduled_for=T10, note="holiday", clock=clock)
    assert result.occurrence_id == occ.id
    occ.refresh_from_db()
    assert occ.state == "CANCELED"
    assert occ.reason == "skipped by operator: holiday"
    publisher = run_until(clock, T10 + timedelta(seconds=30))
    assert published_times(publisher) == [T5]
    # A worker that got the message anyway does not run the body.
    assert claim.claim(occ.id, worker="w", clock=clock).outcome.value == "DUPLICATE"


def test_a_skip_note_is_as_long_as_the_markers_reason_can_keep(clock: FrozenClock) -> None:
    """The note goes into the marker's 200-character reason after "skipped by operator: "
    (a 250-character note was accepted, then PostgreSQL refused the row: a 500 over HTTP)."""
    s = make(clock)
    materialize_due(clock=clock, horizon=timedelta(minutes=10))
    with pytest.raises(errors.ValidationError, match="at most 179") as refused:
        api.skip_occurrence(s.id, scheduled_for=T10, note="n" * 180, clock=clock)
    assert refused.value.field == "note"
    assert Occurrence.objects.get(scheduled_for=T10).state == "SCHEDULED"
    api.skip_occurrence(s.id, scheduled_for=T10, note="n" * 179, clock=clock)
    assert Occurrence.objects.get(scheduled_for=T10).reason == f"skipped by operator: {'n' * 179}"


def test_a_skip_survives_pause_and_resume(clock: FrozenClock) -> None:
    s = make(clock)
    api.skip_occurrence(s.id, scheduled_for=T10, clock=clock)
    api.pause_schedule(s.id, clock=clock)
    api.resume_schedule(s.id, clock=clock)
    publisher = run_until(clock, T10 + timedelta(seconds=30))
    assert published_times(publisher) == [T5]
    report = reconcile(start=NOW, end=T10 + timedelta(seconds=1), now=clock.now())
    assert report.ok, report.absent


def test_skipping_twice_is_idempotent(clock: FrozenClock) -> None:
    s = make(clock)
    api.skip_occurrence(s.id, scheduled_for=T10, clock=clock)
    again = api.skip_occurrence(s.id, scheduled_for=T10, clock=clock)
    assert again.scheduled_for == T10
    assert Schedule.objects.get(pk=s.id).skip_times == [T10.isoformat()]


@pytest.mark.parametrize(
    ("when", "field"),
    [
        (datetime(2026, 3, 1, 12, 7, tzinfo=UTC), "scheduled_for"),  # not a fire time
        (datetime(2026, 3, 1, 12, 10), "scheduled_for"),  # naive
        ("tomorrow", "scheduled_for"),
        (datetime(2026, 3, 1, 11, 55, tzinfo=UTC), "scheduled_for"),  # in the past
    ],
)
def test_bad_times_name_the_field(clock: FrozenClock, when: Any, field: str) -> None:
    s = make(clock)
    with pytest.raises(errors.ValidationError) as info:
        api.skip_occurrence(s.id, scheduled_for=when, clock=clock)
    assert info.value.field == field
    assert Schedule.objects.get(pk=s.id).skip_times == []


def test_a_running_or_finished_occurrence_cannot_be_skipped(clock: FrozenClock) -> None:
    s = make(clock)
    materialize_due(clock=clock, horizon=timedelta(minutes=10))
    occ = Occurrence.objects.get(scheduled_for=T5)
    clock.set(T5)
    assert claim.claim(occ.id, worker="w", clock=clock).claimed
    with pytest.raises(errors.InvalidStateTransition, match="RUNNING"):
        api.skip_occurrence(s.id, scheduled_for=T5, clock=clock)
    api.cancel_schedule(s.id, clock=clock)
    with pytest.raises(errors.InvalidStateTransition):
        api.skip_occurrence(s.id, clock=clock)


def test_skip_respects_the_tenant(clock: FrozenClock, tenant_factory: Any) -> None:
    tenant_factory("a")
    tenant_factory("b")
    s = make(clock, tenant="a")
    with pytest.raises(errors.ScheduleNotFound):
        api.skip_occurrence(s.id, tenant="b", clock=clock)
    assert ids.occurrence_id(s.id, 1, T5) not in set(
        Occurrence.objects.values_list("id", flat=True)
    )


def test_a_skip_survives_an_update_while_it_is_still_a_fire_time(clock: FrozenClock) -> None:
    s = make(clock)
    api.skip_occurrence(s.id, scheduled_for=T10, clock=clock)
    api.update_schedule(s.id, cron="*/10 * * * *", clock=clock)  # 12:10 still fires
    assert Schedule.objects.get(pk=s.id).skip_times == [T10.isoformat()]
    publisher = run_until(clock, T10 + timedelta(seconds=30))
    assert published_times(publisher) == []


def test_an_update_drops_a_skip_that_is_no_longer_a_fire_time(clock: FrozenClock) -> None:
    s = make(clock)
    api.skip_occurrence(s.id, scheduled_for=T10, clock=clock)
    api.update_schedule(s.id, cron="*/7 * * * *", clock=clock)  # 12:10 no longer fires
    assert Schedule.objects.get(pk=s.id).skip_times == []
    assert not Occurrence.objects.filter(schedule=s, schedule_version=2).exists()


def new_version(s: Schedule, clock: FrozenClock, bump: str) -> None:
    """A new version by an update that keeps the timing, or by a pause and resume."""
    if bump == "update":
        api.update_schedule(s.id, args=[1], clock=clock)
    else:
        api.pause_schedule(s.id, clock=clock)
        api.resume_schedule(s.id, clock=clock)


@pytest.mark.parametrize("bump", ["update", "resume"])
def test_a_skip_holds_when_a_new_version_replans_around_a_finished_time(
    clock: FrozenClock, bump: str
) -> None:
    # 12:05 planned and unclaimed, 12:10 skipped, 12:15 already run: the new version
    # re-plans 12:05 and must step over 12:15 (it ran) and 12:10 (it was skipped), which
    # it plans itself, before the skip's marker for the new version is written.
    s = make(clock)
    materialize_due(clock=clock, horizon=timedelta(minutes=15))
    api.skip_occurrence(s.id, scheduled_for=T10, clock=clock)
    finished = Occurrence.objects.get(scheduled_for=T15)
    ran = claim.claim(finished.id, worker="w", clock=clock)
    assert ran.fencing_token is not None
    finish.complete(finished.id, ran.fencing_token, None, clock=clock)
    new_version(s, clock, bump)
    version = Schedule.objects.get(pk=s.id).version
    at_t10 = Occurrence.objects.filter(schedule=s, scheduled_for=T10, schedule_version=version)
    assert list(at_t10.values_list("state", flat=True)) == ["CANCELED"]
    publisher = run_until(clock, T15 + timedelta(minutes=6))
    assert published_times(publisher) == [T5, datetime(2026, 3, 1, 12, 20, tzinfo=UTC)]


@pytest.mark.parametrize("bump", ["update", "resume"])
def test_a_later_skip_keeps_an_earlier_one_through_a_new_version(
    clock: FrozenClock, bump: str
) -> None:
    # Both times planned before they were skipped (the cursor is past them): the second
    # skip must not forget the first, which the new version's re-plan from 12:05 needs.
    s = make(clock)
    materialize_due(clock=clock, horizon=timedelta(minutes=15))
    api.skip_occurrence(s.id, scheduled_for=T10, clock=clock)
    api.skip_occurrence(s.id, scheduled_for=T15, clock=clock)
    assert Schedule.objects.get(pk=s.id).skip_times == [T10.isoformat(), T15.isoformat()]
    new_version(s, clock, bump)
    publisher = run_until(clock, T15 + timedelta(minutes=5, seconds=30))
    assert published_times(publisher) == [T5, T15 + timedelta(minutes=5)]


def test_skip_next_passes_over_a_run_waiting_to_retry(clock: FrozenClock) -> None:
    # 12:05 ran and failed, its retry waits: it was claimed, so "next" is 12:10.
    s = make(clock)
    materialize_due(clock=clock, horizon=timedelta(minutes=10))
    failed = Occurrence.objects.get(scheduled_for=T5)
    clock.set(T5)
    ran = claim.claim(failed.id, worker="w", clock=clock)
    assert ran.fencing_token is not None
    finish.fail(failed.id, ran.fencing_token, "boom", retry_at=T5 + timedelta(minutes=1),
                clock=clock)  # fmt: skip
    assert api.skip_occurrence(s.id, clock=clock).scheduled_for == T10
    assert Occurrence.objects.get(pk=failed.pk).state == "RETRY_WAIT"
