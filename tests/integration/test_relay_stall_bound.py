"""A relay transaction whose process stalls is ended by the database, not held forever.

The stall is real on the server's side: the relay thread holds its transaction (outbox and
occurrence rows locked) inside ``publish`` and sends nothing more, as a SIGSTOPped beat
would. PostgreSQL ends such a session after ``idle_in_transaction_session_timeout``;
MariaDB after ``idle_transaction_timeout`` (MySQL 8, which has no idle-transaction bound,
after the relay transaction's own ``wait_timeout``). Both are set to ``claim_grace_seconds``
for the relay's transaction only and the connection's own values come back afterwards.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest
from django.db import DatabaseError, connection

from celery_scheduler import api
from celery_scheduler.core.clock import FrozenClock, SystemClock
from celery_scheduler.publishers import OccurrenceMessage, RecordingPublisher
from django_app.materializer import materialize_due
from django_app.models import OutboxEntry
from django_app.relay import relay_due
from tests.integration.test_relay_concurrency import in_thread

pytestmark = [pytest.mark.concurrent_db, pytest.mark.django_db(transaction=True)]
CLOCK = SystemClock()
GRACE = 1.0


class StalledPublisher(RecordingPublisher):
    """Stops inside the relay's transaction (rows locked) until told to go on."""

    def __init__(self) -> None:
        super().__init__()
        self.stopped = threading.Event()
        self.resume = threading.Event()

    def publish(self, messages: Sequence[OccurrenceMessage]) -> None:
        self.stopped.set()
        assert self.resume.wait(60)
        super().publish(messages)


def _session_bounds() -> tuple[Any, ...]:
    with connection.cursor() as cur:
        if connection.vendor == "postgresql":
            cur.execute("SELECT current_setting('idle_in_transaction_session_timeout'), "
                        "current_setting('lock_timeout')")  # fmt: skip
        elif connection.mysql_is_mariadb:
            cur.execute("SELECT @@session.idle_transaction_timeout, "
                        "@@session.innodb_lock_wait_timeout, @@session.wait_timeout")  # fmt: skip
        else:
            cur.execute("SELECT @@session.innodb_lock_wait_timeout, @@session.wait_timeout")
        return tuple(cur.fetchone())


def test_a_stalled_relay_transaction_is_ended_and_another_relay_publishes_its_rows(
    settings: Any,
) -> None:
    settings.CELERY_SCHEDULER = {"claim_grace_seconds": GRACE}
    api.create_schedule(name="strict", task="billing.ping", interval=3600, clock=CLOCK)
    materialize_due(clock=CLOCK, horizon=timedelta(seconds=1))
    stalled = StalledPublisher()
    thread, failures = in_thread(lambda: relay_due(clock=CLOCK, publisher=stalled, node="a"))
    assert stalled.stopped.wait(30), failures
    stopped_at = time.monotonic()

    other = RecordingPublisher()
    deadline = stopped_at + GRACE + 10
    while not other.sent and time.monotonic() < deadline:
        # The locked rows are skipped (SKIP LOCKED) until the server ends the stalled session.
        relay_due(clock=CLOCK, publisher=other, node="b")
        time.sleep(0.1)
    freed_after = time.monotonic() - stopped_at
    stalled.resume.set()
    thread.join(30)

    assert len(other.sent) == 1, f"rows still locked {freed_after:.1f} s after the stall"
    assert freed_after < GRACE + 3  # the bound (whole seconds on MySQL) plus a poll
    # The stalled relay finds its session gone: it marks nothing (its publish may repeat a
    # message, at least once as after a crash; the occurrence id makes it recognisable).
    assert len(failures) == 1, failures
    assert isinstance(failures[0], DatabaseError), failures
    assert OutboxEntry.objects.get().publish_count == 1


def test_the_relay_bounds_end_with_its_transaction(settings: Any) -> None:
    """The connection's own session values are back once the relay's transaction ended."""
    settings.CELERY_SCHEDULER = {"claim_grace_seconds": GRACE}
    api.create_schedule(name="strict", task="billing.ping", interval=3600, clock=CLOCK)
    materialize_due(clock=CLOCK, horizon=timedelta(seconds=1))
    before = _session_bounds()
    assert relay_due(clock=CLOCK, publisher=RecordingPublisher()).published == 1
    assert _session_bounds() == before


class SlowPublisher(RecordingPublisher):
    """A live but slow broker: every message takes a while (a busy RabbitMQ, kombu's
    per-message path); the relay is working, not stalled."""

    def publish(self, messages: Sequence[OccurrenceMessage]) -> None:
        for message in messages:
            time.sleep(GRACE / 40)
            super().publish([message])


def test_a_slow_publish_is_not_mistaken_for_a_stall(settings: Any) -> None:
    """A batch whose publish takes longer than the idle bound keeps its session (the relay
    speaks to the database between slices of the batch), so it is marked, not re-sent."""
    settings.CELERY_SCHEDULER = {"claim_grace_seconds": GRACE, "batch_size": 200}
    api.create_schedule(name="every second", task="billing.ping", interval=1, clock=CLOCK)
    materialize_due(clock=CLOCK, horizon=timedelta(seconds=150))
    later = FrozenClock(CLOCK.now() + timedelta(seconds=150))  # every row is due then
    publisher = SlowPublisher()
    started = time.monotonic()
    report = relay_due(clock=later, publisher=publisher, limit=100)
    assert time.monotonic() - started > 2 * GRACE  # the batch outlasted the idle bound
    assert report.published == report.marked > 0
    sent = OutboxEntry.objects.filter(sent_at__isnull=False)
    assert sent.count() == report.marked
    assert set(sent.values_list("publish_count", flat=True)) == {1}
