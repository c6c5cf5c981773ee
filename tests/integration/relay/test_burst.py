"""The burst relay on PostgreSQL (+ Redis): on time, exactly once, crash-safe, cancel-safe."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from django.db import connection

from celery_scheduler import api
from celery_scheduler.core import ids as core_ids
from celery_scheduler.core.clock import FrozenClock, SystemClock
from celery_scheduler.core.enums import OccurrenceState
from celery_scheduler.publishers import RecordingPublisher
from celery_scheduler.publishers.redis_fast import RedisFastPublisher
from django_app import conf
from django_app.materialize.set_based import materialize_due_bulk
from django_app.models import Occurrence, OutboxEntry, Schedule, ScheduleVersion, Tenant
from django_app.relay.batch import relay_due
from django_app.relay.burst import BurstRelay
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


def test_each_row_is_published_once_never_before_its_time_and_marked_with_acceptance() -> None:
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
    counts = Counter(publisher.task_ids)
    assert len(counts) == 320
    assert set(counts.values()) == {1}
    accepted: dict[str, datetime] = {}
    due = dict(Occurrence.objects.values_list("id", "available_at"))
    for at, _, messages in publisher.calls:
        for message in messages:
            assert at >= due[uuid.UUID(message.task_id)]
            accepted[message.task_id] = at
    assert next(c[0] for c in publisher.calls) == NOW
    assert OutboxEntry.objects.filter(sent_at__isnull=True).count() == 0
    for occ in Occurrence.objects.all():
        assert occ.state == OccurrenceState.ENQUEUED
        assert occ.enqueued_at == accepted[str(occ.id)]
        assert occ.outbox.sent_at == occ.enqueued_at
        assert occ.outbox.publish_count == 1
    assert relay.poll().held == 0  # nothing left, nothing re-published
    assert len(publisher.sent) == 320


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


def test_cancel_committed_before_the_hold_is_never_published() -> None:
    clock = FrozenClock(NOW - timedelta(seconds=20))
    schedules = seed(clock, [(NOW, 20)])
    publisher = TimedPublisher(clock)
    relay = BurstRelay(clock=clock, publisher=publisher, node="n1")
    relay.poll()  # prepared with the old version
    canceled = schedules[:5]
    for s in canceled:
        api.cancel_schedule(s.id, clock=clock)
    drive(relay, clock)
    gone = {str(o.id) for o in Occurrence.objects.filter(schedule__in=canceled)}
    assert len(gone) == 5
    assert not gone & set(publisher.task_ids)
    assert len(publisher.task_ids) == 15
    assert set(
        Occurrence.objects.filter(schedule__in=canceled).values_list("state", flat=True)
    ) == {"CANCELED"}


def test_cancel_racing_a_held_wave_waits_for_its_commit() -> None:
    clock = FrozenClock(NOW - timedelta(seconds=20))
    schedules = seed(clock, [(NOW, 10)])
    gate = threading.Event()
    publisher = TimedPublisher(clock, gate)
    relay = BurstRelay(clock=clock, publisher=publisher, node="n1")
    relay.poll()
    failures: list[BaseException] = []
    canceled_at: list[float] = []

    def run(target: Any) -> threading.Thread:
        def body() -> None:
            try:
                target()
            except BaseException as exc:
                failures.append(exc)
            finally:
                connection.close()

        thread = threading.Thread(target=body)
        thread.start()
        return thread

    def cancel() -> None:
        api.cancel_schedule(schedules[0].id, clock=SystemClock())
        canceled_at.append(time.monotonic())

    relaying = run(lambda: drive(relay, clock))
    assert publisher.entered.wait(30)  # the wave holds its locks, publishing
    canceling = run(cancel)
    canceling.join(1.0)
    assert canceling.is_alive()  # blocked on the held occurrence rows
    gate.set()
    relaying.join(30)
    canceling.join(30)
    assert not failures, failures
    assert len(publisher.task_ids) == 10
    assert all(mono < canceled_at[0] for _, mono, _ in publisher.calls)
    occ = Occurrence.objects.get(schedule=schedules[0])
    assert occ.state == OccurrenceState.CANCELED  # invalidated after it was ENQUEUED
    # Nothing of the canceled version goes out afterwards.
    again = TimedPublisher(clock)
    relay_due(clock=FrozenClock(NOW + timedelta(minutes=5)), publisher=again)
    assert again.sent == []


def test_a_wave_counts_publishes_and_observes_lag_and_time_scheduled() -> None:
    """The burst relay is the default on PostgreSQL + Redis: it feeds the SLO metrics too."""
    from celery_scheduler import metrics

    metrics.reset()
    clock = FrozenClock(NOW - timedelta(seconds=20))
    seed(clock, [(NOW, 30)])
    Occurrence.objects.update(created_at=NOW - timedelta(seconds=20))  # the frozen clock's
    relay = BurstRelay(clock=clock, publisher=RecordingPublisher(), node="n1")
    assert relay.poll().held == 30
    drive(relay, clock)
    assert OutboxEntry.objects.filter(sent_at__isnull=True).count() == 0

    def sample(name: str, **labels: str) -> float | None:
        return metrics.registry().get_sample_value(f"celery_scheduler_{name}", labels)

    assert sample("published_total") == 30
    assert sample("schedule_lag_seconds_count", tenant="default") == 30
    assert sample("schedule_lag_seconds_sum", tenant="default") == pytest.approx(0.0, abs=1)
    assert sample("state_seconds_count", tenant="default", state="SCHEDULED") == 30
    assert sample("state_seconds_sum", tenant="default", state="SCHEDULED") == pytest.approx(
        30 * 20.0, abs=30
    )


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
