"""A real Celery worker (subprocess) consumes fast-path messages and runs the occurrences.

The example project's worker runs ``celery_scheduler.run_occurrence``, which claims each
occurrence in the test's PostgreSQL database, runs ``billing.ping`` and completes it: the
occurrences reaching SUCCEEDED with one attempt each proves the worker decoded our bytes
(envelope, base64 body, protocol-2 headers, kwargs) exactly as it decodes kombu's.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_scheduler.core.enums import OccurrenceState
from celery_scheduler.publishers import OccurrenceMessage
from celery_scheduler.publishers.redis_fast import RedisFastPublisher
from tests.acceptance import support
from tests.integration.worker_support import make_occurrence, make_schedule

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.acceptance]


@pytest.mark.django_db(transaction=True)
def test_real_worker_runs_occurrences_published_by_the_fast_path(
    redis_url: str, tenant: Any, tmp_path: Path
) -> None:
    from django_app.models import Attempt, Occurrence

    schedule = make_schedule(tenant, task="billing.ping", args=["fast-path"])
    base = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1)
    occurrences = [make_occurrence(schedule, base + timedelta(seconds=i)) for i in range(3)]
    messages = [
        OccurrenceMessage.from_occurrence(occ, schedule, tenant=tenant.slug) for occ in occurrences
    ]
    app = Celery("fast-path-publisher", broker=redis_url, set_as_current=False)
    try:
        RedisFastPublisher(app).publish(messages)
    finally:
        app.close()
    assert len(support.broker_task_ids(redis_url)) == 3

    log = tmp_path / "worker.log"
    ids = [occ.id for occ in occurrences]
    with log.open("ab") as out:
        worker = subprocess.Popen(
            [
                sys.executable, "-m", "celery", "-A", "example_project", "worker",
                "-P", "solo", "-n", "fastpath@%h", "-Q", "celery", "--loglevel", "INFO",
                "--without-gossip", "--without-mingle", "--without-heartbeat",
            ],
            cwd=support.ROOT, env=support.process_env(redis_url), stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    with support.running(worker):
        try:
            support.wait_until(
                lambda: (
                    Occurrence.objects.filter(
                        id__in=ids, state=OccurrenceState.SUCCEEDED.value
                    ).count()
                    == 3
                ),
                timeout=60,
                what="the worker to run all three occurrences",
            )
        except AssertionError:
            raise AssertionError(support.tail(log)) from None

    assert support.broker_task_ids(redis_url) == []
    assert Attempt.objects.filter(occurrence_id__in=ids).count() == 3
    text = log.read_text()
    for occ in occurrences:
        # The worker names the user's task (the message's shadow name), not the wrapper.
        assert f"{occ.schedule.task}[{occ.id}]" in text
        assert f"celery_scheduler.run_occurrence[{occ.id}]" not in text
