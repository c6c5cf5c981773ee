"""Each overlap policy with a long task still running when its next triggers arrive.

Two real workers, so ALLOW can show two runs at once and the other policies are held back by
the claim-time check rather than by a lack of workers.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from celery_scheduler.core.clock import SYSTEM_CLOCK
from celery_scheduler.core.enums import OccurrenceState as S
from celery_scheduler.core.enums import OverlapPolicy
from django_app.models import Attempt, Occurrence
from tests.acceptance.worker_harness import pumping, wait_until, workers
from tests.conftest import database_family
from tests.integration.worker_support import make_occurrence, make_schedule

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.concurrent_db,
    pytest.mark.redis,
    pytest.mark.django_db(transaction=True),
]
FINAL = {S.SUCCEEDED, S.SKIPPED_OVERLAP}


@pytest.fixture(scope="module")
def overlap_broker(
    django_db_setup: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    if database_family() == "sqlite":
        pytest.skip("needs a concurrent database: PostgreSQL or MySQL/MariaDB")
    broker = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
    with workers(broker, tmp_path_factory.mktemp("overlap"), ["o1", "o2"]):
        yield broker


def attempt_of(occ: Any) -> Attempt:
    return Attempt.objects.get(occurrence=occ)


@pytest.mark.parametrize("policy", list(OverlapPolicy))
def test_long_run_overlapping_its_next_triggers(
    policy: OverlapPolicy, tenant: Any, overlap_broker: str, redis_url: str, tmp_path: Path
) -> None:
    schedule = make_schedule(
        tenant, task="acceptance.sleepy", kwargs={"seconds": 2.5}, overlap_policy=policy.value
    )
    t0 = SYSTEM_CLOCK.now() - timedelta(seconds=10)
    first = make_occurrence(schedule, t0, sent=False)
    with pumping(overlap_broker):
        wait_until(
            lambda: Occurrence.objects.filter(pk=first.pk, state=S.RUNNING).exists(),
            timeout=20,
            what="first run started",
        )
        later = [make_occurrence(schedule, t0 + timedelta(seconds=i), sent=False) for i in (1, 2)]
        occs = [first, *later]
        wait_until(
            lambda: (
                Occurrence.objects.filter(pk__in=[o.pk for o in occs], state__in=FINAL).count() == 3
            ),
            timeout=30,
            what=f"all three settled under {policy}",
        )
    states = [Occurrence.objects.get(pk=o.pk).state for o in occs]
    first_row = Occurrence.objects.get(pk=first.pk)
    assert first_row.state == S.SUCCEEDED
    assert first_row.finished_at is not None
    if policy is OverlapPolicy.ALLOW:
        assert states == [S.SUCCEEDED] * 3
        overlapping = [o for o in later if attempt_of(o).started_at < first_row.finished_at]
        assert overlapping, "ALLOW should have run a next trigger while the first still ran"
    elif policy is OverlapPolicy.SKIP_IF_RUNNING:
        assert states == [S.SUCCEEDED, S.SKIPPED_OVERLAP, S.SKIPPED_OVERLAP]
        assert not Attempt.objects.filter(occurrence__in=later).exists()
    else:
        assert sorted(states[1:]) == [S.SKIPPED_OVERLAP, S.SUCCEEDED]
        queued = next(o for o, s in zip(later, states[1:], strict=True) if s == S.SUCCEEDED)
        assert attempt_of(queued).started_at >= first_row.finished_at
