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
import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import pytest
from django.db import DatabaseError, connection
from psycopg.abc import Buffer
from psycopg.types.uuid import UUIDDumper, UUIDLoader

from celery_scheduler import api
from celery_scheduler.core.clock import FrozenClock, SystemClock
from celery_scheduler.publishers import OccurrenceMessage, RecordingPublisher
from django_app.models import OutboxEntry
from django_app.relay.batch import relay_due
from django_app.relay.burst import BurstRelay
from django_app.wiring import materialize_due
from tests.integration.relay.test_burst import NOW, drive, seed
from tests.integration.relay.test_relay_concurrency import in_thread

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
        elif connection.display_name == "MariaDB":  # (mysql backend: "MySQL" or "MariaDB")
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


class SlowUUIDLoader(UUIDLoader):
    """Turns each uuid of a result into Python slowly: the client-side work of a large wave
    on a loaded machine (measured at 100,000 rows under load ~2.5: 0.4 s per 20,000-row
    result and 0.6 s between the lock and the version reads, growing with the wave)."""

    def load(self, data: Any) -> uuid.UUID:
        time.sleep(SLOW_UUID_SECONDS)
        return super().load(data)


#: 2 uuids a locked row x 20,000 rows x this > GRACE: one result's conversion outlasts it.
SLOW_UUID_SECONDS = 0.00004
WAVE_ROWS = 20_000


@pytest.mark.postgres
def test_a_large_burst_wave_is_not_mistaken_for_a_stall(settings: Any) -> None:
    """The burst relay's wave converts its lock and version results and loops over its rows
    inside its transaction; that work grows with the wave and must run between pulses to
    the database, or the session is ended after the broker accepted the wave (before the
    marks commit) and every row is sent again. Before the pulses: IdleInTransaction
    SessionTimeout at the version read, 0 rows marked, 20,000 published."""
    _fire_one_wave_on_a_slow_client(
        settings, lambda adapters: adapters.register_loader("uuid", SlowUUIDLoader)
    )


def _fire_one_wave_on_a_slow_client(settings: Any, slow_down: Callable[[Any], None]) -> None:
    """Claim and prepare a 20,000-row wave, make the connection's client side slow
    (``slow_down`` gets its psycopg adapters), fire the wave: it must be published and
    marked once, however long the client-side work inside its transaction took."""
    settings.CELERY_SCHEDULER = {"claim_grace_seconds": GRACE}
    clock = FrozenClock(NOW - timedelta(seconds=20))
    seed(clock, [(NOW, WAVE_ROWS)])
    publisher = RecordingPublisher()
    relay = BurstRelay(clock=clock, publisher=publisher, node="slow-client")
    assert relay.poll().held == WAVE_ROWS  # claimed and prepared before the slow part
    connection.ensure_connection()
    assert connection.connection is not None
    slow_down(connection.connection.adapters)
    try:
        started = time.monotonic()
        drive(relay, clock)
        spent = time.monotonic() - started
    finally:
        connection.close()  # the slow adapter goes with the connection
    assert spent > 2 * GRACE  # the client-side work outlasted the idle bound
    assert OutboxEntry.objects.filter(sent_at__isnull=True).count() == 0
    assert set(OutboxEntry.objects.values_list("publish_count", flat=True)) == {1}
    assert len(publisher.task_ids) == WAVE_ROWS


class SlowUUIDDumper(UUIDDumper):
    """Turns each uuid parameter into text slowly: before a statement is sent its parameters
    are converted client-side, silent time the server counts as idle (measured: 250,000
    uuids and timestamps, the one mark statement of a 500,000-row burst split over two
    beats, take 1.7 s on an idle core here; both beats of that run lost their sessions at
    the same instant, T+27 s, right after marking the outbox)."""

    def dump(self, obj: uuid.UUID) -> Buffer | None:
        until = time.perf_counter() + SLOW_DUMP_SECONDS
        while time.perf_counter() < until:  # busy, like the client it stands for
            pass
        return super().dump(obj)


#: 20,000 uuids x this > GRACE: one wave-sized parameter list outlasts the idle bound.
SLOW_DUMP_SECONDS = GRACE / 12_000


def _slow_uuid_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each uuid turned into text slowly: the wave's statements carry their ids as one
    array literal per statement, built from each id's text (``db.queries.array_literal``)."""
    text = uuid.UUID.__str__

    def slow(self: uuid.UUID) -> str:
        until = time.perf_counter() + SLOW_DUMP_SECONDS
        while time.perf_counter() < until:  # busy, like the client it stands for
            pass
        return text(self)

    monkeypatch.setattr(uuid.UUID, "__str__", slow)


@pytest.mark.postgres
def test_a_large_wave_s_parameters_are_not_mistaken_for_a_stall(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wave's lock and mark statements carry one id (and one time) per row; converting
    them is client-side work inside the wave's transaction that grows with the wave, so it
    must come in pieces with pulses between. Before: the 20,000 ids of the lock went in one
    statement, and the session was ended after the broker accepted the wave. The ids go as
    psycopg parameters or as array literals built from their text: both are slowed."""

    def slow_down(adapters: Any) -> None:
        adapters.register_dumper(uuid.UUID, SlowUUIDDumper)
        _slow_uuid_text(monkeypatch)

    _fire_one_wave_on_a_slow_client(settings, slow_down)
