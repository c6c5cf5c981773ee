"""What only the burst relay promises, on PostgreSQL (+ Redis).

Its claims shared with the lookahead relay (once, never early, crash-safe, cancel-safe,
metrics) run for every relay in ``test_relay_contract.py`` through the ``relay`` fixture;
here: the wave prepared ahead, the Redis fast path's held payloads, a real SIGKILL of a
child beat between publish and commit, and the late-wave log level.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from django.db import connection, transaction

from celery_scheduler.core import ids as core_ids
from celery_scheduler.core.clock import FrozenClock, SystemClock
from celery_scheduler.core.enums import OccurrenceState
from celery_scheduler.publishers import RecordingPublisher
from celery_scheduler.publishers.redis_fast import RedisFastPublisher
from django_app import conf
from django_app.materialize.set_based import materialize_due_bulk
from django_app.models import Occurrence, OutboxEntry, Schedule, ScheduleVersion, Tenant
from django_app.relay.burst import BurstRelay
from django_app.tenancy import budget
from tests.integration.relay.test_relay_contract import TimedPublisher

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
ROOT = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def seed(clock: Any, due: Sequence[tuple[datetime, int]]) -> list[Schedule]:
    """One-off schedules as the lifecycle API leaves them (bulk: the API is ~10 ms each)."""
    tenant, _ = Tenant.objects.get_or_create(slug="default")
    count = conf.get().shard_count
    schedules = []
    for at, n in due:
        for _ in range(n):
            sid = uuid.uuid4()
            schedules.append(
                Schedule(  # type: ignore[misc]  # next_run_at: a property
                    id=sid,
                    tenant=tenant,
                    name=sid.hex,
                    task="billing.ping",
                    kind="ONE_OFF",
                    run_at=at,
                    next_run_at=at,
                    shard=core_ids.shard_for(sid, count),
                )
            )
    Schedule.objects.bulk_create(schedules)
    ScheduleVersion.objects.bulk_create(
        ScheduleVersion(
            schedule=s, version=1, kind="ONE_OFF", run_at=s.run_at, valid_from=clock.now()
        )
        for s in schedules
    )
    materialize_due_bulk(clock=clock, horizon=timedelta(minutes=5))
    assert OutboxEntry.objects.filter(sent_at__isnull=True).count() == len(schedules)
    return schedules


def drive(relay: BurstRelay, clock: FrozenClock) -> None:
    """The beat loop's part, with a frozen clock: sleep to each hold time, publish."""
    while (at := relay.next_due_at()) is not None:
        if at > clock.now():
            clock.set(at)
        relay.publish_held()


def test_burst_only_holds_a_claimed_wave_prepared_and_sends_nothing_early() -> None:
    """What only the burst relay promises: a poll ahead of the instant claims and prepares the
    whole wave and sends nothing. What every relay promises (once, never early, marked with
    the acceptance time) is in ``test_relay_contract.py``."""
    clock = FrozenClock(NOW - timedelta(seconds=20))
    half = NOW + timedelta(milliseconds=500)
    later = NOW + timedelta(seconds=3)
    seed(clock, [(NOW, 250), (half, 40), (later, 30)])
    publisher = TimedPublisher(clock)
    relay = BurstRelay(clock=clock, publisher=publisher, node="n1", lookahead=timedelta(30))
    assert relay.poll().held == 320
    assert publisher.sent == []  # prepared ahead, nothing sent early
    assert OutboxEntry.objects.filter(claimed_by=relay.token).count() == 320
    drive(relay, clock)
    assert Counter(publisher.task_ids) == Counter(
        {str(i): 1 for i in Occurrence.objects.values_list("id", flat=True)}
    )
    assert relay.poll().held == 0


@pytest.fixture
def app(redis_url: str) -> Iterator[Celery]:
    app = Celery("burst-test", broker=redis_url, set_as_current=False)
    yield app
    app.close()


