"""SQLite without IMMEDIATE transactions: beat refuses to start, with a message that says
what to set; ``manage.py check`` warns (migrate and runserver keep working)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from celery_scheduler import errors
from django_app.compat import DJANGO_51
from django_app.db.checks import sqlite_problems
from tests.acceptance import support
from tests.acceptance.support import ROOT

#: The refusal reads settings, not the database the pass runs on.
pytestmark = [support.embedded_pass_only]

SQLITE = {"ENGINE": "django.db.backends.sqlite3", "NAME": "/tmp/x.sqlite3"}


@pytest.mark.parametrize(
    ("settings_dict", "problems"),
    [
        (SQLITE, 1),
        # Django 4.2's own backend has no transaction_mode (django_app.sqlite3 backports it).
        ({**SQLITE, "OPTIONS": {"transaction_mode": "immediate"}}, 0 if DJANGO_51 else 1),
        (
            {**SQLITE, "NAME": ":memory:", "OPTIONS": {"transaction_mode": "IMMEDIATE"}},
            1 if DJANGO_51 else 2,
        ),
        ({"ENGINE": "django_app.sqlite3", "NAME": "/tmp/x.sqlite3"}, 1),
        (
            {
                "ENGINE": "django_app.sqlite3",
                "NAME": "/x",
                "OPTIONS": {"transaction_mode": "IMMEDIATE"},
            },
            0,
        ),
        ({"ENGINE": "django.db.backends.postgresql", "NAME": "x"}, 0),
    ],
)
def test_sqlite_problems(settings_dict: dict[str, object], problems: int) -> None:
    assert len(sqlite_problems(settings_dict)) == problems


def test_unsafe_database_is_a_configuration_error() -> None:
    assert issubclass(errors.UnsafeDatabase, errors.ConfigurationError)


@pytest.mark.acceptance
@pytest.mark.timeout(120)
def test_beat_refuses_plain_sqlite_settings(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "CELERY_"))}
    env.update(
        CELERY_SCHEDULER_DATA_DIR=str(tmp_path),
        DJANGO_SETTINGS_MODULE="tests.acceptance.plain_sqlite_settings",
        PYTHONUNBUFFERED="1",
    )
    check = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert check.returncode == 0, check.stderr  # a warning, not an error
    assert "django_app.W001" in check.stderr + check.stdout
    beat = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "example_project", "beat", "--loglevel", "INFO",
         "-s", str(tmp_path / "beat")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    output = beat.stdout + beat.stderr
    assert beat.returncode == 78, output  # EX_CONFIG: a supervisor stops restarting it
    # One short message with the fix, not Celery's traceback echoed token by token.
    refusals = [line for line in output.splitlines() if "refuses to run" in line]
    assert len(refusals) == 1, output
    assert "CRITICAL" in refusals[0]
    assert 'transaction_mode": "IMMEDIATE"' in refusals[0]
    assert "Traceback" not in output
    assert "WARNING/" not in output
    assert len(output.splitlines()) < 20, output
