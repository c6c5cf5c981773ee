"""Issue 15, item 6: a stalled beat does not hold strict work hostage.

Two real beats on PostgreSQL or MariaDB + Redis. One-off schedules come due together;
whichever beat claimed them ahead is frozen with SIGSTOP just before their instant (on
PostgreSQL its burst wave's transaction is open, the occurrence rows locked; MariaDB's
lookahead relay holds only the durable claims until the instant, and a stall inside its
short publishing transaction is proven in ``tests/integration/relay/test_relay_stall_bound.py``)
and stays frozen for ``STALL`` seconds. Before, the
claims lasted the row's time plus ``lease_seconds`` (30 s) and the row locks as long as the
process was frozen: the rows went out when it was resumed, ``STALL`` seconds late. Now the
other beat must publish every one of them within ``BOUND`` seconds of its time (the strict
SLO), and each message reaches the broker exactly once.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from celery_scheduler import api
from celery_scheduler.core.clock import SYSTEM_CLOCK
from django_app.models import BeatNode, Occurrence, OutboxEntry
from tests.acceptance import support

pytestmark = [
    pytest.mark.concurrent_db,
    pytest.mark.redis,
    pytest.mark.acceptance,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(300),
]

ROWS = 20
#: Seconds the claiming beat stays frozen.
STALL = 20.0
#: Seconds after its time by which every row must be on the broker (docs/howto/many-beats.md).
BOUND = 5.0


def test_a_stopped_beats_claims_are_published_by_the_other_beat_within_the_bound(
    redis_url: str, tmp_path: Path, settings: Any
) -> None:
    settings.CELERY_SCHEDULER = {"shard_count": 8}
    env = support.process_env(redis_url, CELERY_SCHEDULER_SHARDS="8")
    beats = [support.start_beat(env, tmp_path / f"beat{n}.log") for n in range(2)]
    with support.running(*beats):
        support.wait_until(
            lambda: BeatNode.objects.count() == 2, timeout=90, what="both beats to heartbeat"
        )
        due = SYSTEM_CLOCK.now() + timedelta(seconds=12)
        for i in range(ROWS):
            api.create_schedule(name=f"strict-{i}", task="billing.ping", run_at=due)
        support.wait_until(
            lambda: OutboxEntry.objects.exclude(claimed_by="").count() == ROWS,
            timeout=(due - SYSTEM_CLOCK.now()).total_seconds() - 1,
            what="the rows to be claimed ahead",
        )
        holders = Counter(
            token.split("/")[0]
            for token in OutboxEntry.objects.values_list("claimed_by", flat=True)
        )
        holder_node, held = holders.most_common(1)[0]
        holder = next(b for b in beats if holder_node.endswith(f":{b.pid}"))
        claimed = set(
            OutboxEntry.objects.filter(claimed_by__startswith=holder_node + "/").values_list(
                "occurrence_id", flat=True
            )
        )
        time.sleep(max(0.0, (due - SYSTEM_CLOCK.now()).total_seconds() - 0.4))
        holder.send_signal(signal.SIGSTOP)
        try:
            support.wait_until(
                lambda: OutboxEntry.objects.filter(sent_at__isnull=True).count() == 0,
                timeout=STALL,
                what="every row to be published while the holder is stopped",
            )
        finally:
            remaining = STALL - (SYSTEM_CLOCK.now() - due).total_seconds()
            time.sleep(max(0.0, remaining))  # stay frozen the whole stall, then resume
            holder.send_signal(signal.SIGCONT)
        time.sleep(3)  # the resumed beat must not publish its (lapsed) rows again
    lags = sorted(
        _publish_lag(o) for o in Occurrence.objects.filter(id__in=claimed).select_related("outbox")
    )
    print(f"holder held {held}/{ROWS} rows; their lags (s): {[round(x, 2) for x in lags]}")
    assert len(lags) == len(claimed) == held
    assert lags[-1] <= BOUND, (lags, support.tail(tmp_path / "beat0.log"))
    on_broker = Counter(support.broker_task_ids(redis_url))
    assert set(on_broker) == {str(i) for i in Occurrence.objects.values_list("id", flat=True)}
    assert set(on_broker.values()) == {1}, on_broker


def _publish_lag(o: Occurrence) -> float:
    """Seconds from the occurrence's release to its outbox row's publish (it must be sent)."""
    sent_at = o.outbox.sent_at
    assert sent_at is not None, f"occurrence {o.id} was never published"
    return (sent_at - o.available_at).total_seconds()


def _stopped(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] == "T"
    except (FileNotFoundError, IndexError):
        return False


def test_a_beat_stopped_inside_its_publishing_transaction_loses_its_session(
    redis_url: str, tmp_path: Path, settings: Any
) -> None:
    """The relay transaction itself is frozen: its rows are locked, not only claimed.

    Beat 0 claims the rows ahead (it runs alone until then), then stops itself (SIGSTOP at
    fault point ``relay.before_publish``) at their time with its batch's outbox and
    occurrence rows locked. The database must end that session after
    ``claim_grace_seconds`` (PostgreSQL ``idle_in_transaction_session_timeout``, MariaDB
    ``idle_transaction_timeout``) so that beat 1, started once the rows were claimed,
    publishes them while beat 0 is still stopped; resumed, beat 0 must not publish them
    again.
    """
    settings.CELERY_SCHEDULER = {"shard_count": 8}
    env = support.process_env(redis_url, CELERY_SCHEDULER_SHARDS="8")
    stopping = support.start_beat(
        env, tmp_path / "beat0.log", fault="relay.before_publish", fault_signal="STOP"
    )
    with support.running(stopping):
        support.wait_until(
            lambda: BeatNode.objects.count() == 1, timeout=90, what="beat 0 to heartbeat"
        )
        due = SYSTEM_CLOCK.now() + timedelta(seconds=15)
        for i in range(ROWS):
            api.create_schedule(name=f"strict-{i}", task="billing.ping", run_at=due)
        mine = OutboxEntry.objects.filter(claimed_by__contains=f":{stopping.pid}/")
        try:
            support.wait_until(
                lambda: mine.count() == ROWS,
                timeout=(due - SYSTEM_CLOCK.now()).total_seconds() + 1,
                what="beat 0 to claim every row ahead",
            )
        except AssertionError:
            rows = list(OutboxEntry.objects.values_list("claimed_by", "sent_at", "available_at"))
            print(rows, support.tail(tmp_path / "beat0.log"))
            raise
        with support.running(support.start_beat(env, tmp_path / "beat1.log")):
            support.wait_until(
                lambda: _stopped(stopping.pid), timeout=30, what="beat 0 to stop in its publish"
            )
            try:
                support.wait_until(
                    lambda: OutboxEntry.objects.filter(sent_at__isnull=True).count() == 0,
                    timeout=STALL,
                    what="every row to be published while beat 0 is stopped",
                )
                published_at = SYSTEM_CLOCK.now()
            finally:
                remaining = STALL - (SYSTEM_CLOCK.now() - due).total_seconds()
                time.sleep(max(0.0, remaining))
                stopping.send_signal(signal.SIGCONT)
            time.sleep(3)  # the resumed beat must not publish its rows again
    lags = sorted(_publish_lag(o) for o in Occurrence.objects.select_related("outbox"))
    print(f"lags (s), beat 1 started after the claims: {[round(x, 2) for x in lags]}")
    assert len(lags) == ROWS
    # Published while beat 0 was still stopped: the server, not the resume, freed the rows.
    assert published_at < due + timedelta(seconds=STALL), support.tail(tmp_path / "beat1.log")
    on_broker = Counter(support.broker_task_ids(redis_url))
    assert set(on_broker) == {str(i) for i in Occurrence.objects.values_list("id", flat=True)}
    assert set(on_broker.values()) == {1}, (on_broker, support.tail(tmp_path / "beat0.log"))
