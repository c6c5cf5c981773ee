"""One heartbeat thread per worker process renews every lease its runs hold.

A run no longer starts (and joins) a thread of its own: the thread is started at the
process's first run and renews each held lease every third of it, stops renewing a lease
once its run lets go (no renewal in flight after ``stop()`` returns) and marks a run whose
token went stale as lost.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery
from django.db import connection
from django.db.models import F

from celery_scheduler.core.clock import SYSTEM_CLOCK, FrozenClock
from django_app.models import Attempt, Occurrence
from django_app.tasks import execute
from django_app.worker import claim, heartbeat
from tests.integration.worker_support import make_occurrence, make_schedule

app = Celery("heartbeat-tests", set_as_current=False)


@app.task(name="tests.heartbeat.noop")
def noop() -> int:
    return 1


def _wait(condition: Callable[[], Any], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.mark.django_db
def test_runs_start_no_thread_of_their_own(
    tenant: Any, frozen_clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[str] = []
    real_start = threading.Thread.start

    def counting_start(self: threading.Thread) -> None:
        started.append(self.name)
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", counting_start)
    for _ in range(3):
        occ = make_occurrence(
            make_schedule(tenant, task="tests.heartbeat.noop"), frozen_clock.now()
        )
        outcome = execute(
            app, str(occ.id), "tests.heartbeat.noop", [], {}, worker_name="w",
            clock=frozen_clock, lease=timedelta(seconds=30),
        )  # fmt: skip
        assert outcome["outcome"] == "SUCCEEDED"
    assert len(started) <= 1, started  # the process's one thread, if no earlier run started it


def _lease(occ: Occurrence) -> Any:
    return Occurrence.objects.values_list("lease_expires_at", flat=True).get(pk=occ.pk)


@pytest.mark.skipif(connection.vendor == "sqlite", reason="a second connection renews the lease")
@pytest.mark.django_db(transaction=True)
def test_each_held_lease_is_renewed_until_its_run_lets_go(tenant: Any) -> None:
    lease = timedelta(seconds=0.6)  # renewed every 0.2 s
    first, second = (make_occurrence(make_schedule(tenant), SYSTEM_CLOCK.now()) for _ in "ab")
    held = []
    for occ in (first, second):
        token = claim.claim(occ.id, worker="w", lease=lease).fencing_token
        assert token is not None
        held.append(heartbeat.hold(str(occ.id), token, lease, SYSTEM_CLOCK, holds_slot=False))
    try:
        _wait(
            lambda: Attempt.objects.filter(heartbeat_at__isnull=False).count() == 2,
            "both leases renewed by the one thread",
        )
        held[0].stop()
        stopped_at = _lease(first)
        renewed = _lease(second)
        _wait(lambda: _lease(second) > renewed, "the second lease renewed again")
        _wait(lambda: _lease(second) > renewed + timedelta(seconds=0.3), "and again")
        assert _lease(first) == stopped_at  # nothing after stop() returned
        assert not held[0].lost
        # Another attempt took the second run over: its token is stale now.
        Occurrence.objects.filter(pk=second.pk).update(fencing_token=F("fencing_token") + 1)
        _wait(lambda: held[1].lost, "the stale lease reported lost")
    finally:
        for one in held:
            one.stop()
