"""Issue 9, hole 10: a SIGTERM stops beat within a bound and hands its shards over.

Celery's SIGTERM handler calls ``DatabaseScheduler.close`` from inside whatever the loop
was doing. When that was a query, the release of the shard leases ran on the same psycopg
connection, whose lock the interrupted query still held: the process hung until SIGKILL and
its shards stayed leased. Here real beat processes on PostgreSQL are stopped again and
again, the signal landing at random points of the loop; half of the stops land while the
heartbeat query is provably in flight (the test holds the beat's heartbeat row locked and
sees the query wait on it in ``pg_stat_activity``). Every stop must end the process within
``STOP_BOUND`` seconds and leave none of its shards leased.
"""

from __future__ import annotations

import functools
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection

from celery_scheduler import api
from django_app.models import BeatNode, ShardLease
from tests.acceptance import support

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.acceptance,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(600),
]

STOPS = 6
#: Seconds from SIGTERM to exit that a clean stop may take.
STOP_BOUND = 10.0


def _conninfo() -> str:
    params = connection.settings_dict
    return (
        f"host={params.get('HOST') or '127.0.0.1'} port={params.get('PORT') or 5432} "
        f"user={params.get('USER') or 'postgres'} dbname={params['NAME']}"
    )


def _node_of(pid: int) -> str | None:
    return BeatNode.objects.filter(name__endswith=f":{pid}").values_list("name", flat=True).first()


def _waiting_on(blocker: psycopg.Connection[Any]) -> bool:
    """Whether some session (the beat's heartbeat) waits on ``blocker``'s row lock."""
    with psycopg.connect(_conninfo(), autocommit=True) as probe:
        row = probe.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
            [blocker.info.backend_pid],
        ).fetchone()
    return bool(row and row[0])


def test_sigterm_at_random_points_stops_within_the_bound_and_releases_the_shards(
    redis_url: str, tmp_path: Path, settings: Any
) -> None:
    settings.CELERY_SCHEDULER = {"shard_count": 8}
    for i in range(20):
        api.create_schedule(name=f"tick-{i}", task="billing.ping", interval=1)
    env = support.process_env(
        redis_url, CELERY_SCHEDULER_SHARDS="8", CELERY_SCHEDULER_LEASE_SECONDS="6"
    )
    rng = random.Random(20261130)
    failures: list[str] = []
    took: list[float] = []
    for n in range(STOPS):
        log = tmp_path / f"beat{n}.log"
        beat = support.start_beat(env, log)
        try:
            node = support.wait_until(
                functools.partial(_node_of, beat.pid), timeout=60, what=f"beat {n} to heartbeat"
            )
            support.wait_until(
                ShardLease.objects.filter(owner=node).exists,  # (queries on every call)
                timeout=30,
                what=f"beat {n} to lease shards",
            )
            in_query = n % 2 == 0
            blocker = None
            if in_query:
                # Lock the beat's heartbeat row: its next refresh waits inside the query.
                blocker = psycopg.connect(_conninfo())
                blocker.execute(
                    "SELECT 1 FROM django_app_beatnode WHERE name = %s FOR UPDATE", [node]
                )
                # Its refresh (every second) waits on the lock: seen in pg_stat_activity,
                # not assumed after a fixed sleep.
                support.wait_until(
                    functools.partial(_waiting_on, blocker),
                    timeout=10,
                    interval=0.1,
                    what=f"beat {n}'s heartbeat to wait on the lock",
                )
            else:
                time.sleep(rng.uniform(0.0, 2.5))
            beat.send_signal(signal.SIGTERM)
            sent = time.monotonic()
            if blocker is not None:
                time.sleep(1.0)
                blocker.rollback()  # the lock holder goes away, as a slow query would finish
                blocker.close()
            try:
                beat.wait(timeout=STOP_BOUND)
                took.append(time.monotonic() - sent)
            except subprocess.TimeoutExpired:
                failures.append(
                    f"stop {n} (in query: {in_query}): still running {STOP_BOUND}s after SIGTERM"
                )
                beat.kill()
                beat.wait(10)
                continue
            held = list(ShardLease.objects.filter(owner=node).values_list("shard", flat=True))
            if held:
                failures.append(f"stop {n} (in query: {in_query}): exited holding shards {held}")
            if BeatNode.objects.filter(name=node).exists():
                failures.append(f"stop {n} (in query: {in_query}): heartbeat row left behind")
        finally:
            if beat.poll() is None:
                beat.kill()
                beat.wait(10)
        # A killed beat's leases expire on their own; start the next from a clean slate.
        ShardLease.objects.update(owner="", expires_at=None)
        BeatNode.objects.all().delete()
    print(f"stop times (s): {[round(t, 2) for t in took]}")
    if failures:
        pytest.fail("\n".join(failures) + "\n" + support.tail(tmp_path / "beat0.log"))


#: One-off rows due together, published in one burst wave.
WAVE_ROWS = 40


def test_a_stop_after_the_publish_waits_for_the_marks_and_nothing_is_sent_twice(
    redis_url: str, tmp_path: Path, settings: Any
) -> None:
    """SIGTERM (a deploy) lands between the broker accepting a wave and the marks' commit
    (fault point ``relay.before_mark`` with ``CELERY_SCHEDULER_FAULT_SIGNAL=TERM``). The
    beat must still commit the marks, then stop; a beat started after it must find nothing
    to send. Before: Celery's handler unwound the wave, the marks rolled back, and the next
    beat sent every message of the wave a second time."""
    from collections import Counter
    from datetime import timedelta

    from celery_scheduler.core.clock import SYSTEM_CLOCK
    from django_app.models import OutboxEntry

    env = support.process_env(redis_url)
    stopping = support.start_beat(
        env, tmp_path / "beat0.log", fault="relay.before_mark", fault_signal="TERM"
    )
    with support.running(stopping):
        support.wait_until(
            BeatNode.objects.exists, timeout=90, what="beat 0 to heartbeat"
        )  # fmt: skip
        due = SYSTEM_CLOCK.now() + timedelta(seconds=8)
        for i in range(WAVE_ROWS):
            api.create_schedule(name=f"once-{i}", task="billing.ping", run_at=due)
        stopping.wait(timeout=60)  # stopped by its own SIGTERM after the publish
    assert OutboxEntry.objects.filter(sent_at__isnull=True).count() == 0, support.tail(
        tmp_path / "beat0.log"
    )
    with support.running(support.start_beat(env, tmp_path / "beat1.log")):
        support.wait_until(BeatNode.objects.exists, timeout=90, what="beat 1 to heartbeat")
        time.sleep(3)  # a few polls: it must find nothing left to send
    on_broker = Counter(support.broker_task_ids(redis_url))
    assert len(on_broker) == WAVE_ROWS
    assert set(on_broker.values()) == {1}, on_broker
    assert set(OutboxEntry.objects.values_list("publish_count", flat=True)) == {1}
