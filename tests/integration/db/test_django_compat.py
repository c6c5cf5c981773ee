"""The pieces that differ between Django 4.2 and 5.2 (django_app.compat, django_app.sqlite3):
the same constraints, the same admin log entry, and the SQLite OPTIONS the scheduler needs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import OperationalError, models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.utils import ConnectionHandler

from django_app.compat import check_constraint
from django_app.db.checks import sqlite_problems

# The SQLite connections below are private ones on a file of their own; the mark only lifts
# pytest-django's block on opening connections.
pytestmark = pytest.mark.django_db


def test_check_constraint_is_the_same_constraint_on_every_version() -> None:
    condition = models.Q(version__gte=1)
    built = check_constraint(condition=condition, name="positive")
    assert built.name == "positive"
    # Django 4.2 keeps it in .check, 5.1+ in .condition: the same Q either way.
    assert getattr(built, "condition", None) == condition or getattr(built, "check") == condition  # noqa: B009


@pytest.fixture
def sqlite_wrappers(tmp_path: Path) -> Iterator[Callable[..., BaseDatabaseWrapper]]:
    """Connections through the package's SQLite backend, on one file, outside the test DB."""
    opened: list[BaseDatabaseWrapper] = []

    def make(**options: Any) -> BaseDatabaseWrapper:
        # A handler of its own per connection: its alias must be "default".
        name = str(tmp_path / "compat.sqlite3")
        handler = ConnectionHandler(
            {"default": {"ENGINE": "django_app.sqlite3", "NAME": name, "OPTIONS": options}}
        )
        wrapper = handler["default"]
        opened.append(wrapper)
        return wrapper

    yield make
    for wrapper in opened:
        wrapper.close()


def _begin(wrapper: BaseDatabaseWrapper) -> None:
    # What transaction.atomic() does on entry.
    wrapper.set_autocommit(False, force_begin_transaction_with_broken_autocommit=True)


def test_sqlite_backend_honours_transaction_mode_and_init_command(
    sqlite_wrappers: Callable[..., BaseDatabaseWrapper],
) -> None:
    writer = sqlite_wrappers(
        transaction_mode="IMMEDIATE", timeout=30, init_command="PRAGMA journal_mode=WAL;"
    )
    with writer.cursor() as cursor:
        cursor.execute("CREATE TABLE t (x integer)")
        cursor.execute("PRAGMA journal_mode")
        assert cursor.fetchone()[0] == "wal"
    seen: list[str] = []

    def record(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append(sql)
        return execute(sql, params, many, context)

    with writer.execute_wrapper(record):
        _begin(writer)
    assert seen == ["BEGIN IMMEDIATE"]
    # The write lock is held from BEGIN, before any statement: another writer cannot get in
    # (with Django 4.2's plain BEGIN this insert would succeed).
    other = sqlite_wrappers(timeout=0)
    with pytest.raises(OperationalError, match="locked"), other.cursor() as cursor:
        cursor.execute("INSERT INTO t VALUES (1)")
    writer.rollback()
    writer.set_autocommit(True)


def test_sqlite_backend_refuses_an_unknown_transaction_mode(
    sqlite_wrappers: Callable[..., BaseDatabaseWrapper],
) -> None:
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match="transaction_mode"):
        sqlite_wrappers(transaction_mode="SOMETIMES").ensure_connection()


def test_package_backend_with_immediate_mode_is_safe() -> None:
    settings_dict = {
        "ENGINE": "django_app.sqlite3",
        "NAME": "/tmp/x.sqlite3",
        "OPTIONS": {"transaction_mode": "IMMEDIATE"},
    }
    assert sqlite_problems(settings_dict) == []
    assert len(sqlite_problems({**settings_dict, "OPTIONS": {}})) == 1
