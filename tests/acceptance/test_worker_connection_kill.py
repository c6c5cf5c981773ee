"""A worker whose database connection is killed (``pg_terminate_backend``) at each step of its
path still runs the body once and settles the occurrence promptly.

Real worker process on PostgreSQL + Redis; the test process kills the worker's backends from
its own connection, picking them out by ``application_name`` (``PGAPPNAME`` of the worker):

- claim: the claim is held on a schedule row lock the test takes, and its backend is killed
  while it waits;
- heartbeat: after the first renewal, every backend of the worker but the body's (the
  heartbeat thread's own connection) is killed while the body runs;
- completion: the body's (main thread) connection, which the completion write reuses, is
  killed while the body runs; either the completion write is the first statement to meet the
  dead connection, or the body met it first (a best-effort read it tolerates), which leaves
  Django's connection object broken but not closed: every later transaction on it failed
  ("can't change 'autocommit' now") until the worker closes and reconnects;
- failure: the same, but the body's read fails the body, so the write to settle is the
  failure (a retry): it must be recorded at once, not left RUNNING until the lease expires.

The effect is an append to a file (never rolled back): a second run would show as a second
line. The lease is short, so an outcome write that gave up would be reaped and re-run (two
effects) within the test's window instead of after the default 300 s.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection

from celery_scheduler.core.clock import SYSTEM_CLOCK
from celery_scheduler.core.enums import AttemptOutcome
from celery_scheduler.core.enums import OccurrenceState as S
from django_app.models import Attempt, Occurrence
from tests.acceptance.support import database_url
from tests.acceptance.worker_harness import pumping, wait_until, workers
from tests.integration.worker_support import make_occurrence, make_schedule

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.django_db(transaction=True),
]
APP = "cs-connection-kill-worker"
LEASE = 3  # seconds: heartbeat every second; a write that gave up is reaped after this
BODY = 4.0  # seconds the body runs (kills land while it does)
#: After the body ends, the occurrence must be SUCCEEDED within this (the fix's retries).
PROMPT = 8.0
#: Quiet period after success in which no second run may appear (longer than the lease).
SETTLE = LEASE + 3


def worker_backends() -> list[tuple[int, str | None]]:
    """(pid, wait_event_type) of every backend the worker process holds."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, wait_event_type FROM pg_stat_activity "
            "WHERE application_name = %s AND datname = current_database()",
            [APP],
        )
        return list(cursor.fetchall())


def terminate(pids: list[int]) -> None:
    with connection.cursor() as cursor:
        for pid in pids:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])


def body_backend(path: Path) -> int | None:
    lines = path.read_text().split() if path.exists() else []
    return int(lines[0]) if lines else None


@pytest.mark.parametrize(
    ("step", "read"),
    [
        ("claim", ""),
        ("heartbeat", ""),
        ("completion", ""),
        ("completion", "guarded"),
        ("failure", "before"),
    ],
)
def test_connection_killed_at_each_worker_step_runs_once(
    step: str, read: str, tenant: Any, redis_url: str, tmp_path: Path
) -> None:
    effects, backend_file = tmp_path / "effects.txt", tmp_path / "backend.txt"
    kwargs = {"seconds": BODY, "read": read}
    schedule = make_schedule(tenant, task="acceptance.effect", kwargs=kwargs)
    occ = make_occurrence(schedule, SYSTEM_CLOCK.now() - timedelta(seconds=1), sent=False)
    env = {
        "PGAPPNAME": APP,
        "ACCEPTANCE_EFFECT_FILE": str(effects),
        "ACCEPTANCE_BACKEND_FILE": str(backend_file),
        "CELERY_SCHEDULER_OCCURRENCE_LEASE": str(LEASE),
    }
    holder = None
    if step == "claim":  # the claim will wait on this lock; its backend is killed there
        holder = psycopg.connect(database_url())
        holder.execute("SELECT 1 FROM django_app_schedule WHERE id = %s FOR UPDATE", [schedule.pk])
    try:
        with pumping(redis_url), workers(redis_url, tmp_path, ["k1"], **env) as (w,):
            if step == "claim":
                waiting = wait_until(
                    lambda: [pid for pid, wait in worker_backends() if wait == "Lock"],
                    timeout=30,
                    what="the claim waiting on the schedule row lock",
                )
                terminate(waiting)
                assert holder is not None
                holder.rollback()
            else:
                main = wait_until(lambda: body_backend(backend_file), timeout=30, what="body")
                if step == "heartbeat":
                    wait_until(
                        lambda: Attempt.objects.filter(
                            occurrence=occ, heartbeat_at__isnull=False
                        ).exists(),
                        timeout=10,
                        what="first heartbeat",
                    )
                    others = [pid for pid, _ in worker_backends() if pid != main]
                    assert others, "the heartbeat holds no connection of its own"
                    terminate(others)
                else:
                    terminate([main])
            killed_at = time.monotonic()
            wait_until(
                lambda: Occurrence.objects.filter(pk=occ.pk, state=S.SUCCEEDED).exists(),
                timeout=BODY + PROMPT + 30,
                what=f"SUCCEEDED after the kill\n{w.output()[-3000:]}",
            )
            settled_in = time.monotonic() - killed_at
            time.sleep(SETTLE)  # a lost outcome would be reaped and run again in here
            output = w.output()
    finally:
        if holder is not None:
            holder.close()

    runs = effects.read_text().splitlines()
    assert runs == [f"{occ.pk} {w.pid}"], f"{len(runs)} business effects:\n{output[-3000:]}"
    print(f"{step}/{read or '-'}: SUCCEEDED {settled_in:.1f} s after the kill, {len(runs)} effect")
    assert settled_in <= BODY + PROMPT, f"SUCCEEDED {settled_in:.1f} s after the kill"
    attempts = list(
        Attempt.objects.filter(occurrence=occ).order_by("number").values_list("outcome", flat=True)
    )
    if step == "failure":  # recorded as a retry at once, not LOST after the lease
        assert attempts == [AttemptOutcome.RETRY, AttemptOutcome.SUCCEEDED], attempts
    else:
        assert attempts == [AttemptOutcome.SUCCEEDED], attempts
    assert Occurrence.objects.get(pk=occ.pk).state == S.SUCCEEDED
