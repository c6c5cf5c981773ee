"""Helpers for acceptance tests that run real beat/worker processes.

The subprocesses use the example project's settings pointed at the *test* database that
pytest-django created (``DATABASE_URL`` built from the live connection), and at a Redis
database of the test's own, so they see exactly what the test sees.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import database_family

ROOT = Path(__file__).resolve().parents[2]

#: For a test of the embedded default itself (SQLite, made by the process it starts, whatever
#: the pass's DATABASE_URL): it gives the same result in every pass, so it runs in one.
embedded_pass_only = pytest.mark.skipif(
    database_family() != "sqlite",
    reason="the embedded default is SQLite: runs once, in the SQLite pass",
)


def database_url() -> str:
    """A DATABASE_URL for the database the test process is connected to."""
    from django.db import connection

    params = connection.settings_dict
    host = params.get("HOST") or "127.0.0.1"
    password = f":{params['PASSWORD']}" if params.get("PASSWORD") else ""
    if connection.vendor == "postgresql":
        user = params.get("USER") or "postgres"
        return f"postgres://{user}{password}@{host}:{params.get('PORT') or 5432}/{params['NAME']}"
    if connection.vendor == "mysql":
        user = params.get("USER") or "root"
        return f"mysql://{user}{password}@{host}:{params.get('PORT') or 3306}/{params['NAME']}"
    raise RuntimeError("acceptance tests with subprocesses need PostgreSQL or MySQL/MariaDB")


def process_env(broker_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CELERY_SCHEDULER_FAULT")}
    env.update(
        DATABASE_URL=database_url(),
        CELERY_BROKER_URL=broker_url,
        DJANGO_SETTINGS_MODULE="example_project.settings",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def start_beat(
    env: dict[str, str],
    log_path: Path,
    *,
    fault: str | None = None,
    fault_signal: str | None = None,
) -> subprocess.Popen[bytes]:
    """``celery beat`` with our DatabaseScheduler; ``fault`` arms a named fault point, which
    sends SIGKILL, or ``fault_signal`` ("STOP", "TERM") instead."""
    env = dict(env)
    if fault:
        env["CELERY_SCHEDULER_FAULT"] = fault
    if fault_signal:
        env["CELERY_SCHEDULER_FAULT_SIGNAL"] = fault_signal
    with log_path.open("ab") as log:  # the child keeps its own descriptor
        return subprocess.Popen(
            [
            sys.executable, "-m", "celery", "-A", "example_project", "beat",
            "-S", "celery_scheduler.beat:DatabaseScheduler",
            "--loglevel", "INFO", "--pidfile=", "-s", str(log_path.with_suffix(".db")),
            ],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip


def start_worker(
    env: dict[str, str], log_path: Path, *, name: str, queues: str = "celery"
) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [
            sys.executable, "-m", "celery", "-A", "example_project", "worker",
            "-P", "solo", "-n", f"{name}@%h", "-Q", queues, "--loglevel", "INFO",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
            ],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip


def stop(process: subprocess.Popen[bytes], timeout: float = 10) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout)


@contextmanager
def running(*processes: subprocess.Popen[bytes]) -> Iterator[None]:
    try:
        yield
    finally:
        for process in processes:
            stop(process)


def wait_until(
    condition: Callable[[], Any], *, timeout: float, interval: float = 0.2, what: str = ""
) -> Any:
    """Poll ``condition`` until it returns a truthy value or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or condition}")
        time.sleep(interval)


def broker_task_ids(redis_url: str, queue: str = "celery") -> list[str]:
    """Task ids of every message waiting in a Redis-backed kombu queue (duplicates kept)."""
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        raw = client.lrange(queue, 0, -1)
    finally:
        client.close()
    ids = []
    for item in raw:
        envelope = json.loads(item)
        headers = envelope.get("headers") or {}
        task_id = headers.get("id")
        if task_id is None:  # protocol 1 keeps the id in the body
            body = json.loads(base64.b64decode(envelope["body"]))
            task_id = body["id"]
        ids.append(task_id)
    return ids


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"