@pytest.mark.redis
def test_burst_to_redis_arrives_once_each_on_time(
    app: Celery, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="django_app.relay.burst")
    clock = SystemClock()
    at = datetime.now(UTC) + timedelta(seconds=3)
    seed(clock, [(at, 400)])
    publisher = RedisFastPublisher(app)
    relay = BurstRelay(clock=clock, publisher=publisher, node="n1")
    relay.poll()
    assert relay.held() == 400
    held = [r.prepared for w in relay._waves for r in w.rows]
    # What is held until T is the payload and a shared list key, not the source message.
    assert all(p.message is None and p.payload.startswith(b'{"body": ') for p in held)
    assert len({id(p.key) for p in held}) == 1
    assert len({id(r.available_at) for w in relay._waves for r in w.rows}) == 1
    while (hold := relay.next_due_at()) is not None:
        clock.sleep((hold - clock.now()).total_seconds())
        relay.publish_held()
    client = redis.Redis.from_url(redis_url)
    ids = [json.loads(raw)["headers"]["id"] for raw in client.lrange("celery", 0, -1)]
    client.close()
    assert sorted(ids) == sorted(str(i) for i in Occurrence.objects.values_list("id", flat=True))
    lags = sorted(
        (o.enqueued_at - o.available_at).total_seconds()
        for o in Occurrence.objects.all()
        if o.enqueued_at is not None
    )
    assert len(lags) == 400
    assert lags[0] >= 0
    assert lags[-1] < 2.0, lags[-1]
    # One short line per wave at INFO; the stage detail is DEBUG only.
    waves = [r for r in caplog.records if r.name == "django_app.relay.burst"]
    assert [r.levelno for r in waves] == [logging.INFO]
    assert waves[0].getMessage().startswith("burst relay: 400 row(s) due ")
    assert "stages" not in waves[0].getMessage()


CHILD = """
import json, sys
from datetime import datetime
import django
django.setup()
from celery import Celery
from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.publishers.redis_fast import RedisFastPublisher
from django_app.relay.burst import BurstRelay
clock = FrozenClock(datetime.fromisoformat(sys.argv[1]))
app = Celery("burst-child", broker=sys.argv[2], set_as_current=False)
relay = BurstRelay(clock=clock, publisher=RedisFastPublisher(app), node="child")
report = relay.poll()
while (at := relay.next_due_at()) is not None:
    if at > clock.now():
        clock.set(at)
    report += relay.publish_held()
print(json.dumps(report.__dict__))
"""


