"""SIGKILL at the materializer's fault points, then restart: nothing lost, nothing doubled.

A real child process runs ``materialize_due`` against the test database with
``CELERY_SCHEDULER_FAULT`` armed and kills itself at that point; the test then inspects
what was committed and lets a fresh process finish. The reconciler is the judge.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.db import connection

from celery_scheduler import api
from celery_scheduler.core.clock import FrozenClock
from django_app.models import Occurrence, OutboxEntry, ScheduleCursor
from django_app.operations.reconcile import reconcile
from tests.acceptance.support import database_url as acceptance_database_url

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.django_db(transaction=True)

CHILD = """
import json, sys
from datetime import datetime, timedelta
import django
django.setup()
from celery_scheduler.core.clock import FrozenClock
from django_app.wiring import materialize_due
report = materialize_due(clock=FrozenClock(datetime.fromisoformat(sys.argv[1])),
                         horizon=timedelta(0), batch_size=2)
print(json.dumps(report.__dict__))
"""


def database_url() -> str:
    params = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{params['NAME']}"
    return acceptance_database_url()


def run_child(
    at: datetime, fault: str | None, *, bulk: bool = False
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CELERY_SCHEDULER_FAULT"}
    env.update(DATABASE_URL=database_url(), DJANGO_SETTINGS_MODULE="example_project.settings")
    env["CELERY_SCHEDULER_BULK_MATERIALIZE"] = "1" if bulk else "0"
    if fault:
        env["CELERY_SCHEDULER_FAULT"] = fault
    return subprocess.run(
        [sys.executable, "-c", CHILD, at.isoformat()],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def moved() -> int:
    return ScheduleCursor.objects.exclude(next_run_at=NOW).count()


@pytest.mark.parametrize(
    ("fault", "schedules_committed"),
    [
        ("materialize.before_insert", 0),
        ("materialize.before_insert:3", 2),
        ("materialize.after_commit", 1),
        ("materialize.after_commit:3", 3),
    ],
)
def test_sigkill_then_restart_recovers_exactly_the_expected_set(
    fault: str, schedules_committed: int
) -> None:
    """Per-schedule path: each fault point is hit once per schedule (one transaction each)."""
    sigkill_then_restart(fault, schedules_committed, bulk=False)


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("fault", "schedules_committed"),
    [
        ("materialize.before_insert", 0),
        ("materialize.before_insert:2", 2),
        ("materialize.after_commit", 2),
        ("materialize.after_commit:2", 4),
    ],
)
def test_bulk_path_sigkill_then_restart_recovers_exactly_the_expected_set(
    fault: str, schedules_committed: int
) -> None:
    """Set-based path: each fault point is hit once per batch (2 schedules here), so a kill
    leaves whole batches committed or nothing of them."""
    sigkill_then_restart(fault, schedules_committed, bulk=True)


def sigkill_then_restart(fault: str, schedules_committed: int, *, bulk: bool) -> None:
    clock = FrozenClock(NOW)
    for n in range(4):
        api.create_schedule(name=f"s{n}", task="billing.ping", cron="* * * * *", clock=clock)
    later = NOW + 3 * MINUTE  # the node comes up three minutes in: four fire times each

    killed = run_child(later, fault, bulk=bulk)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert killed.stdout == ""  # it died before reporting
    # Exactly the transactions that committed before the kill are visible; nothing partial.
    assert moved() == schedules_committed
    assert Occurrence.objects.count() == 4 * schedules_committed
    assert OutboxEntry.objects.count() == 4 * schedules_committed

    restarted = run_child(later, None, bulk=bulk)
    assert restarted.returncode == 0, restarted.stderr
    report = json.loads(restarted.stdout)
    assert report["occurrences_created"] == 4 * (4 - schedules_committed)
    assert report["stale_cursor"] == 0

    keys = Counter(
        Occurrence.objects.values_list("schedule_id", "schedule_version", "scheduled_for")
    )
    assert len(keys) == 16
    assert set(keys.values()) == {1}
    assert OutboxEntry.objects.count() == 16
    verdict = reconcile(start=NOW, end=later + MINUTE, now=later)
    assert verdict.ok
    assert verdict.counts == {"pending": 16, "unexpected": 0}


def test_unknown_fault_name_is_refused() -> None:
    api.create_schedule(name="s", task="billing.ping", cron="* * * * *", clock=FrozenClock(NOW))
    result = run_child(NOW, "materialize.nowhere")
    assert result.returncode == 1
    assert "names no fault point" in result.stderr
