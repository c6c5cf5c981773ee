"""A worker paused past its lease (SIGSTOP) loses to a second worker; its late completion
is rejected by the fencing token and cannot overwrite the newer attempt's state."""

from __future__ import annotations

import signal
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from celery_scheduler.core.clock import SYSTEM_CLOCK
from celery_scheduler.core.enums import AttemptOutcome, ScheduleState
from celery_scheduler.core.enums import OccurrenceState as S
from django_app.models import Attempt, Occurrence
from tests.acceptance.worker_harness import Worker, pumping, wait_until, workers
from tests.integration.worker_support import make_occurrence, make_schedule

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.concurrent_db,
    pytest.mark.redis,
    pytest.mark.django_db(transaction=True),
]


def test_stalled_worker_completion_is_rejected(tenant: Any, redis_url: str, tmp_path: Path) -> None:
    schedule = make_schedule(tenant, task="acceptance.sleepy", kwargs={"seconds": 4})
    occ = make_occurrence(schedule, SYSTEM_CLOCK.now() - timedelta(seconds=1), sent=False)
    assert schedule.state == ScheduleState.ACTIVE
    with pumping(redis_url), workers(redis_url, tmp_path, ["stalled"]) as (stalled,):
        wait_until(
            lambda: Occurrence.objects.filter(pk=occ.pk, state=S.RUNNING).exists(),
            timeout=20,
            what="first claim",
        )
        stalled.signal(signal.SIGSTOP)  # a GC pause / frozen VM longer than the lease
        # Started now, it can only get the occurrence once the reaper republishes it.
        healthy = Worker("healthy", redis_url, tmp_path)
        try:
            wait_until(
                lambda: Attempt.objects.filter(
                    occurrence=occ, outcome=AttemptOutcome.LOST
                ).exists(),
                timeout=20,
                what="lease expiry reaped",
            )
            healthy.wait_ready()
            wait_until(
                lambda: Occurrence.objects.filter(pk=occ.pk, state=S.SUCCEEDED).exists(),
                timeout=30,
                what="second attempt succeeded",
            )
            stalled.signal(signal.SIGCONT)
            wait_until(lambda: "rejected" in stalled.output(), timeout=20, what="stale completion")
        finally:
            healthy.stop()
    row = Occurrence.objects.get(pk=occ.pk)
    assert (row.state, row.fencing_token) == (S.SUCCEEDED, 2)
    assert row.result == {"pid": healthy.pid}
    attempts = list(Attempt.objects.filter(occurrence=occ).order_by("number"))
    assert [(a.fencing_token, a.outcome) for a in attempts] == [
        (1, AttemptOutcome.LOST),
        (2, AttemptOutcome.SUCCEEDED),
    ]
    assert attempts[0].worker.startswith("stalled@")
    assert attempts[1].worker.startswith("healthy@")
    assert "completion of occurrence" in stalled.output()
    assert "under fencing token 1 rejected" not in row.last_error  # nothing overwritten
