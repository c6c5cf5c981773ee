"""DatabaseScheduler driven in-process with a frozen clock and a recording publisher."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from celery import Celery
from celery.schedules import crontab
from django.db import OperationalError

from celery_scheduler import api, errors
from celery_scheduler.beat import DatabaseScheduler
from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.publishers import RecordingPublisher
from django_app import wiring
from django_app.models import Occurrence, OutboxEntry, Schedule

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
pytestmark = pytest.mark.django_db


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(NOW)


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("beat-test", set_as_current=False)
    yield app
    app.close()


def scheduler(app: Celery, clock: FrozenClock, publisher: Any, **kw: Any) -> DatabaseScheduler:
    return DatabaseScheduler(app=app, clock=clock, publisher=publisher, **kw)


def run_ticks(s: DatabaseScheduler, clock: FrozenClock, seconds: float) -> list[float]:
    """Drive the loop as celery's beat service does, sleeping what tick() returns."""
    slept: list[float] = []
    end = clock.now() + timedelta(seconds=seconds)
    while clock.now() < end:
        wait = s.tick()
        slept.append(wait)
        clock.advance(max(wait, 0.001))
    return slept


def test_tick_publishes_a_strict_occurrence_at_its_time_not_at_the_next_poll(
    app: Celery, clock: FrozenClock
) -> None:
    publisher = RecordingPublisher()
    api.create_schedule(
        name="one-off", task="billing.ping", run_at=NOW + timedelta(seconds=2.4), clock=clock
    )
    s = scheduler(app, clock, publisher, poll_interval=1.0)
    assert s.tick() == pytest.approx(1.0)  # materialized + claimed ahead; nothing due yet
    assert OutboxEntry.objects.get().claimed_by.startswith("beat@")
    clock.advance(1.0)
    assert s.tick() == pytest.approx(1.0)
    clock.advance(1.0)
    assert s.tick() == pytest.approx(0.4)  # wakes for the held row, before the next poll
    clock.advance(0.4)
    s.tick()
    occurrence = Occurrence.objects.get()
    assert publisher.task_ids == [str(occurrence.id)]
    assert occurrence.lag_seconds == 0
    s.close()


def test_interval_schedule_fires_each_time_over_a_minute(app: Celery, clock: FrozenClock) -> None:
    publisher = RecordingPublisher()
    api.create_schedule(name="every-7s", task="billing.ping", interval=7, clock=clock)
    s = scheduler(app, clock, publisher)
    slept = run_ticks(s, clock, 60)
    assert max(slept) <= s.max_interval
    fired = list(Occurrence.objects.filter(state="ENQUEUED").order_by("scheduled_for"))
    assert [o.scheduled_for for o in fired] == [NOW + timedelta(seconds=7 * k) for k in range(9)]
    assert all(o.lag_seconds == 0 for o in fired)
    assert len(publisher.sent) == 9
    s.close()
    assert not OutboxEntry.objects.filter(sent_at__isnull=True).exclude(claimed_by="").exists()


def test_broker_outage_backs_off_marks_nothing_and_recovers(
    app: Celery, clock: FrozenClock
) -> None:
    publisher = RecordingPublisher()
    publisher.fail_with = errors.CoordinationUnavailable("broker down")
    api.create_schedule(name="now", task="billing.ping", interval=3600, clock=clock)
    s = scheduler(app, clock, publisher)
    waits = []
    for _ in range(6):
        waits.append(s.tick())
        clock.advance(waits[-1])
    assert waits == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]  # capped at max_interval
    assert OutboxEntry.objects.get().sent_at is None
    assert Occurrence.objects.get().state == "SCHEDULED"
    publisher.fail_with = None
    s.tick()
    assert Occurrence.objects.get().state == "ENQUEUED"
    assert len(publisher.sent) == 1
    s.close()


