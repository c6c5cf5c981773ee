"""A worker whose claim committed but whose reply it never read still runs the body, once.

Real worker process (``-P solo``) on PostgreSQL + Redis. The worker's first claim commits
and the worker then sees the driver's error instead of the reply
(``ACCEPTANCE_LOSE_CLAIM_REPLY``, :mod:`tests.acceptance.worker_tasks`): for it nothing is
claimed, so it re-sends the message through the broker, while the database holds the run
as RUNNING under its name. The schedule allows one attempt. Before the copy could take the
claim back it was a duplicate, the lease lapsed, and the reaper dead-lettered a run that
never ran.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from celery_scheduler.core.clock import SYSTEM_CLOCK
from celery_scheduler.core.enums import AttemptOutcome
from celery_scheduler.core.enums import OccurrenceState as S
from django_app.models import Attempt, Occurrence
from tests.acceptance.worker_harness import LEASE_SECONDS, pumping, wait_until, workers
from tests.integration.worker_support import make_occurrence, make_schedule

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.django_db(transaction=True),
]


def test_a_lost_claim_reply_neither_spends_the_attempt_nor_skips_the_run(
    tenant: Any, redis_url: str, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.txt"
    schedule = make_schedule(tenant, task="acceptance.effect", max_attempts=1)
    occ = make_occurrence(schedule, SYSTEM_CLOCK.now() - timedelta(seconds=1), sent=False)
    env = {"ACCEPTANCE_EFFECT_FILE": str(effects), "ACCEPTANCE_LOSE_CLAIM_REPLY": "1"}
    with pumping(redis_url), workers(redis_url, tmp_path, ["r1"], **env) as (w,):
        wait_until(
            lambda: Occurrence.objects.filter(pk=occ.pk, state__in=[S.SUCCEEDED, S.DEAD]).exists(),
            timeout=30,
            what=f"the run settled\n{w.output()[-3000:]}",
        )
        time.sleep(LEASE_SECONDS + 2)  # a second run, reaped and re-run, would land in here
        output = w.output()
    row = Occurrence.objects.get(pk=occ.pk)
    runs = effects.read_text().splitlines() if effects.exists() else []
    assert (row.state, len(runs)) == (S.SUCCEEDED, 1), f"{row.state}\n{output[-3000:]}"
    assert "deferred" in output  # the reply was lost, the copy re-sent
    attempts = list(Attempt.objects.filter(occurrence=occ).values_list("number", "outcome"))
    assert attempts == [(1, AttemptOutcome.SUCCEEDED)]
    assert row.fencing_token == 1
