"""Kill a real beat process with SIGKILL at each named fault point, restart, lose nothing.

Judge: the reconciler recomputes the expected occurrence set from the schedule versions
and time rules alone; after recovery nothing may be ABSENT or still pending, every expected
occurrence id is on the broker, and a duplicate on the broker is always the same id.

Both data paths run: the defaults on PostgreSQL + Redis (set-based materializer, whose fault
points are hit once per batch of schedules; burst relay, once per wave) and the pinned
per-schedule materializer with the kombu lookahead relay (once per schedule / relay batch).
"""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.db import connection

from celery_scheduler import api
from django_app.models import Occurrence, OutboxEntry
from django_app.operations.reconcile import reconcile

from . import support

pytestmark = [
    pytest.mark.concurrent_db,
    pytest.mark.redis,
    pytest.mark.acceptance,
    pytest.mark.django_db(transaction=True),
]

ONE_OFFS = 12
INTERVALS = 3


def _create_schedules(now: datetime) -> list[uuid.UUID]:
    ids = []
    for i in range(ONE_OFFS):
        run_at = now + timedelta(seconds=4 + (i % 3))
        ids.append(api.create_schedule(name=f"once-{i}", task="billing.ping", run_at=run_at).id)
    for i in range(INTERVALS):
        ids.append(
            api.create_schedule(
                name=f"every-2s-{i}", task="billing.ping", interval=2, start_at=now
            ).id
        )
    return ids


def _unsent(until: datetime) -> int:
    """Outbox rows due by ``until`` and not sent (later ones exist: intervals run ahead)."""
    return OutboxEntry.objects.filter(sent_at__isnull=True, available_at__lt=until).count()


#: Environment per data path: the defaults, and the per-schedule paths pinned.
PATHS = {
    "default": {},
    "per-schedule": {"CELERY_SCHEDULER_BULK_MATERIALIZE": "0", "CELERY_SCHEDULER_BURST_RELAY": "0"},
}
RELAYS = {"default": "BurstRelay", "per-schedule": "LookaheadRelay"}


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize(
    ("fault", "duplicates_expected"),
    [
        ("materialize.before_insert", False),
        ("materialize.after_commit", False),
        ("relay.after_publish", True),
        ("relay.before_mark", True),
    ],
)
def test_sigkill_at_fault_point_then_restart_loses_nothing(
    fault: str, duplicates_expected: bool, path: str, redis_url: str, tmp_path: Path
) -> None:
    if path == "default" and connection.vendor != "postgresql":
        pytest.skip("the defaults are the per-schedule paths here (fast paths: PostgreSQL only)")
    start = datetime.now(UTC).replace(microsecond=0)
    schedule_ids = _create_schedules(start)
    # Short shard leases: the survivor takes the dead node's shards after this long.
    env = support.process_env(redis_url, CELERY_SCHEDULER_LEASE_SECONDS="3", **PATHS[path])
    log = tmp_path / "beat.log"

    doomed = support.start_beat(env, log, fault=fault)
    try:
        code = doomed.wait(timeout=60)
    finally:
        support.stop(doomed)
    assert code == -9, f"beat was not killed at {fault} (exit {code}):\n{support.tail(log)}"
    assert f"relay {RELAYS[path]}," in log.read_text(), support.tail(log)
    killed_at = datetime.now(UTC)

    # The window judged: every one-off, and the intervals until a while after the restart.
    end = max(killed_at, start + timedelta(seconds=7)) + timedelta(seconds=4)

    def recovered() -> bool:
        if datetime.now(UTC) < end or _unsent(end):
            return False
        report = reconcile(start=start, end=end, now=datetime.now(UTC), schedule_ids=schedule_ids)
        return all(item.state == "ENQUEUED" for item in report.expected)

    survivor = support.start_beat(env, log)
    with support.running(survivor):
        support.wait_until(recovered, timeout=60, what=f"recovery\n{support.tail(log)}")

    report = reconcile(start=start, end=end, now=datetime.now(UTC), schedule_ids=schedule_ids)
    # No worker runs here, so "reached the broker" (ENQUEUED) is the end of the line.
    states = Counter(item.state or item.status for item in report.expected)
    assert set(states) == {"ENQUEUED"}, states
    assert report.unexpected == []
    expected_ids = {str(item.occurrence_id) for item in report.expected}
    assert len(expected_ids) >= ONE_OFFS + INTERVALS * 3

    on_broker = Counter(support.broker_task_ids(redis_url))
    assert expected_ids <= set(on_broker), "an expected occurrence never reached the broker"
    known = {str(pk) for pk in Occurrence.objects.values_list("id", flat=True)}
    assert set(on_broker) <= known, "the broker holds a message that is no occurrence"
    # No occurrence key was materialized twice: ids are derived from keys, and keys unique.
    assert Occurrence.objects.count() == len(known)
    duplicated = {task_id for task_id, n in on_broker.items() if n > 1}
    if duplicates_expected:
        # The killed beat published before it could mark: the restart re-sent the same ids.
        assert duplicated, "expected a re-send of the batch the killed beat had published"
        assert OutboxEntry.objects.filter(publish_count__gt=1).count() == 0
    else:
        assert duplicated == set()