def test_database_error_is_survived(
    app: Celery, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    publisher = RecordingPublisher()
    s = scheduler(app, clock, publisher)

    def down(**_: Any) -> None:
        raise OperationalError("connection refused")

    api.create_schedule(name="now", task="billing.ping", interval=3600, clock=clock)
    monkeypatch.setattr(wiring, "materialize_due", down)
    assert s.tick() == 0.5
    assert publisher.sent == []
    monkeypatch.undo()
    clock.advance(0.5)
    s.tick()
    assert len(publisher.sent) == 1
    s.close()


def test_setup_syncs_static_beat_schedule_idempotently(app: Celery, clock: FrozenClock) -> None:
    app.conf.update(timezone="Europe/Berlin")
    app.conf.beat_schedule = {
        "ping-10s": {"task": "billing.ping", "schedule": 10.0, "args": ["x"]},
        "ping-cron": {
            "task": "billing.ping",
            "schedule": crontab(minute="*/15", hour="8-18", day_of_week="mon-fri"),
            "options": {"queue": "reports", "priority": 5},
        },
    }
    first = scheduler(app, clock, RecordingPublisher())
    every = Schedule.objects.get(idempotency_key="beat:ping-10s")
    cron = Schedule.objects.get(idempotency_key="beat:ping-cron")
    assert (every.kind, every.interval_seconds, every.args, every.source) == (
        "INTERVAL", 10, ["x"], "beat",
    )  # fmt: skip
    assert (cron.kind, cron.cron, cron.timezone, cron.queue, cron.priority) == (
        "CRON", "*/15 8-18 * * mon-fri", "Europe/Berlin", "reports", 5,
    )  # fmt: skip
    # Any number of beats start with the same config: nothing new, no version bump.
    for _ in range(2):
        scheduler(app, clock, RecordingPublisher())
    assert Schedule.objects.count() == 2
    assert set(Schedule.objects.values_list("version", flat=True)) == {1}
    first.close()

    app.conf.beat_schedule["ping-10s"]["schedule"] = timedelta(seconds=20)
    scheduler(app, clock, RecordingPublisher())
    every.refresh_from_db()
    assert (every.interval_seconds, every.version) == (20, 2)


def test_the_loop_exports_the_outbox_backlog(app: Celery, clock: FrozenClock) -> None:
    """A tenant capped at one trigger a second leaves due rows unsent: the gauge shows them."""
    from celery_scheduler import metrics
    from django_app.models import Tenant

    metrics.reset()
    Tenant.objects.create(slug="slow", max_trigger_rate=1)
    for i in range(20):
        api.create_schedule(tenant="slow", name=f"n{i}", task="billing.ping",
                            run_at=NOW + timedelta(seconds=1), clock=clock)  # fmt: skip
    s = scheduler(app, clock, RecordingPublisher(), poll_interval=1.0)
    run_ticks(s, clock, 6.5)  # past one export interval (5 s) after the rows came due
    due_unsent = OutboxEntry.objects.filter(sent_at__isnull=True, available_at__lte=clock.now())
    assert 0 < due_unsent.count() < 20
    exported = metrics.registry().get_sample_value("celery_scheduler_outbox_backlog")
    assert exported is not None
    # Counted at the last export (at most 5 s ago, one row a second published since).
    assert due_unsent.count() <= exported <= due_unsent.count() + 5
    s.close()


def test_the_lease_keeper_is_not_told_a_step_runs_while_the_loop_retries_a_failure(
    app: Celery, clock: FrozenClock
) -> None:
    # The keeper renews the shard leases only inside a step: the steps that retry a broker
    # outage must not count, however long each one takes to fail, or a node that cannot
    # reach the broker keeps its shards from the beats that can.
    seen: list[bool] = []

    class Watching(RecordingPublisher):
        def publish(self, messages: Any) -> None:
            seen.append(s._in_step())
            super().publish(messages)

    publisher = Watching()
    publisher.fail_with = errors.CoordinationUnavailable("broker down")
    api.create_schedule(name="now", task="billing.ping", interval=3600, clock=clock)
    s = scheduler(app, clock, publisher)
    for _ in range(4):
        clock.advance(s.tick())
    first, *retries = seen
    assert first is True  # the first try: a step like any
    assert len(retries) >= 2
    assert not any(retries), seen
    s.close()
