"""Failures are visible where Celery users look (issue 11 item 2).

A real worker with events on (``-E``), a real beat, PostgreSQL + Redis, and Celery's own event
receiver: a scheduled run appears under the user's task name (the shadow name), a task that
raised is a FAILURE to Celery with its exception (what Sentry's Celery integration and
``task_failure`` handlers see), while the scheduler still records DEAD and keeps the whole
traceback on the attempt.
"""

from __future__ import annotations

import sys
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance import support, worker_tasks

assert worker_tasks.fails.name == "acceptance.fails"  # registered here too, for validation

pytestmark = [pytest.mark.acceptance, pytest.mark.postgres, pytest.mark.timeout(180)]


class EventLog(threading.Thread):
    """Celery's own event receiver, in a thread, until :meth:`close`."""

    def __init__(self, broker_url: str) -> None:
        super().__init__(daemon=True)
        self.broker_url = broker_url
        self.events: list[dict[str, Any]] = []
        self.receiver: Any = None

    def run(self) -> None:
        from celery import Celery

        app = Celery("events-test", broker=self.broker_url, set_as_current=False)
        with app.connection_for_read() as connection:
            self.receiver = app.events.Receiver(connection, handlers={"*": self.events.append})
            self.receiver.capture(limit=None, timeout=None, wakeup=False)

    def close(self) -> None:
        if self.receiver is not None:
            self.receiver.should_stop = True  # the capture loop checks it every second
        self.join(timeout=10)


@pytest.mark.django_db(transaction=True)
def test_a_failed_run_is_a_celery_failure_under_the_users_task_name(
    redis_url: str, tmp_path: Path
) -> None:
    import subprocess

    from celery_scheduler import api
    from celery_scheduler.core.clock import SYSTEM_CLOCK
    from django_app.models import Attempt, Occurrence

    listener = EventLog(redis_url)
    listener.start()
    events = listener.events
    env = support.process_env(redis_url)
    log = (tmp_path / "worker.log").open("ab")
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "example_project", "worker", "-E", "-P", "solo",
         "-I", "tests.acceptance.worker_tasks", "-n", "events@%h", "--loglevel", "INFO",
         "--without-gossip", "--without-mingle"],
        cwd=support.ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    beat = support.start_beat(env, tmp_path / "beat.log")
    with support.running(beat, worker):
        run_at = SYSTEM_CLOCK.now() + timedelta(seconds=3)
        schedule = api.create_schedule(
            name="failing", task="acceptance.fails", args=[42], run_at=run_at, max_attempts=1
        )

        def failed_event() -> dict[str, Any] | None:
            return next((e for e in events if e.get("type") == "task-failed"), None)

        try:
            failure = support.wait_until(failed_event, timeout=90, what="a task-failed event")
        except AssertionError:
            pytest.fail(
                f"events: {[e.get('type') for e in events]}\n"
                + support.tail(tmp_path / "worker.log")
            )
    listener.close()
    log.close()
    occurrence = Occurrence.objects.get(schedule=schedule)
    received = [e for e in events if e.get("type") == "task-received"]
    assert [e["name"] for e in received] == ["acceptance.fails"]  # not the wrapper's name
    assert received[0]["uuid"] == str(occurrence.id)
    assert failure["uuid"] == str(occurrence.id)
    assert "ValueError" in failure["exception"]
    assert "customer 42 has no billing address" in failure["exception"]
    assert occurrence.state == "DEAD"
    attempt = Attempt.objects.get(occurrence=occurrence)
    assert "Traceback (most recent call last)" in attempt.error
    assert "customer 42 has no billing address" in attempt.error
    assert "Traceback (most recent call last)" in occurrence.last_error
    worker_log = (tmp_path / "worker.log").read_text()
    assert f"Task acceptance.fails[{occurrence.id}] raised unexpected" in worker_log
