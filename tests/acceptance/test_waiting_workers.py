"""Two schedules in a group of limit 1, bodies longer than their interval, real workers.

The README's bound: a waiter gets a slot within (waiters ahead of it + 1) x the group's
longest body + the deferral interval. Every run of both schedules is checked against it,
and the runs must start in ``scheduled_for`` order (no waiter passed by a later one).
Before waiting in order, freed slots went to whichever deferred message came back first,
and one schedule's runs could be passed again and again (chaos seed 2359631).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_scheduler.core.clock import SYSTEM_CLOCK
from celery_scheduler.core.enums import OccurrenceState as S
from django_app.models import Attempt, Occurrence
from django_app.worker import claim
from tests.acceptance.worker_harness import pumping, wait_until, workers
from tests.conftest import database_family
from tests.integration.worker_support import make_occurrence, make_schedule

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.concurrent_db,
    pytest.mark.redis,
    pytest.mark.django_db(transaction=True),
]
BODY = 3.5  # seconds: longer than the interval
INTERVAL = 2.0
ROUNDS = 4
#: Latency the bound does not name: the in-test relay polls every 0.1 s, a worker picks the
#: message up and claims it, on a machine shared with other test runs.
TOLERANCE = 1.0


@pytest.fixture(scope="module")
def waiting_broker(
    django_db_setup: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    if database_family() == "sqlite":
        pytest.skip("needs a concurrent database: PostgreSQL or MySQL/MariaDB")
    broker = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
    with workers(broker, tmp_path_factory.mktemp("waiting"), ["q1", "q2"]):
        yield broker


def test_every_run_of_two_schedules_sharing_one_slot_is_within_the_waiting_bound(
    tenant: Any, waiting_broker: str, tmp_path: Path
) -> None:
    group = {"concurrency_limit": 1, "concurrency_group": "one-slot"}
    a, b = (
        make_schedule(tenant, task="acceptance.sleepy", kwargs={"seconds": BODY}, **group)
        for _ in range(2)
    )
    occs: list[Occurrence] = []
    with pumping(waiting_broker):
        # The beat's part, in real time: each schedule fires every INTERVAL, b half a step
        # after a.
        for _ in range(ROUNDS):
            for schedule in (a, b):
                occs.append(make_occurrence(schedule, SYSTEM_CLOCK.now(), sent=False))
                time.sleep(INTERVAL / 2)
        ids = [o.pk for o in occs]
        wait_until(
            lambda: Occurrence.objects.filter(pk__in=ids, state=S.SUCCEEDED).count() == len(ids),
            timeout=30 + len(ids) * (BODY + 2),
            what="every run of both schedules succeeded",
        )
    rows = {o.pk: o for o in Occurrence.objects.filter(pk__in=ids)}
    attempts = {at.occurrence_id: at for at in Attempt.objects.filter(occurrence_id__in=ids)}
    assert len(attempts) == len(ids)  # waiting is not a try: one attempt each
    longest = max(
        (at.finished_at - at.started_at).total_seconds()
        for at in attempts.values()
        if at.finished_at is not None
    )
    by_time = sorted(rows.values(), key=lambda o: (o.scheduled_for, o.pk))
    late = []
    for occ in by_time:
        arrived = occ.scheduled_for
        ahead = sum(
            1
            for other in by_time
            if (other.scheduled_for, other.pk) < (arrived, occ.pk)
            and attempts[other.pk].started_at > arrived
        )
        waited = (attempts[occ.pk].started_at - arrived).total_seconds()
        bound = (ahead + 1) * longest + claim.DEFER.total_seconds() + TOLERANCE
        if waited > bound:
            late.append(
                f"{'ab'[occ.schedule_id == b.pk]} {arrived:%H:%M:%S.%f} waited {waited:.2f} s"
                f" > bound {bound:.2f} s ({ahead} ahead, longest body {longest:.2f} s)"
            )
    assert not late, "\n".join(late)
    started = sorted(by_time, key=lambda o: attempts[o.pk].started_at)
    assert [o.pk for o in started] == [o.pk for o in by_time], "a waiter was passed"
    assert {o.schedule_id for o in started[:4]} == {a.pk, b.pk}
    assert longest >= BODY
