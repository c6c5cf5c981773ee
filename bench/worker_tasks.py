"""The tasks ``bench.worker_rate`` runs, and per-process counters of the worker's database use.

Loaded into the worker with ``celery worker -I bench.worker_tasks``. Each task appends one
line (its wall time) to ``$BENCH_LINES`` and returns a dict: the same body for plain Celery,
for a scheduled run and for an ``@idempotent_task``. Each worker child counts the SQL
statements it sends and the connections it opens (Django's ``execute_wrappers`` and
``connection_created``) and writes them to ``$BENCH_STATS_DIR/<pid>.json`` when it exits.
With ``$BENCH_PROFILE_DIR`` set, each child also runs under cProfile from its start and
dumps ``$BENCH_PROFILE_DIR/<pid>.prof`` at warm shutdown (bench/README.md, round four).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from celery import shared_task, signals
from django.db import connection
from django.db.backends.signals import connection_created

from celery_scheduler import idempotent_task

COUNTS: Counter[str] = Counter()
#: ``BENCH_PROFILE_DIR`` set: each child runs under cProfile and dumps ``<pid>.prof`` at exit.
_PROFILE: Any = None


def _append() -> dict[str, Any]:
    at = time.time()
    with open(os.environ["BENCH_LINES"], "a") as fh:
        fh.write(f"{at}\n")
    return {"at": at, "pid": os.getpid()}


@shared_task(name="bench.append_line")
def append_line(i: int = 0) -> dict[str, Any]:
    return _append()


@idempotent_task(name="bench.append_line_idempotent")
def append_line_idempotent(i: int = 0) -> dict[str, Any]:
    return _append()


def _count(
    execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]
) -> Any:
    verb = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else "?"
    COUNTS["statements"] += 1
    COUNTS[f"statements:{verb}"] += 1
    return execute(sql, params, many, context)


def _opened(sender: Any, connection: Any, **kwargs: Any) -> None:
    COUNTS["connections"] += 1


@signals.worker_process_init.connect
def _install(**kwargs: Any) -> None:
    # The list survives close() and reconnects: every statement of this child is counted.
    connection.execute_wrappers.append(_count)
    connection_created.connect(_opened, weak=False)
    if os.environ.get("BENCH_PROFILE_DIR"):
        import cProfile

        global _PROFILE
        _PROFILE = cProfile.Profile()
        _PROFILE.enable()


@signals.task_postrun.connect
def _task_done(**kwargs: Any) -> None:
    COUNTS["tasks"] += 1


@signals.worker_process_shutdown.connect
def _write(**kwargs: Any) -> None:
    if _PROFILE is not None:
        _PROFILE.disable()
        _PROFILE.dump_stats(Path(os.environ["BENCH_PROFILE_DIR"], f"{os.getpid()}.prof"))
    out = os.environ.get("BENCH_STATS_DIR")
    if out:
        Path(out, f"{os.getpid()}.json").write_text(json.dumps(COUNTS))
