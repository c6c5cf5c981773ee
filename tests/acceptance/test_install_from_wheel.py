"""The quick start (docs/tutorial/quickstart.md), followed literally, on a brand-new project.

Builds the sdist and wheel (``twine check`` must pass, README included), installs the wheel
with the quick start's extras into a fresh virtualenv (nothing from this checkout on its
path), creates a project with ``django-admin startproject`` and an app with ``startapp``,
pastes the quick start's code blocks (found by their first-line ``# path`` comment),
migrates, and runs beat and a worker with the quick start's commands as real processes until
a schedule created through the public API has run. Once on PostgreSQL + Redis and once on
PostgreSQL + RabbitMQ.

The only lines that are not the quick start's: the test's own database and broker address
(a user has theirs already), and on RabbitMQ a queue name of the test's own.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.support import ROOT, stop, tail, wait_until
from tests.conftest import REDIS_URL, claim_test_redis_db, require_service

pytestmark = [pytest.mark.acceptance, pytest.mark.postgres, pytest.mark.timeout(600)]

FENCE = re.compile(r"^( *)```(python|bash)\n(.*?)^\1```", re.MULTILINE | re.DOTALL)
RABBITMQ_URL = os.environ.get("TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//")
#: The page a new user follows (the README's short quick start points there).
QUICK_START = ROOT / "docs" / "tutorial" / "quickstart.md"


def quick_start_files() -> dict[str, str]:
    """Quick start code blocks whose first line is ``# some/path``: path -> block text."""
    files: dict[str, str] = {}
    for match in FENCE.finditer(QUICK_START.read_text()):
        block = textwrap.dedent(match.group(3))
        first, _, _ = block.partition("\n")
        found = re.fullmatch(r"# ([\w/]+\.py)( \(add\))?", first.strip())
        if found:
            files[found.group(1)] = block
    return files


def run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def clean_env() -> dict[str, str]:
    """The environment of a shell in a new project: none of this checkout's settings."""
    dropped = ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "CELERY_", "PYTHONPATH", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    dist = work / "dist"
    run([sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)], cwd=work)
    artifacts = sorted(dist.iterdir())
    assert sorted(p.suffix for p in artifacts) == [".gz", ".whl"], artifacts
    run([sys.executable, "-m", "twine", "check", "--strict", *map(str, artifacts)], cwd=work)
    wheel = next(p for p in artifacts if p.suffix == ".whl")
    env_dir = work / "venv"
    run([sys.executable, "-m", "venv", str(env_dir)], cwd=work)
    pip = [str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q"]
    run([*pip, f"{wheel}[redis,rabbitmq,postgres]"], cwd=work, env=clean_env())
    return env_dir


@pytest.fixture
def database() -> Iterator[str]:
    import psycopg

    name = f"cs_install_{uuid.uuid4().hex[:10]}"
    with psycopg.connect("host=127.0.0.1 user=postgres dbname=postgres", autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        with psycopg.connect("host=127.0.0.1 user=postgres dbname=postgres", autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def new_project(venv: Path, where: Path, database: str, broker: str, queue: str | None) -> Path:
    bin_dir = venv / "bin"
    where.mkdir()
    run([str(bin_dir / "django-admin"), "startproject", "proj", "."], cwd=where, env=clean_env())
    run([str(bin_dir / "python"), "manage.py", "startapp", "billing"], cwd=where, env=clean_env())
    blocks = quick_start_files()
    for path in ("proj/celery.py", "proj/__init__.py", "billing/tasks.py"):
        (where / path).write_text(blocks[path])
    settings = where / "proj" / "settings.py"
    ours = blocks["proj/settings.py"].replace("redis://127.0.0.1:6379/0", broker)
    test_only = textwrap.dedent(f"""
        # The test's own database and queue (a real project has its own already).
        DATABASES = {{"default": {{"ENGINE": "django.db.backends.postgresql",
            "NAME": "{database}", "USER": "postgres", "HOST": "127.0.0.1", "PORT": 5432}}}}
        """)
    if queue:
        test_only += f'CELERY_TASK_DEFAULT_QUEUE = "{queue}"\n'
    settings.write_text(settings.read_text() + "\n" + ours + test_only)
    return where


def quick_start_task_name() -> str:
    """The task name the quick start's ``api.create_schedule`` example refers to."""
    found = re.search(r'api\.create_schedule\(.*?task="([^"]+)"', QUICK_START.read_text(), re.S)
    assert found, "the quick start shows no api.create_schedule(task=...)"
    return found.group(1)


def quick_start_command(prefix: str) -> list[str]:
    """The quick start's command line that starts with ``prefix`` (e.g. ``celery -A proj beat``)."""
    for match in FENCE.finditer(QUICK_START.read_text()):
        for line in textwrap.dedent(match.group(3)).splitlines():
            if line.startswith(prefix):
                return line.split()
    raise AssertionError(f"the quick start has no command starting with {prefix!r}")


@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_quick_start_on_a_new_project(
    broker: str, venv: Path, database: str, tmp_path: Path
) -> None:
    import psycopg

    require_service("PostgreSQL", "127.0.0.1", 5432)
    if broker == "redis":
        require_service("Redis", "127.0.0.1", 6379)
        claim_test_redis_db()
        url, queue = REDIS_URL, None
    else:
        require_service("RabbitMQ", "127.0.0.1", 5672)
        url, queue = RABBITMQ_URL, f"cs-install-{uuid.uuid4().hex[:8]}"
    project = new_project(venv, tmp_path / "site", database, url, queue)
    python = str(venv / "bin" / "python")
    env = clean_env()
    env["PATH"] = f"{venv / 'bin'}:{env['PATH']}"
    run([python, "manage.py", "migrate", "-v", "0"], cwd=project, env=env)
    task = quick_start_task_name()
    run(
        [python, "manage.py", "shell", "-c", textwrap.dedent(f"""
            from datetime import timedelta
            from django.utils import timezone
            from celery_scheduler import api
            api.create_schedule(name="wheel smoke", task="{task}",
                                args=[42], run_at=timezone.now() + timedelta(seconds=3))
            """)],
        cwd=project, env=env,
    )  # fmt: skip

    logs = {name: (tmp_path / f"{name}.log").open("wb") for name in ("beat", "worker")}
    commands = {
        "beat": quick_start_command("celery -A proj beat"),
        "worker": quick_start_command("celery -A proj worker"),
    }
    processes = [
        subprocess.Popen(commands[name], cwd=project, env=env, stdout=logs[name], stderr=-2)
        for name in ("beat", "worker")
    ]
    started = time.monotonic()
    try:

        def succeeded() -> bool:
            with psycopg.connect(f"host=127.0.0.1 user=postgres dbname={database}") as c:
                rows = c.execute("SELECT state FROM django_app_occurrence").fetchall()
            return [r[0] for r in rows] == ["SUCCEEDED"]

        try:
            wait_until(succeeded, timeout=90, interval=0.5, what="the schedule to run")
        except AssertionError:
            pytest.fail(
                "no SUCCEEDED occurrence\nbeat:\n"
                + tail(tmp_path / "beat.log")
                + "\nworker:\n"
                + tail(tmp_path / "worker.log")
            )
    finally:
        for process in processes:
            stop(process, timeout=20)
        for log in logs.values():
            log.close()
    assert time.monotonic() - started < 90
    assert task in (tmp_path / "worker.log").read_text()
