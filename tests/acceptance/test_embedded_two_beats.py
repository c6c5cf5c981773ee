"""Two beats on the embedded default (SQLite + the SQLite-backed broker): no duplicates.

Real processes: two ``celery beat`` and one worker share one SQLite file and one broker file.
Every scheduled time becomes one occurrence (the unique constraint), each outbox row is
published once, and each occurrence runs once. Only in the SQLite pass.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.acceptance import support
from tests.acceptance.support import ROOT, stop, tail, wait_until

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.timeout(180),
    support.embedded_pass_only,
]

SCRIPT = """
import django, sys
django.setup()
from datetime import timedelta
from celery_scheduler import api
from celery_scheduler.core.clock import SYSTEM_CLOCK
start = SYSTEM_CLOCK.now() + timedelta(seconds=6)
for i in range(3):
    api.create_schedule(name=f"every 2 s #{i}", task="billing.ping", interval=2, start_at=start)
print(start.isoformat())
"""

COUNTS = """
import django, json
django.setup()
from django.db.models import Count
from django_app.models import Attempt, Occurrence, OutboxEntry
print(json.dumps({
    "succeeded": Occurrence.objects.filter(state="SUCCEEDED").count(),
    "per_time": max([r["n"] for r in Occurrence.objects.values("schedule_id", "scheduled_for")
                     .annotate(n=Count("id"))] or [0]),
    "publishes": sorted(set(OutboxEntry.objects.exclude(sent_at=None)
                            .values_list("publish_count", flat=True))),
    "attempts": max([r["n"] for r in Attempt.objects.values("occurrence_id")
                     .annotate(n=Count("id"))] or [0]),
}))
"""


def python(code: str, env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_two_beats_on_sqlite_publish_each_occurrence_once(tmp_path: Path) -> None:
    import json

    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "CELERY_"))}
    env.update(
        CELERY_SCHEDULER_DATA_DIR=str(tmp_path),
        DJANGO_SETTINGS_MODULE="example_project.settings",
        PYTHONUNBUFFERED="1",
    )
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True,
        timeout=120,
    )  # fmt: skip
    python(SCRIPT, env)
    celery = [sys.executable, "-m", "celery", "-A", "example_project"]
    commands = {
        "beat-a": [*celery, "beat", "--loglevel", "INFO", "-s", str(tmp_path / "a")],
        "beat-b": [*celery, "beat", "--loglevel", "INFO", "-s", str(tmp_path / "b")],
        "worker": [*celery, "worker", "-P", "solo", "--loglevel", "INFO",
                   "--without-gossip", "--without-mingle", "--without-heartbeat"],
    }  # fmt: skip
    logs = {name: (tmp_path / f"{name}.log").open("wb") for name in commands}
    processes = {
        name: subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=logs[name], stderr=-2)
        for name, cmd in commands.items()
    }
    try:

        def enough() -> bool:
            return json.loads(python(COUNTS, env))["succeeded"] >= 15

        try:
            wait_until(enough, timeout=90, interval=1, what="15 runs")
        except AssertionError:
            pytest.fail("\n".join(f"{n}:\n{tail(tmp_path / f'{n}.log')}" for n in commands))
    finally:
        for process in processes.values():
            stop(process, timeout=20)
        for log in logs.values():
            log.close()
    counts = json.loads(python(COUNTS, env))
    assert counts["per_time"] == 1  # one occurrence per scheduled time
    assert counts["publishes"] == [1]  # each outbox row published once
    assert counts["attempts"] == 1  # each occurrence ran once
    beat_logs = [(tmp_path / f"{n}.log").read_text() for n in ("beat-a", "beat-b")]
    assert not any("Traceback" in text for text in beat_logs), beat_logs
