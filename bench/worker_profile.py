"""Where a scheduled run's worker time goes, phase by phase, in one process.

    python -m bench.worker_profile [--runs 300] [--broker URL]

Against ``DATABASE_URL`` (default the bench's ``cs_worker``; its scheduler tables are wiped):
``--runs`` ENQUEUED occurrences of one schedule each, then for each run, timed separately
(median over the runs, milliseconds): opening a new database connection and its first
claim (what every run paid while Celery closed the connection after each task); then on a
kept connection a round trip (``SELECT 1``), the claim, the body (``bench.append_line``),
the completion, the heartbeat's hold and stop (one thread per process, started at the first
run) and the wrapper's log line, and the server's own time per call of the claim and
completion functions (``pg_stat_user_functions``). Then ``execute()`` whole, on a kept
connection and with the connection closed before each run. Last, Celery's tracer around
the body, for a plain task and for a scheduled run with its database part left out: what
the wrapper adds on Celery's side. No broker: the rest of Celery's side of a task is what
the plain rate of ``bench.worker_rate`` measures.

Every phase on the kept connection also counts what it sends to the database, per run:
SQL statements (Django's ``execute_wrappers``, savepoints included) and round trips
(those statements plus the transaction commands psycopg sends on its own: BEGIN, COMMIT,
ROLLBACK). These counts do not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import inspect
import logging
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/cs_worker"
#: Statements and round trips sent while a phase runs, per phase (summed over the runs).
SENT: dict[str, list[int]] = {}
_counting: list[str] = []
_sent = {"statements": 0, "commands": 0}


def _count_statement(
    execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]
) -> Any:
    _sent["statements"] += 1
    return execute(sql, params, many, context)


def install_counters(connection: Any) -> None:
    """Count statements (Django's wrapper) and psycopg's own BEGIN/COMMIT/ROLLBACK."""
    from psycopg._connection_base import BaseConnection

    connection.execute_wrappers.append(_count_statement)
    command = BaseConnection._exec_command

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        _sent["commands"] += 1
        return command(self, *args, **kwargs)

    BaseConnection._exec_command = counted  # type: ignore[method-assign]


def timed(samples: dict[str, list[float]], name: str, call: Callable[[], Any]) -> Any:
    statements, commands = _sent["statements"], _sent["commands"]
    started = time.perf_counter()
    value = call()
    samples.setdefault(name, []).append((time.perf_counter() - started) * 1000)
    sent = SENT.setdefault(name, [0, 0, 0])
    sent[0] += 1
    sent[1] += _sent["statements"] - statements
    sent[2] += _sent["statements"] - statements + _sent["commands"] - commands
    return value


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/5", help="wiped first")
    parser.add_argument(
        "--history-days", type=int, default=0,
        help="daily history slots before today, each seeded by SQL with --history-rows "
        "finished occurrences and their attempts (a retention window's partitions)",
    )  # fmt: skip
    parser.add_argument("--history-rows", type=int, default=20_000)
    args = parser.parse_args(argv)
    os.environ.setdefault("DATABASE_URL", DEFAULT_DB)
    os.environ["DJANGO_SETTINGS_MODULE"] = "example_project.settings"
    os.environ.setdefault("BENCH_LINES", tempfile.mktemp(prefix="worker_profile-"))
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from bench import worker_rate, worker_tasks
    from celery_scheduler.core.ids import occurrence_id
    from django_app import tasks
    from django_app.models import Occurrence, OutboxEntry, Schedule, Tenant
    from django_app.worker import claim, finish, heartbeat
    from example_project.celery import app

    call_command("migrate", verbosity=0, interactive=False)
    worker_rate.reset(os.environ["DATABASE_URL"], args.broker)
    install_counters(connection)
    tenant = Tenant.objects.create(slug="bench", name="bench")
    now = datetime.now(UTC).replace(microsecond=0)
    if args.history_days:
        worker_rate.seed_history(now, args.history_days, args.history_rows)

    def enqueued(n: int) -> list[uuid.UUID]:
        ids = []
        for _ in range(n):
            schedule = Schedule.objects.create(
                tenant=tenant, name=f"p-{uuid.uuid4().hex[:8]}", task="bench.append_line",
                kind="CRON", cron="0 * * * *",
            )  # fmt: skip
            occ = Occurrence.objects.create(
                id=occurrence_id(schedule.id, schedule.version, now), schedule=schedule,
                schedule_version=schedule.version, tenant=tenant, scheduled_for=now,
                available_at=now, state="ENQUEUED", enqueued_at=now,
            )  # fmt: skip
            OutboxEntry.objects.create(
                occurrence=occ, tenant=tenant, available_at=now, sent_at=now, publish_count=1
            )
            ids.append(occ.id)
        return ids

    lease = timedelta(seconds=300)
    log = logging.getLogger("celery_scheduler.worker")
    # What the worker has from the message: the occurrence's time, its partition's key
    # (passed where the code under test takes it, so an older checkout runs this too).
    message = {"scheduled_for": now.isoformat()}
    keyed: dict[str, Any] = {}
    if "scheduled_for" in inspect.signature(claim.claim).parameters:
        keyed = {"scheduled_for": now}
    samples: dict[str, list[float]] = {}
    for occ_id in enqueued(args.runs):
        connection.close()
        timed(samples, "connect (new connection)", connection.ensure_connection)
        claimed = timed(
            samples, "first claim on the new connection",
            lambda occ_id=occ_id: claim.claim(occ_id, worker="p", lease=lease, **keyed),
        )  # fmt: skip
        finish.complete(occ_id, claimed.fencing_token, None, **keyed)
    # Every phase of a run, on a kept connection (as a worker with CELERY_DB_REUSE_MAX).
    # The server's own time per call of the claim and completion functions, from here on
    # (pg_stat_user_functions; read at the end, once this session has gone).
    with connection.cursor() as cursor:
        cursor.execute("SET track_functions = 'pl'")
        cursor.execute("SELECT pg_stat_reset()")

    def round_trip() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")

    for occ_id in enqueued(args.runs):
        timed(samples, "round trip (SELECT 1)", round_trip)
        claimed = timed(
            samples, "claim on a kept connection",
            lambda occ_id=occ_id: claim.claim(occ_id, worker="p", lease=lease, **keyed),
        )  # fmt: skip
        token = claimed.fencing_token
        beat = timed(
            samples, "heartbeat: hold the lease",
            lambda occ_id=occ_id, token=token, slot=claimed.slot is not None: heartbeat.hold(
                str(occ_id), token, lease, holds_slot=slot
            ),
        )  # fmt: skip
        value = timed(samples, "body (append one line)", worker_tasks._append)
        timed(samples, "heartbeat: stop", beat.stop)
        timed(
            samples, "completion",
            lambda occ_id=occ_id, token=token, value=value: finish.complete(
                occ_id, token, value, **keyed
            ),
        )  # fmt: skip
        timed(samples, "log line", lambda occ_id=occ_id: log.info("occurrence %s: x", occ_id))
    for occ_id in enqueued(args.runs):
        timed(
            samples, "execute() on a kept connection",
            lambda occ_id=occ_id: tasks.execute(
                app, str(occ_id), "bench.append_line", [], {}, worker_name="p", message=message
            ),
        )  # fmt: skip
    for occ_id in enqueued(args.runs):
        timed(
            samples, "execute() of an @idempotent_task, kept connection",
            lambda occ_id=occ_id: tasks.execute(
                app, str(occ_id), "bench.append_line_idempotent", [], {}, worker_name="p",
                message=message,
            ),
        )  # fmt: skip
    function_times = server_function_times(connection)
    for occ_id in enqueued(args.runs):
        connection.close()
        timed(
            samples, "execute() on a new connection",
            lambda occ_id=occ_id: tasks.execute(
                app, str(occ_id), "bench.append_line", [], {}, worker_name="p", message=message
            ),
        )  # fmt: skip
    celery_side(app, samples, args.runs)
    width = max(len(k) for k in samples)
    print(f"{'phase':<{width}}  median ms  p90 ms  (n = {args.runs} each)")
    for name, values in samples.items():
        p90 = statistics.quantiles(values, n=10)[-1]
        print(f"{name:<{width}}  {statistics.median(values):9.2f}  {p90:6.2f}")
    print(f"\n{'PostgreSQL function (kept connection)':<{width}}  calls  server ms/call")
    for name, calls, per_call in function_times:
        print(f"{name:<{width}}  {calls:5d}  {per_call:14.3f}")
    print(f"\n{'phase':<{width}}  statements/run  round trips/run")
    for name, (n, statements, trips) in SENT.items():
        if statements or trips:
            print(f"{name:<{width}}  {statements / n:14.2f}  {trips / n:15.2f}")


def server_function_times(connection: Any) -> list[tuple[str, int, float]]:
    """(function, calls, server ms per call) since the reset, per ``pg_stat_user_functions``
    (the session's counts are flushed when it ends: it is closed first)."""
    import psycopg

    connection.close()
    with psycopg.connect(os.environ["DATABASE_URL"]) as conn:
        rows = conn.execute(
            "SELECT funcname, calls, total_time / calls FROM pg_stat_user_functions "
            "WHERE calls > 0 ORDER BY funcname"
        ).fetchall()
    return [(str(name), int(calls), float(ms)) for name, calls, ms in rows]


def celery_side(app: Any, samples: dict[str, list[float]], runs: int) -> None:
    """Celery's tracer around the same body: a plain task, and a scheduled run traced as
    that task (the presentation layer, the wrapper and its log line) with the database
    part (claim, completion) left out, so the difference is what the wrapper adds."""
    from celery.app import trace as celery_trace

    from django_app import tasks
    from django_app.worker import presentation

    presentation.install(app)
    plain = app.tasks["bench.append_line"]
    plain.__trace__ = celery_trace.build_tracer(plain.name, plain, app=app)
    wrapper = app.tasks["celery_scheduler.run_occurrence"]
    real_execute = tasks.execute

    def no_database(*args: Any, body: Callable[[], Any], **kwargs: Any) -> dict[str, Any]:
        value = body()
        return {"outcome": "SUCCEEDED", "result": value, "token": 1, "value": value}

    tasks.execute = no_database  # type: ignore[assignment]
    try:
        for _ in range(runs):
            task_id = str(uuid.uuid4())
            request = {"id": task_id, "hostname": "p", "delivery_info": {}}
            timed(
                samples, "Celery tracer: plain task",
                lambda t=task_id, r=request: plain.__trace__(t, [], {}, dict(r)),
            )  # fmt: skip
            wrapper_kwargs = {
                "occurrence_id": task_id,
                "task": plain.name,
                "args": [],
                "kwargs": {},
            }
            timed(
                samples, "Celery tracer: scheduled run, database left out",
                lambda t=task_id, k=wrapper_kwargs, r=request: wrapper.__trace__(t, [], k, dict(r)),
            )  # fmt: skip
    finally:
        tasks.execute = real_execute  # type: ignore[assignment]


if __name__ == "__main__":
    main(sys.argv[1:])
