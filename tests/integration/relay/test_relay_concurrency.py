"""Relays racing each other and racing cancel/update, with real threads and commits.

The cancel race is the guarantee "no old-version occurrence is published after an update or
cancel committed": the relay holds the occurrence row locks across the publish, so the
lifecycle's invalidating UPDATE waits for the relay's commit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection

from celery_scheduler import api
from celery_scheduler.core.clock import SystemClock
from celery_scheduler.publishers import OccurrenceMessage, RecordingPublisher
from django_app.models import Occurrence, OutboxEntry, Schedule
from django_app.relay.batch import relay_due
from django_app.wiring import materialize_due

pytestmark = pytest.mark.django_db(transaction=True)
CLOCK = SystemClock()


def in_thread(target: Callable[[], Any]) -> tuple[threading.Thread, list[BaseException]]:
    failures: list[BaseException] = []

    def run() -> None:
        try:
            target()
        except BaseException as exc:
            failures.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, failures


def due_schedules(count: int) -> list[Schedule]:
    # Hourly from now: due at once, and still ACTIVE (updatable) after materializing.
    schedules = [
        api.create_schedule(name=f"s{i}", task="billing.ping", interval=3600, clock=CLOCK)
        for i in range(count)
    ]
    materialize_due(clock=CLOCK, horizon=timedelta(seconds=1))
    assert OutboxEntry.objects.filter(sent_at__isnull=True).count() == count
    return schedules


def test_concurrent_relays_publish_every_row_exactly_once() -> None:
    due_schedules(120)
    publisher = RecordingPublisher()
    start = threading.Barrier(4)

    def relay() -> None:
        start.wait()
        while relay_due(clock=CLOCK, publisher=publisher, limit=7).claimed:
            pass

    threads = [in_thread(relay) for _ in range(4)]
    for thread, failures in threads:
        thread.join(60)
        assert not failures, failures
    ids = publisher.task_ids
    assert len(ids) == len(set(ids)) == 120  # no crash, so no duplicate either
    assert not OutboxEntry.objects.filter(sent_at__isnull=True).exists()
    assert set(Occurrence.objects.values_list("state", flat=True)) == {"ENQUEUED"}


class SlowPublisher(RecordingPublisher):
    """Signals when a publish starts, holds it open, and records when the broker 'accepted'."""

    def __init__(self, hold: float) -> None:
        super().__init__()
        self.hold = hold
        self.started = threading.Event()
        self.accepted_at: dict[str, float] = {}

    def publish(self, messages: Sequence[OccurrenceMessage]) -> None:
        self.started.set()
        time.sleep(self.hold)
        super().publish(messages)
        for m in messages:
            self.accepted_at[m.schedule_id] = time.monotonic()


@pytest.mark.concurrent_db
@pytest.mark.parametrize("verb", ["cancel", "update"])
def test_cancel_or_update_racing_a_publish_commits_only_after_it(verb: str) -> None:
    schedules = due_schedules(5)
    publisher = SlowPublisher(hold=0.5)
    committed_at: dict[str, float] = {}

    def change() -> None:
        assert publisher.started.wait(10)
        for s in schedules:
            if verb == "cancel":
                api.cancel_schedule(s.id, clock=CLOCK)
            else:
                api.update_schedule(s.id, clock=CLOCK, kwargs={"v": 2})
            committed_at[str(s.id)] = time.monotonic()

    relay_thread, relay_failures = in_thread(lambda: relay_due(clock=CLOCK, publisher=publisher))
    change_thread, change_failures = in_thread(change)
    for thread in (relay_thread, change_thread):
        thread.join(30)
    assert not relay_failures, relay_failures
    assert not change_failures, change_failures

    assert len(publisher.sent) == 5  # the relay got there first, by construction
    for schedule_id, accepted in publisher.accepted_at.items():
        # The change blocked on the relay's occurrence locks: it committed after the broker
        # had the message, never before.
        assert committed_at[schedule_id] > accepted
    # The old-version occurrences were then invalidated: none of them goes out again. A
    # cancel runs nothing more; an update runs their times under its new version (they were
    # decided and waited for a worker, django_app.schedules.replan), each once.
    old = Occurrence.objects.filter(schedule_version=1)
    assert set(old.values_list("state", flat=True)) == {"CANCELED"}
    again = relay_due(clock=CLOCK, publisher=publisher).published
    if verb == "cancel":
        assert again == 0
        assert set(Occurrence.objects.values_list("state", flat=True)) == {"CANCELED"}
    else:
        assert again == 5
        assert {m.schedule_version for m in publisher.sent[5:]} == {2}
        assert relay_due(clock=CLOCK, publisher=publisher).published == 0


@pytest.mark.parametrize("verb", ["cancel", "update"])
def test_after_a_committed_cancel_or_update_no_old_version_is_published(verb: str) -> None:
    schedules = due_schedules(5)
    for s in schedules:
        if verb == "cancel":
            api.cancel_schedule(s.id, clock=CLOCK)
        else:
            api.update_schedule(s.id, clock=CLOCK, kwargs={"v": 2})
    publisher = RecordingPublisher()
    relay_due(clock=CLOCK, publisher=publisher)
    assert all(m.schedule_version == 2 for m in publisher.sent)
    assert not Occurrence.objects.filter(schedule_version=1, state="ENQUEUED").exists()