def run_child(at: datetime, broker: str, fault: str | None) -> subprocess.CompletedProcess[str]:
    params = connection.settings_dict
    url = f"postgres://{params.get('USER') or 'postgres'}@{params['HOST'] or '127.0.0.1'}"
    url += f":{params['PORT'] or 5432}/{params['NAME']}"
    env = {k: v for k, v in os.environ.items() if k != "CELERY_SCHEDULER_FAULT"}
    env.update(DATABASE_URL=url, DJANGO_SETTINGS_MODULE="example_project.settings")
    if fault:
        env["CELERY_SCHEDULER_FAULT"] = fault
    return subprocess.run(
        [sys.executable, "-c", CHILD, at.isoformat(), broker],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.redis
@pytest.mark.parametrize("fault", ["relay.after_publish", "relay.before_mark"])
def test_sigkill_between_publish_and_commit_republishes_the_same_ids(
    redis_url: str, fault: str
) -> None:
    clock = FrozenClock(NOW - timedelta(seconds=20))
    seed(clock, [(NOW, 150)])
    expected = sorted(str(i) for i in Occurrence.objects.values_list("id", flat=True))
    killed = run_child(clock.now(), redis_url, fault)
    assert killed.returncode == -9, killed.stderr
    client = redis.Redis.from_url(redis_url)
    first = [json.loads(raw)["headers"]["id"] for raw in client.lrange("celery", 0, -1)]
    assert sorted(first) == expected  # the broker had them all
    # ...but nothing is marked: the marks died with the transaction.
    assert OutboxEntry.objects.filter(sent_at__isnull=True).count() == 150
    assert not Occurrence.objects.exclude(state=OccurrenceState.SCHEDULED.value).exists()
    claim = OutboxEntry.objects.values_list("claim_expires_at", flat=True).first()
    assert claim is not None
    # A fresh process after the dead one's claims expired re-publishes the same ids.
    again = run_child(claim + timedelta(seconds=1), redis_url, None)
    assert again.returncode == 0, again.stderr
    ids = [json.loads(raw)["headers"]["id"] for raw in client.lrange("celery", 0, -1)]
    client.close()
    assert Counter(ids) == Counter(dict.fromkeys(expected, 2))
    assert OutboxEntry.objects.filter(sent_at__isnull=True).count() == 0
    assert set(Occurrence.objects.values_list("state", flat=True)) == {"ENQUEUED"}


@pytest.mark.parametrize(
    ("created", "level"),
    [
        # A new schedule's first run "now" (or a run now): created as it falls due, so one
        # poll late is expected and not worth a WARNING.
        (NOW + timedelta(milliseconds=50), logging.INFO),
        # Planned 20 s ahead and still sent 1.2 s late: the relay's fault, a WARNING.
        (NOW - timedelta(seconds=20), logging.WARNING),
    ],
)
def test_a_late_wave_warns_only_when_its_row_was_planned_ahead(
    created: datetime, level: int, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FrozenClock(NOW - timedelta(seconds=20))
    seed(clock, [(NOW, 1)])
    Occurrence.objects.update(created_at=created)
    relay = BurstRelay(clock=clock, publisher=RecordingPublisher(), node="n1")
    clock.set(NOW + timedelta(seconds=1.2))  # the first poll after the row fell due
    caplog.set_level(logging.INFO, logger="django_app.relay")
    relay.poll()
    drive(relay, clock)
    assert OutboxEntry.objects.filter(sent_at__isnull=True).count() == 0
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if "after due" in r.getMessage()]
    assert lines, [r.getMessage() for r in caplog.records]
    assert {lvl for lvl, _ in lines} == {level}, lines


class SlowBroker(TimedPublisher):
    """Each publish takes ``seconds`` of the frozen clock (a broker slow to accept)."""

    def __init__(self, clock: FrozenClock, seconds: float) -> None:
        super().__init__(clock)
        self.seconds = seconds

    def publish(self, messages: Sequence[Any]) -> None:
        super().publish(messages)
        self.clock.advance(self.seconds)


def test_publish_held_gives_the_beat_loop_a_turn_between_waves() -> None:
    """A wave whose time comes while another is being fired waits for the next call: the
    beat loop gets its turn (leases, heartbeat, plan) between waves. Firing them back to back
    kept a beat started after another's stop from taking its shards for ~30 s: it first fired
    every wave its predecessor's window had left (tests/acceptance/test_beat_stop.py)."""
    clock = FrozenClock(NOW - timedelta(seconds=5))
    waves = [NOW + timedelta(seconds=s) for s in (0, 2, 4)]
    seed(clock, [(at, 5) for at in waves])
    publisher = SlowBroker(clock, seconds=3)
    relay = BurstRelay(clock=clock, publisher=publisher, node="n1", lookahead=timedelta(30))
    assert relay.poll().held == 15
    clock.set(NOW)
    relay.publish_held()
    assert len(publisher.sent) == 5  # the first wave only: the next one's time came meanwhile
    due = relay.next_due_at()
    assert due is not None
    assert due <= clock.now()  # so the loop does not sleep before it
    drive(relay, clock)
    assert len(publisher.sent) == 15


class TurnDuringTheHold(FrozenClock):
    """A frozen clock whose first sleep (a wave holding for its instant) first gives
    another relay its turn, at the time the hold began."""

    def __init__(self, start: datetime, turn: Callable[[datetime], None]) -> None:
        super().__init__(start)
        self.turn: Callable[[datetime], None] | None = turn

    def sleep(self, seconds: float) -> None:
        turn, self.turn = self.turn, None
        if turn is not None:
            turn(self.now())
        super().sleep(seconds)


def test_a_taker_during_a_waves_hold_is_not_offered_the_refill_up_to_its_instant() -> None:
    """While a wave holds for its instant, another relay takes the same tenant's tokens (a
    rate-limited tenant's late rows go through the general path). The wave takes its
    tokens as of its instant, a second ahead, so the bucket holds that second's refill:
    the other relay, taking before it exists, must not be offered it."""
    taken: list[int] = []

    def take(at: datetime) -> int:
        with transaction.atomic():
            return budget.take_trigger({rated.id: 10}, {rated.id: 10}, at)[rated.id]

    clock = TurnDuringTheHold(NOW - timedelta(seconds=20), lambda at: taken.append(take(at)))
    seed(clock, [(NOW, 1)])
    rated = Tenant.objects.get(slug="default")
    rated.max_trigger_rate = 10
    rated.save(update_fields=["max_trigger_rate"])
    publisher = TimedPublisher(clock)
    relay = BurstRelay(clock=clock, publisher=publisher, node="n1", lookahead=timedelta(30))
    relay.poll()
    opens = relay.next_due_at()
    assert opens is not None
    assert opens < NOW
    clock.set(opens)
    assert take(opens) == 10  # the bucket, full, spent at the wave's opening
    relay.publish_held()
    if not taken:  # the wave held nothing (its row over budget): the other relay's turn now
        taken.append(take(opens))
    in_the_wave = len(publisher.sent)
    # At the opening, just spent: nothing more then (the bound at one instant is the
    # bucket, 10); the wave's row goes out at its instant, a second of refill later.
    assert taken == [0], (in_the_wave, taken)
    assert in_the_wave == 1
