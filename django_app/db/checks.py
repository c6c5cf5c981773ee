"""What the scheduler needs from the database configuration, checked rather than assumed.

SQLite serializes writers with file locks. Django's default DEFERRED transactions start as
readers and upgrade to writers on the first write, and SQLite refuses such an upgrade while
another process writes ("database is locked", with no waiting): a beat and a worker that both
read-then-write would fail each other's claims. ``transaction_mode = "IMMEDIATE"`` takes the
write lock at BEGIN and waits ``timeout`` seconds for it instead, which is what several
processes on one file need. WAL (a journal mode) lets readers go on while one process writes;
the scheduler works without it, only slower, so it is a warning.

MySQL and MariaDB must run READ COMMITTED, Django's choice for them: the claim's overlap,
quota and waiting-line reads follow the locks they take only when each statement sees the
latest commits, and at REPEATABLE READ (InnoDB's own default, what ``isolation_level``
set to another level or to None leaves) they read the transaction's first snapshot.

Beat refuses to start and a worker refuses to claim on an unsafe configuration
(:class:`errors.UnsafeDatabase`); ``manage.py check`` reports the same as a warning, so that
``migrate`` and ``runserver`` still work while the settings are being fixed.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.core import checks
from django.db import connections

from celery_scheduler import errors
from django_app.compat import DJANGO_51

#: Django's backend, and the package's backport of 5.1's OPTIONS for Django 4.2.
SQLITE_ENGINES = frozenset(["django.db.backends.sqlite3", "django_app.sqlite3"])

SQLITE_OPTIONS_HINT = (
    'DATABASES["default"]["OPTIONS"] = {"transaction_mode": "IMMEDIATE", "timeout": 30, '
    '"init_command": "PRAGMA journal_mode=WAL;"}'
)


MYSQL_ENGINES = frozenset(["django.db.backends.mysql"])

MYSQL_OPTIONS_HINT = (
    'Leave DATABASES["default"]["OPTIONS"]["isolation_level"] unset or "read committed"'
)


def mysql_problems(settings_dict: dict[str, Any]) -> list[str]:
    """What is wrong with one MySQL/MariaDB connection's isolation level for the claims."""
    if settings_dict.get("ENGINE") not in MYSQL_ENGINES:
        return []
    options = settings_dict.get("OPTIONS") or {}
    level = options.get("isolation_level", "read committed")
    if str(level or "").lower() == "read committed":
        return []
    shown = "the server's default (REPEATABLE READ)" if not level else repr(level)
    return [
        f"MySQL/MariaDB must run READ COMMITTED, and OPTIONS isolation_level is {shown}: "
        "a claim's overlap, quota and waiting-line checks would read a snapshot older "
        "than the locks they take, and two runs could start where one may"
    ]


def sqlite_problems(settings_dict: dict[str, Any]) -> list[str]:
    """What is wrong with one SQLite connection's settings for several processes."""
    engine = settings_dict.get("ENGINE")
    if engine not in SQLITE_ENGINES:
        return []
    options = settings_dict.get("OPTIONS") or {}
    problems = []
    if not DJANGO_51 and engine != "django_app.sqlite3":
        problems.append(
            "Django's SQLite backend has no transaction_mode before Django 5.1: on Django 4.2 "
            "set ENGINE='django_app.sqlite3' (the package's backport of that option), or use "
            "Django 5.1+"
        )
    elif str(options.get("transaction_mode") or "").upper() != "IMMEDIATE":
        problems.append(
            "SQLite needs OPTIONS transaction_mode='IMMEDIATE': with Django's default "
            "(DEFERRED) a beat and a worker writing at once fail with 'database is locked'"
        )
    name = str(settings_dict.get("NAME") or "")
    if name == ":memory:" or "mode=memory" in name:
        problems.append(
            "an in-memory SQLite database is private to one process: beat and workers "
            "cannot share it; use a file"
        )
    return problems


@functools.cache
def require_safe_database(alias: str = "default") -> None:
    """Raise :class:`errors.UnsafeDatabase` if ``alias`` cannot carry the guarantees."""
    settings_dict = connections[alias].settings_dict
    for problems, hint in (
        (sqlite_problems(settings_dict), f"Set {SQLITE_OPTIONS_HINT}"),
        (mysql_problems(settings_dict), MYSQL_OPTIONS_HINT),
    ):
        if problems:
            raise errors.UnsafeDatabase(
                f"the scheduler refuses to run on this database ({alias!r}): "
                + "; ".join(problems)
                + f". {hint} (see docs/howto/troubleshooting.md)."
            )


@checks.register(checks.Tags.database, checks.Tags.compatibility)
def check_database(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> Sequence[checks.CheckMessage]:
    found: list[checks.CheckMessage] = []
    for alias in connections:
        settings_dict = connections[alias].settings_dict
        found.extend(
            checks.Warning(problem, hint=f"Set {SQLITE_OPTIONS_HINT}", id="django_app.W001")
            for problem in sqlite_problems(settings_dict)
        )
        found.extend(
            checks.Warning(problem, hint=MYSQL_OPTIONS_HINT, id="django_app.W003")
            for problem in mysql_problems(settings_dict)
        )
        if settings_dict.get("ENGINE") in SQLITE_ENGINES:
            init = str((settings_dict.get("OPTIONS") or {}).get("init_command") or "")
            if "journal_mode=wal" not in init.replace(" ", "").lower():
                found.append(
                    checks.Warning(
                        "SQLite without WAL: readers wait while beat or a worker writes",
                        hint='add "PRAGMA journal_mode=WAL;" to OPTIONS["init_command"]',
                        id="django_app.W002",
                    )
                )
    return found
