"""Issue 9, hole 7: the beat loop must not starve its own leases or hang on the network.

- A burst wave holds one transaction (and its row locks) from shortly before its instant
  until the broker accepted it; the beat loop renewed its shard leases only between steps,
  so a wave held past a lease period lost them. Renewal now runs independently of waves.
- A hung Redis held the wave's transaction and row locks forever (no socket timeout).
- A wave that slept (or was stopped) far past its instant published anyway.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
import redis
from celery import Celery
from django.db import connection

from celery_scheduler import api, errors
from celery_scheduler.beat import DatabaseScheduler
from celery_scheduler.core.clock import SYSTEM_CLOCK, FrozenClock
from celery_scheduler.publishers import OccurrenceMessage, RecordingPublisher
from celery_scheduler.publishers.redis_fast import RedisFastPublisher
from django_app.models import Occurrence, OutboxEntry, ShardLease
from django_app.relay.burst import BurstRelay
from tests.integration.relay.test_burst import seed

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("burst-stalls-test", set_as_current=False)
    yield app
    app.close()


def _conninfo() -> str:
    p = connection.settings_dict
    return (
        f"host={p.get('HOST') or '127.0.0.1'} port={p.get('PORT') or 5432} "
        f"user={p.get('USER') or 'postgres'} dbname={p['NAME']}"
    )


def _lockable(occurrence_ids: Sequence[Any]) -> bool:
    """Whether another session can lock these occurrence rows right now (NOWAIT)."""
    with psycopg.connect(_conninfo()) as other:
        try:
            other.execute(
                "SELECT id FROM django_app_occurrence WHERE id = ANY(%s) FOR UPDATE NOWAIT",
                [list(occurrence_ids)],
            )
        except psycopg.errors.LockNotAvailable:
            return False
        other.rollback()
    return True


class LeaseCheckingPublisher(RecordingPublisher):
    """Counts, when the wave publishes, the shard leases still valid."""

    def __init__(self) -> None:
        super().__init__()
        self.valid_leases_at_publish: int | None = None

    def publish(self, messages: Sequence[OccurrenceMessage]) -> None:
        # Read committed: sees renewals other sessions committed while the wave was held.
        self.valid_leases_at_publish = ShardLease.objects.filter(
            expires_at__gt=SYSTEM_CLOCK.now()
        ).count()
        super().publish(messages)


def test_a_wave_held_past_the_lease_period_keeps_the_shard_leases(
    app: Celery, settings: Any
) -> None:
    # The wave's transaction opens 6 s (three lease periods) before its instant and waits
    # inside it, as a large burst's does.
    settings.CELERY_SCHEDULER = {
        "shard_count": 4,
        "lease_seconds": 2,
        "burst_relay": True,
        "burst_hold_seconds": 6,
    }
    api.create_schedule(
        name="soon", task="billing.ping", run_at=SYSTEM_CLOCK.now() + timedelta(seconds=9)
    )
    publisher = LeaseCheckingPublisher()
    s = DatabaseScheduler(app=app, publisher=publisher)
    try:
        deadline = time.monotonic() + 40
        tokens: dict[int, int] = {}
        while not publisher.sent and time.monotonic() < deadline:
            wait = s.tick()
            if not tokens and s._leaser is not None:
                tokens = dict(s._leaser.held)
            time.sleep(min(wait, 0.2))
        assert publisher.sent, "the wave never fired"
        assert tokens, "the beat never held a shard"
        assert publisher.valid_leases_at_publish == len(tokens)  # renewed during the wave
        s.tick()  # the loop's own refresh after the wave: renews, does not re-acquire
        assert s._leaser is not None
        assert s._leaser.held == tokens
        assert dict(ShardLease.objects.values_list("shard", "fencing_token")) == tokens
    finally:
        s.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def own_redis() -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A redis-server of this test's own, so it can be SIGSTOPped (hung, not down)."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    port = _free_port()
    server = subprocess.Popen(
        [binary, "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    deadline = time.monotonic() + 10
    while True:
        try:
            redis.Redis.from_url(url).ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    try:
        yield server, url
    finally:
        server.send_signal(signal.SIGCONT)
        server.kill()
        server.wait(10)


def test_a_hung_redis_fails_the_publish_within_the_timeout_and_releases_the_locks(
    own_redis: tuple[subprocess.Popen[bytes], str],
) -> None:
    server, url = own_redis
    app = Celery("hung-redis", broker=url, set_as_current=False)
    clock = SYSTEM_CLOCK
    at = clock.now() + timedelta(seconds=3)
    seed(clock, [(at, 20)])
    relay = BurstRelay(clock=clock, publisher=RedisFastPublisher(app, timeout=1.0), node="n1")
    relay.poll()  # claimed, prepared, queues declared: Redis answered until now
    assert relay.held() == 20
    occurrence_ids = list(Occurrence.objects.values_list("id", flat=True))
    server.send_signal(signal.SIGSTOP)  # hung: accepts nothing, answers nothing
    outcome: list[BaseException | None] = []

    def fire() -> None:
        try:
            wait = (relay.next_due_at() or clock.now()) - clock.now()
            time.sleep(max(wait.total_seconds(), 0))
            relay.publish_held()
            outcome.append(None)
        except BaseException as exc:  # the test reports whatever ended the wave
            outcome.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=fire, daemon=True)
    thread.start()
    try:
        # Due in 3 s, then at most the 1 s socket timeout (plus a loaded machine's slack).
        # Without one, redis-py < 6 (what celery[redis] pins) waits forever; redis-py 8
        # defaults to 5 s, still past this bound.
        thread.join(timeout=(at - clock.now()).total_seconds() + 3.5)
        assert not thread.is_alive(), "the wave is still waiting on the hung Redis"
        assert outcome, "the wave thread ended without an outcome"
        assert isinstance(outcome[0], errors.CoordinationUnavailable), outcome
        assert _lockable(occurrence_ids)  # the wave's transaction rolled back
        assert not OutboxEntry.objects.filter(sent_at__isnull=False).exists()
        assert not OutboxEntry.objects.exclude(claimed_by="").exists()  # claims given back
    finally:
        server.send_signal(signal.SIGCONT)
        thread.join(30)
        app.close()


class OverrunClock(FrozenClock):
    """A frozen clock whose sleeps overrun: the process was stopped while it slept."""

    def __init__(self, start: datetime, overrun: float) -> None:
        super().__init__(start)
        self.overrun = overrun

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds + self.overrun)


def test_a_wave_that_woke_far_past_its_instant_does_not_publish() -> None:
    clock = OverrunClock(NOW - timedelta(seconds=20), overrun=60.0)
    seed(clock, [(NOW, 10)])
    publisher = RecordingPublisher()
    relay = BurstRelay(clock=clock, publisher=publisher, node="n1")
    assert relay.poll().held == 10
    clock.set(relay.next_due_at() or NOW)
    relay.publish_held()  # sleeps until NOW, wakes at NOW + 60 s
    assert publisher.sent == []
    assert not OutboxEntry.objects.filter(sent_at__isnull=False).exists()
    assert not OutboxEntry.objects.exclude(claimed_by="").exists()  # given back at once
    clock.overrun = 0.0
    relay.poll()  # due now: the general path publishes them, late but once
    assert sorted(publisher.task_ids) == sorted(
        str(i) for i in Occurrence.objects.values_list("id", flat=True)
    )
