"""The broker loses every published message (FLUSHDB), and the work still runs exactly once.

Real processes on PostgreSQL + Redis: two beats publish a few one-off occurrences; right
after the broker accepted them (before any worker exists) the test FLUSHDBs the broker's
Redis database, then starts a worker. Nothing would ever claim those occurrences: they are
ENQUEUED and their messages are gone. After ``redelivery_timeout_seconds`` one of the beats
re-opens each outbox row, the relay publishes it again under the same id, and the worker
runs it. The judge counts business effects (a line appended per body run, never rolled
back), not the scheduler's own states.

Both data paths run: the defaults (burst relay) and the kombu lookahead relay.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis

import tests.acceptance.worker_tasks  # noqa: F401  (registers acceptance.effect here too)
from celery_scheduler import api
from celery_scheduler.core.enums import OccurrenceState as S
from django_app.models import Attempt, Occurrence, OutboxEntry
from tests.acceptance import support
from tests.acceptance.worker_harness import Worker
from tests.conftest import REDIS_OWNER_KEY

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.acceptance,
    pytest.mark.django_db(transaction=True),
]

ONE_OFFS = 6
TIMEOUT = 10  # redelivery_timeout_seconds for this test (the default is 600)
PATHS = {
    "default": {},
    "per-schedule": {"CELERY_SCHEDULER_BULK_MATERIALIZE": "0", "CELERY_SCHEDULER_BURST_RELAY": "0"},
}
REQUEUED = re.compile(r"re-publishing (\d+) occurrence")


@pytest.mark.parametrize("path", sorted(PATHS))
def test_flushdb_after_publish_still_runs_each_occurrence_once(
    path: str, redis_url: str, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.txt"
    run_at = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=3)
    schedule_ids = [
        api.create_schedule(name=f"once-{i}", task="acceptance.effect", run_at=run_at).id
        for i in range(ONE_OFFS)
    ]
    env = support.process_env(
        redis_url,
        CELERY_SCHEDULER_REDELIVERY_TIMEOUT=str(TIMEOUT),
        CELERY_SCHEDULER_LEASE_SECONDS="3",
        **PATHS[path],
    )
    logs = [tmp_path / f"beat{i}.log" for i in range(2)]
    beats = [support.start_beat(env, log) for log in logs]
    occurrences = Occurrence.objects.filter(schedule_id__in=schedule_ids)

    def all_sent() -> bool:
        sent = OutboxEntry.objects.filter(occurrence__in=occurrences, sent_at__isnull=False)
        return sent.count() == ONE_OFFS

    with support.running(*beats):
        support.wait_until(all_sent, timeout=60, what=f"publish\n{support.tail(logs[0])}")
        ids = {str(pk) for pk in occurrences.values_list("id", flat=True)}
        assert set(support.broker_task_ids(redis_url)) == ids
        client = redis.Redis.from_url(redis_url)
        client.flushdb()  # the broker lost everything it had accepted
        client.set(REDIS_OWNER_KEY, "1")  # still the test suite's db (the fixture checks)
        client.close()
        assert support.broker_task_ids(redis_url) == []
        assert occurrences.filter(state=S.ENQUEUED).count() == ONE_OFFS

        worker = Worker("late", redis_url, tmp_path, ACCEPTANCE_EFFECT_FILE=str(effects))
        try:
            support.wait_until(
                lambda: occurrences.filter(state=S.SUCCEEDED).count() == ONE_OFFS,
                timeout=TIMEOUT + 60,
                what=f"every occurrence SUCCEEDED\n{support.tail(logs[0])}\n{worker.output()}",
            )
            time.sleep(3)  # a second run, if any, would land in here
        finally:
            worker.stop()

    runs = Counter(line.split()[0] for line in effects.read_text().splitlines())
    assert runs == dict.fromkeys(ids, 1), runs
    counts = dict(OutboxEntry.objects.filter(occurrence__in=occurrences).values_list(
        "occurrence_id", "publish_count"))  # fmt: skip
    assert all(n >= 2 for n in counts.values()), counts  # published again, same id
    # Each re-publish was done by exactly one beat: the beats' logs add up to the re-sends.
    requeued = sum(int(n) for log in logs for n in REQUEUED.findall(log.read_text()))
    assert requeued == sum(n - 1 for n in counts.values()), (requeued, counts)
    assert Attempt.objects.filter(occurrence__in=occurrences).count() == ONE_OFFS
