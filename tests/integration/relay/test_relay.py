"""The relay against a real database (SQLite by default, PostgreSQL via DATABASE_URL)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from celery_scheduler import api, errors
from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.core.enums import OccurrenceState
from celery_scheduler.publishers import RUN_OCCURRENCE_TASK, RecordingPublisher
from django_app.models import Occurrence, OutboxEntry, Schedule
from django_app.relay import batch as relay_module
from django_app.relay.batch import LookaheadRelay, relay_due
from django_app.wiring import materialize_due

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
pytestmark = pytest.mark.django_db


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(NOW)


@pytest.fixture
def publisher() -> RecordingPublisher:
    return RecordingPublisher()


@pytest.fixture
def make(clock: FrozenClock) -> Callable[..., Schedule]:
    """Create a schedule through the API and materialize the next ``horizon`` of it."""

    def build(horizon: float = 0, **values: Any) -> Schedule:
        values.setdefault("name", "job")
        values.setdefault("task", "billing.ping")
        if not {"cron", "interval", "run_at"} & set(values):
            values["interval"] = 10
        schedule = api.create_schedule(clock=clock, **values)
        materialize_due(clock=clock, horizon=timedelta(seconds=horizon))
        return schedule

    return build


def test_due_rows_are_published_then_marked_and_enqueued(
    make: Callable[..., Schedule], clock: FrozenClock, publisher: RecordingPublisher
) -> None:
    s = make(horizon=25, args=[1], kwargs={"k": "v"}, queue="reports", priority=3)
    assert OutboxEntry.objects.filter(sent_at__isnull=True).count() == 3  # t=0,10,20

    report = relay_due(clock=clock, publisher=publisher)

    assert (report.claimed, report.published, report.marked) == (1, 1, 1)
    (message,) = publisher.sent
    occurrence = Occurrence.objects.get(scheduled_for=NOW)
    assert message.task_id == str(occurrence.id)
    assert message.task_kwargs() == {
        "occurrence_id": str(occurrence.id),
        "schedule_id": str(s.id),
        "schedule_version": 1,
        "scheduled_for": "2026-03-01T12:00:00.000000Z",
        "task": "billing.ping",
        "args": [1],
        "kwargs": {"k": "v"},
    }
    assert message.headers() == {
        "scheduler_occurrence_id": str(occurrence.id),
        "scheduler_schedule_id": str(s.id),
        "scheduler_schedule_version": 1,
        "scheduler_scheduled_for": "2026-03-01T12:00:00.000000Z",
        "scheduler_tenant": "default",
    }
    assert (message.queue, message.priority) == ("reports", 3)
    assert occurrence.state == OccurrenceState.ENQUEUED
    assert occurrence.enqueued_at == NOW
    assert occurrence.lag_seconds == 0
    box = OutboxEntry.objects.get(occurrence=occurrence)
    assert (box.sent_at, box.publish_count) == (NOW, 1)
    # The future rows were not touched.
    assert OutboxEntry.objects.filter(sent_at__isnull=True).count() == 2
    assert relay_due(clock=clock, publisher=publisher).claimed == 0

    clock.advance(12)
    assert relay_due(clock=clock, publisher=publisher).published == 1
    later = Occurrence.objects.get(scheduled_for=NOW + timedelta(seconds=10))
    assert later.lag_seconds == 2
    assert RUN_OCCURRENCE_TASK == "celery_scheduler.run_occurrence"


def test_broker_failure_marks_nothing_and_the_same_id_goes_out_later(
    make: Callable[..., Schedule], clock: FrozenClock, publisher: RecordingPublisher
) -> None:
    make()
    publisher.fail_with = errors.CoordinationUnavailable("broker down")
    with pytest.raises(errors.CoordinationUnavailable):
        relay_due(clock=clock, publisher=publisher)
    occurrence = Occurrence.objects.get()
    assert occurrence.state == OccurrenceState.SCHEDULED
    assert OutboxEntry.objects.get().sent_at is None

    publisher.fail_with = None
    clock.advance(1)
    assert relay_due(clock=clock, publisher=publisher).marked == 1
    assert publisher.task_ids == [str(occurrence.id)]
    occurrence.refresh_from_db()
    assert occurrence.state == OccurrenceState.ENQUEUED
    assert occurrence.lag_seconds == 1


class _Crash(BaseException):
    """Stands in for SIGKILL at a fault point: nothing after it runs, no commit."""


@pytest.mark.parametrize("point", ["relay.after_publish", "relay.before_mark"])
def test_crash_between_publish_and_mark_republishes_the_same_id(
    make: Callable[..., Schedule],
    clock: FrozenClock,
    publisher: RecordingPublisher,
    monkeypatch: pytest.MonkeyPatch,
    point: str,
) -> None:
    make()

    def crash(name: str) -> None:
        if name == point:
            raise _Crash(name)

    monkeypatch.setattr(relay_module, "fault_point", crash)
    with pytest.raises(_Crash):
        relay_due(clock=clock, publisher=publisher)
    assert len(publisher.sent) == 1  # the broker has it...
    assert OutboxEntry.objects.get().sent_at is None  # ...but the mark never happened

    monkeypatch.undo()
    relay_due(clock=clock, publisher=publisher)
    first, second = publisher.task_ids
    assert first == second == str(Occurrence.objects.get().id)
    assert OutboxEntry.objects.get().publish_count == 1
    assert Occurrence.objects.get().state == OccurrenceState.ENQUEUED


def test_unpublishable_occurrences_are_closed_without_publishing(
    make: Callable[..., Schedule], clock: FrozenClock, publisher: RecordingPublisher
) -> None:
    make(name="running")
    make(name="dead")
    stale = make(name="stale")
    Occurrence.objects.filter(schedule__name="running").update(state="RUNNING")
    Occurrence.objects.filter(schedule__name="dead").update(state="DEAD")
    # A version bump that (unlike the lifecycle API) left the old occurrence unclaimed.
    Schedule.objects.filter(id=stale.id).update(version=2)

    report = relay_due(clock=clock, publisher=publisher)

    assert publisher.sent == []
    assert (report.dropped, report.invalidated, report.published) == (3, 1, 0)
    assert not OutboxEntry.objects.filter(sent_at__isnull=True).exists()
    assert set(OutboxEntry.objects.values_list("publish_count", flat=True)) == {0}
    got = dict(Occurrence.objects.values_list("schedule__name", "state"))
    assert got == {"running": "RUNNING", "dead": "DEAD", "stale": "CANCELED"}


def test_retry_wait_is_republished_keeping_the_first_enqueued_at(
    make: Callable[..., Schedule], clock: FrozenClock, publisher: RecordingPublisher
) -> None:
    make()
    relay_due(clock=clock, publisher=publisher)
    occurrence = Occurrence.objects.get()
    # What the worker side does on a transient failure: RETRY_WAIT and a fresh outbox row.
    clock.advance(30)
    Occurrence.objects.filter(id=occurrence.id).update(state="RETRY_WAIT")
    OutboxEntry.objects.filter(occurrence=occurrence).update(sent_at=None, available_at=clock.now())

    assert relay_due(clock=clock, publisher=publisher).marked == 1
    occurrence.refresh_from_db()
    assert occurrence.state == OccurrenceState.ENQUEUED
    assert occurrence.enqueued_at == NOW  # lag stays the first delivery's
    assert OutboxEntry.objects.get().publish_count == 2
    assert publisher.task_ids == [str(occurrence.id)] * 2


def test_canceled_schedule_publishes_nothing(
    make: Callable[..., Schedule], clock: FrozenClock, publisher: RecordingPublisher
) -> None:
    s = make(horizon=30)
    api.cancel_schedule(s.id, clock=clock)
    clock.advance(60)
    assert relay_due(clock=clock, publisher=publisher).published == 0
    assert publisher.sent == []


def test_limit_and_shards_bound_a_call(
    make: Callable[..., Schedule], clock: FrozenClock, publisher: RecordingPublisher
) -> None:
    schedules = [make(name=f"s{i}") for i in range(6)]
    shard = schedules[0].shard
    in_shard = sum(1 for s in schedules if s.shard == shard)
    assert relay_due(clock=clock, publisher=publisher, shards=[shard]).published == in_shard
    rest = 6 - in_shard
    assert relay_due(clock=clock, publisher=publisher, limit=1).published == min(1, rest)
    assert relay_due(clock=clock, publisher=publisher).published == max(rest - 1, 0)
    assert len(set(publisher.task_ids)) == 6


def test_lookahead_holds_rows_and_publishes_each_at_its_time(
    make: Callable[..., Schedule], clock: FrozenClock, publisher: RecordingPublisher
) -> None:
    make(run_at=NOW + timedelta(seconds=2), name="soon", horizon=60)
    make(run_at=NOW + timedelta(seconds=30), name="later", horizon=60)
    relay = LookaheadRelay(
        clock=clock, publisher=publisher, node="n1", lookahead=timedelta(seconds=5)
    )
    report = relay.step()
    assert (report.held, report.published) == (1, 0)
    assert relay.next_due_at() == NOW + timedelta(seconds=2)
    soon = OutboxEntry.objects.get(occurrence__schedule__name="soon")
    assert soon.claimed_by == relay.token
    # Another relay polling meanwhile neither publishes nor claims the held row.
    other = LookaheadRelay(clock=clock, publisher=publisher, lookahead=timedelta(seconds=5))
    assert other.step().held == 0

    clock.advance(1.5)
    assert relay.step().published == 0
    clock.advance(0.5)
    assert relay.step().published == 1
    occurrence = Occurrence.objects.get(schedule__name="soon")
    assert occurrence.lag_seconds == 0
    assert publisher.task_ids == [str(occurrence.id)]
    assert relay.next_due_at() is None

    clock.advance(26)  # "later" enters the window; close() gives its claim back
    assert relay.step().held == 1
    assert relay.close() == 1
    later = OutboxEntry.objects.get(occurrence__schedule__name="later")
    assert (later.claimed_by, later.sent_at) == ("", None)
    other.close()


def test_expired_claim_of_a_dead_relay_is_taken_over(
    make: Callable[..., Schedule], clock: FrozenClock, publisher: RecordingPublisher
) -> None:
    make(run_at=NOW + timedelta(seconds=2), horizon=60)
    dead = LookaheadRelay(clock=clock, publisher=publisher, lookahead=timedelta(seconds=5))
    assert dead.step().held == 1  # ...and then the process dies, never closing
    clock.advance(3)
    assert relay_due(clock=clock, publisher=publisher).published == 0  # claim still live
    clock.advance(60)  # past lease_seconds
    assert relay_due(clock=clock, publisher=publisher).published == 1
    assert Occurrence.objects.get().state == OccurrenceState.ENQUEUED
