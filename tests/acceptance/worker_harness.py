"""Real Celery workers for the worker-side acceptance tests, and an in-test relay pump.

Workers are ``celery -A example_project worker -P solo`` subprocesses on the pytest-django
test database (PostgreSQL) and the test's Redis database, with a short occurrence lease so
lease expiry happens within seconds. They also import :mod:`tests.acceptance.worker_tasks`.
The pump stands in for the beat loop: it runs the real relay (``relay_due``) and
``reap_expired`` every 100 ms from a thread of the test process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .support import database_url, wait_until

ROOT = Path(__file__).resolve().parents[2]
LEASE_SECONDS = 2


class Worker:
    def __init__(self, name: str, broker_url: str, log_dir: Path, **env: str) -> None:
        self.name = name
        self.log = log_dir / f"{name}.log"
        full_env = {k: v for k, v in os.environ.items() if k != "CELERY_SCHEDULER_FAULT"}
        full_env.update(
            DATABASE_URL=database_url(),
            CELERY_BROKER_URL=broker_url,
            DJANGO_SETTINGS_MODULE="example_project.settings",
            CELERY_SCHEDULER_OCCURRENCE_LEASE=str(LEASE_SECONDS),
            PYTHONUNBUFFERED="1",
        )
        full_env.update(env)
        # prefetch 1: a SIGKILLed worker must not take unstarted messages down with it.
        log = self.log.open("ab")
        self.process = subprocess.Popen(
            [
                sys.executable, "-m", "celery", "-A", "example_project", "worker",
                "-P", "solo", "-n", f"{name}@%h", "--loglevel", "INFO",
                "--prefetch-multiplier", "1", "-I", "tests.acceptance.worker_tasks",
                "--without-gossip", "--without-mingle", "--without-heartbeat",
            ],
            cwd=ROOT, env=full_env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        log.close()  # the child has its own descriptor

    @property
    def pid(self) -> int:
        return self.process.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_ready(self, timeout: float = 30) -> None:
        wait_until(lambda: " ready." in self.output(), timeout=timeout, what=f"{self.name} ready")

    def signal(self, sig: signal.Signals) -> None:
        os.kill(self.process.pid, sig)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


@contextmanager
def workers(broker_url: str, log_dir: Path, names: list[str], **env: str) -> Iterator[list[Worker]]:
    started = [Worker(name, broker_url, log_dir, **env) for name in names]
    try:
        for w in started:
            w.wait_ready()
        yield started
    finally:
        for w in started:
            w.stop()


class Pump(threading.Thread):
    """Relay due outbox rows and reap expired leases until stopped (the beat loop's job)."""

    def __init__(self, broker_url: str) -> None:
        super().__init__(name="pump", daemon=True)
        from celery import Celery

        from celery_scheduler.publishers.celery import CeleryPublisher

        self.app = Celery("pump", broker=broker_url, set_as_current=False)
        self.publisher = CeleryPublisher(self.app)
        self.errors: list[BaseException] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        from django.db import connection

        from celery_scheduler.core.clock import SYSTEM_CLOCK
        from django_app.relay.batch import relay_due
        from django_app.worker import finish

        try:
            while not self._stop_event.wait(0.1):
                relay_due(clock=SYSTEM_CLOCK, publisher=self.publisher)
                finish.reap_expired(clock=SYSTEM_CLOCK)
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            connection.close()

    def send_duplicate(self, kwargs: dict[str, Any]) -> None:
        """A redelivery of an occurrence's message (same task id), as at-least-once allows."""
        self.app.send_task(
            "celery_scheduler.run_occurrence", task_id=kwargs["occurrence_id"], kwargs=kwargs
        )

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=10)
        self.app.close()
        if self.errors:
            raise self.errors[0]


@contextmanager
def pumping(broker_url: str) -> Iterator[Pump]:
    pump = Pump(broker_url)
    pump.start()
    try:
        yield pump
    finally:
        pump.stop()
