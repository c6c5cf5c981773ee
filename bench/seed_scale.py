"""A compressed day at the contract's scale, in one command (bench/README.md, "A compressed day").

    python -m bench.seed_scale [--sizes 1000000,20000000] [--day-minutes 30] [--peak 500000]
        [--rate 200000000] [--history-days 31] [--history-per-day 1000000] [--nodes 2]

PostgreSQL (database ``cs_scale_bench``, recreated) with the DEFAULT settings (every
``CELERY_SCHEDULER*`` variable removed), Redis db 6 as the broker (the tests use 13-15). In order:

1. **History**, by SQL (not the path measured; the output says so): ``--history-days`` past
   daily slots, each of ``--history-per-day`` SUCCEEDED occurrences with their attempt and
   sent outbox row.
2. **Schedules, through ``api.create_schedules``** (the public bulk path), 10 tenants:
   daily crons (one per minute of the day, round-robin) up to each size of ``--sizes``,
   and with the size of the first day window the live ones: the peak, ``--peak`` crons
   ``M * * * *`` (M: the window's middle minute), and the per-minute crons that, with the
   peak and the daily crons, make ``--rate`` occurrences a day at the largest size. The
   live crons' ``start_at`` is the window's start: no fire time of theirs passes before
   a beat runs (later windows find the fire times missed in between, as after an outage).
3. **At each size**: the create rate of the step, then, with ``--day-minutes`` > 0,
   **the day window**: ``--nodes`` beats
   (``celery beat -S celery_scheduler.beat:DatabaseScheduler``) run from ``--lead`` s
   before the window to its end (the window is stretched to hold the peak minute);
   ``bench.drain`` empties the queue and timestamps each message. For every occurrence
   due in the window, lag = arrival - scheduled_for (not arrived within ``--grace`` s:
   infinite): p99 off-peak and at the peak; the materialize, relay and mark rates; WAL
   bytes per occurrence; each beat's peak RSS. Then the worker path: ``run_occurrence``
   (claim + the task + complete) over ``--worker-sample`` of the window's rows, in one
   process: its rows/s. Then table and index sizes; ``describe_schedule`` and
   ``list_schedules``; the admin's schedule and occurrence lists; one beat poll when
   nothing is due; retiring one day of history (``partitions.drop_old`` of the oldest
   slot).
4. Projected: each schedule-side table at 20 M schedules (linear from the first size to the
   last), and the history tables' bytes per day kept at ``--rate`` (their bytes per row).

Prints each figure per size and writes ``bench/results/scale-<UTC timestamp>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import redis

from bench.steady_state import base_env, load, start_beat
from bench.topofhour import peak_rss_mb, percentile, reset_database, stop

ROOT = Path(__file__).resolve().parents[1]
PG = "postgres://postgres@127.0.0.1:5432"
DB = "cs_scale_bench"
BROKER = "redis://127.0.0.1:6379/6"
TASK = "billing.ping"
TENANTS = 10
CHUNK = 10_000
CONTRACT_SCHEDULES = 20_000_000


# -- subprocesses with Django set up ------------------------------------------------------


def spec(kind: str, i: int, minute: int, start_at: datetime | None) -> dict[str, Any]:
    """Schedule ``i`` of a kind: the peak's hourly cron, a per-minute one, or a daily one."""
    cron = {
        "peak": f"{minute} * * * *",
        "minute": "* * * * *",
        "daily": f"{i % 60} {(i // 60) % 24} * * *",
    }[kind]
    item: dict[str, Any] = {"name": f"{kind}-{i}", "task": TASK, "cron": cron, "args": [i]}
    if start_at is not None:
        item["start_at"] = start_at
    return item


def _create(
    kind: str, start: int, count: int, minute: int, start_at: float, procs: int, p: int
) -> None:
    from celery_scheduler import api

    first = datetime.fromtimestamp(start_at, UTC) if start_at else None
    # A process owns the tenants t with t % procs == p: a bulk create locks its tenant's row.
    by_tenant: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for i in range(start, start + count):
        if (i % TENANTS) % procs == p:
            by_tenant[f"t{i % TENANTS}"].append(spec(kind, i, minute, first))
    for slug, items in by_tenant.items():
        for at in range(0, len(items), CHUNK):
            api.create_schedules(items[at : at + CHUNK], tenant=slug)


def insert_succeeded(
    cur: Any,
    schedule_id: Any,
    tenant_id: int,
    *,
    start: datetime,
    n: int,
    step: float,
    sent_after: float = 0.0,
) -> None:
    """``n`` SUCCEEDED occurrences of one schedule from ``start``, ``step`` seconds apart,
    each sent ``sent_after`` seconds after its time: history by SQL, not the measured path."""
    cur.execute(
        "INSERT INTO django_app_occurrence (id, schedule_id, schedule_version, "
        "tenant_id, scheduled_for, available_at, state, manual, overlap_policy, "
        "attempt_count, fencing_token, lease_owner, created_at, enqueued_at, "
        "finished_at, last_error, reason) "
        "SELECT gen_random_uuid(), %(s)s, 1, %(t)s, x.t, x.t, 'SUCCEEDED', false, '', "
        "1, 1, '', x.t, x.t + %(sent_after)s * interval '1 s', x.t, '', '' "
        "FROM generate_series(0, %(n)s - 1) g, "
        "LATERAL (SELECT %(start)s::timestamptz + g * %(step)s * interval '1 s' AS t) x",
        {"s": schedule_id, "t": tenant_id, "n": n, "start": start, "step": step,
         "sent_after": sent_after},
    )  # fmt: skip


def seed_day(cur: Any, schedule_ids: list[Any], tenant_id: int, *, day: datetime, n: int) -> None:
    """``n`` SUCCEEDED occurrences of each of the schedules spread over the day from ``day``,
    each with its attempt and its sent outbox row: history by SQL, not the measured path."""
    for schedule_id in schedule_ids:
        insert_succeeded(cur, schedule_id, tenant_id, start=day, n=n, step=86_400 / n)
    span = {"a": day, "b": day + timedelta(days=1), "s": [str(i) for i in schedule_ids]}
    cur.execute(
        "INSERT INTO django_app_attempt (occurrence_id, scheduled_for, number, "
        "fencing_token, worker, started_at, finished_at, outcome, error) "
        "SELECT id, scheduled_for, 1, 1, 'history', scheduled_for, scheduled_for, "
        "'SUCCEEDED', '' FROM django_app_occurrence WHERE schedule_id = ANY(%(s)s::uuid[]) "
        "AND scheduled_for >= %(a)s AND scheduled_for < %(b)s",
        span,
    )
    cur.execute(
        "INSERT INTO django_app_outboxentry (occurrence_id, scheduled_for, tenant_id, "
        "shard, available_at, priority, sent_at, publish_count, claimed_by, "
        "created_at) SELECT id, scheduled_for, tenant_id, 0, scheduled_for, 0, "
        "scheduled_for, 1, '', scheduled_for FROM django_app_occurrence "
        "WHERE schedule_id = ANY(%(s)s::uuid[]) "
        "AND scheduled_for >= %(a)s AND scheduled_for < %(b)s",
        span,
    )


def _history(days: int, per_day: int, part: int, parts: int) -> dict[str, Any]:
    from django.db import connection

    from django_app.db import partitions
    from django_app.models import Schedule, Tenant

    now = datetime.now(UTC)
    tenant = Tenant.objects.get(slug="t0")
    partitions.ensure(now, width=timedelta(days=1), ahead=2, behind=days, wait=True)
    schedule = Schedule.objects.create(
        tenant=tenant, name=f"history-{part}", task=TASK, kind="CRON", cron="* * * * *",
        state="COMPLETED",  # history only: the beats plan nothing from it
    )  # fmt: skip
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    started = time.monotonic()
    with connection.cursor() as cur:
        for d in range(days - part, 0, -parts):  # this process's share of the days
            day = today - timedelta(days=d)
            seed_day(cur, [schedule.pk], tenant.pk, day=day, n=per_day)
            print(f"history: {day:%Y-%m-%d} seeded ({time.monotonic() - started:.0f}s)",
                  flush=True)  # fmt: skip
        cur.execute("ANALYZE django_app_occurrence, django_app_attempt, django_app_outboxentry")
    took = time.monotonic() - started
    return {"days": len(range(days - part, 0, -parts)), "seconds": round(took, 1)}


def median_ms(fn: Any, repeat: int) -> float:
    """Median milliseconds of ``repeat`` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(times), 1)


def _admin_lists() -> dict[str, float]:
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.urls import reverse

    user, _ = get_user_model().objects.get_or_create(
        username="bench-root", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(user)

    def get(url: str) -> Any:
        def call() -> None:
            response = client.get(url)
            assert response.status_code == 200, (url, response.status_code)

        return call

    schedules = reverse("admin:django_app_schedule_changelist")
    occurrences = reverse("admin:django_app_occurrence_changelist")
    return {
        "admin_schedule_list_ms": median_ms(get(schedules), 3),
        "admin_schedule_search_ms": median_ms(get(f"{schedules}?q=daily-417"), 3),
        "admin_occurrence_list_ms": median_ms(get(occurrences), 3),
    }


def _poll_ms() -> dict[str, float]:
    """One beat poll with nothing due: the beat's clock two days back, before every fire."""
    from celery import Celery
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from celery_scheduler.beat import DatabaseScheduler
    from celery_scheduler.core.clock import FrozenClock
    from celery_scheduler.publishers import RecordingPublisher

    app = Celery("scale-poll", set_as_current=False)
    app.conf.broker_url = BROKER  # selects the burst relay; a recording publisher sends
    clock = FrozenClock(datetime.now(UTC) - timedelta(days=2))
    beat = DatabaseScheduler(
        app=app, clock=clock, publisher=RecordingPublisher(), lease_keeper=False
    )
    beat.tick()  # the first poll takes the leases and sets the relay up
    walls, queries = [], []
    for _ in range(20):
        clock.advance(beat.poll_interval)
        with CaptureQueriesContext(connection) as ctx:
            started = time.perf_counter()
            beat.tick()
            walls.append((time.perf_counter() - started) * 1000)
        queries.append(len(ctx.captured_queries))
    beat.close()
    return {"poll_ms": round(statistics.median(walls), 1), "poll_queries": max(queries)}


def _sizes() -> dict[str, dict[str, int]]:
    from django.db import connection

    with connection.cursor() as cur:
        # pg_partition_tree lists nothing for a plain table: the table itself stands in.
        # Rows count the leaves only (an analyzed parent holds its partitions' total too).
        cur.execute(
            "SELECT c.relname, sum(pg_table_size(t.relid)), sum(pg_indexes_size(t.relid)), "
            "coalesce(sum(greatest(p.reltuples, 0)) FILTER (WHERE t.isleaf), 0)::bigint "
            "FROM pg_class c CROSS JOIN LATERAL (SELECT relid, isleaf FROM "
            "pg_partition_tree(c.oid) UNION ALL SELECT c.oid, true WHERE c.relkind = 'r') t "
            "JOIN pg_class p ON p.oid = t.relid "
            "WHERE c.relname LIKE 'django\\_app\\_%%' AND c.relkind IN ('r', 'p') "
            "AND NOT c.relispartition GROUP BY c.relname ORDER BY 2 DESC"
        )
        return {
            name.removeprefix("django_app_"): {"table": int(t), "indexes": int(i), "rows": int(n)}
            for name, t, i, n in cur.fetchall()
            if t + i > 1 << 20
        }


def _measure() -> dict[str, Any]:
    from django.db import connection

    from celery_scheduler import api
    from django_app.models import Schedule

    with connection.cursor() as cur:
        cur.execute("ANALYZE")
    ids = list(
        Schedule.objects.filter(name__startswith="daily-").order_by("?").values_list("id")[:20]
    )
    picks = iter(ids * 2)
    return {
        "describe_ms": median_ms(lambda: api.describe_schedule(next(picks)[0]), 19),
        "list_ms": median_ms(lambda: api.list_schedules(tenant="t3", limit=50), 10),
        "list_by_task_ms": median_ms(lambda: api.list_schedules(task=TASK, limit=50), 10),
        **_admin_lists(),
        **_poll_ms(),
        "sizes": _sizes(),
    }


def _retire() -> dict[str, Any]:
    from django_app.db import partitions
    from django_app.models import Occurrence
    from django_app.operations import retention

    now = datetime.now(UTC)
    slots = [p for p in partitions.partitions(Occurrence._meta.db_table) if p.end is not None]
    oldest = min(slots, key=lambda p: p.end or now)
    assert oldest.start is not None
    assert oldest.end is not None
    rows = Occurrence.objects.filter(
        scheduled_for__gte=oldest.start, scheduled_for__lt=oldest.end
    ).count()
    started = time.perf_counter()
    report = partitions.drop_old(now, now - oldest.end, on_prune=retention.record_pruned, wait=True)
    took = time.perf_counter() - started
    return {
        "slot": oldest.name, "rows": rows, "seconds": round(took, 2),
        "dropped": report.dropped, "refused": list(report.refused),
    }  # fmt: skip


def _workers(sample: int, start: str, end: str) -> dict[str, Any]:
    from django_app.models import Occurrence
    from django_app.tasks import run_occurrence
    from example_project.celery import app

    app.loader.import_default_modules()  # the project's tasks, as a worker registers them

    rows = list(
        Occurrence.objects.filter(
            state="ENQUEUED", scheduled_for__gte=start, scheduled_for__lt=end
        )
        .order_by("scheduled_for")
        .values_list("id", "schedule_id", "schedule_version", "scheduled_for",
                     "schedule__task", "schedule__args", "schedule__kwargs")[:sample]
    )  # fmt: skip
    started = time.perf_counter()
    outcomes: dict[str, int] = defaultdict(int)
    for oid, sid, version, at, task, args, kwargs in rows:
        result = run_occurrence(str(oid), task, args, kwargs, str(sid), version, at.isoformat())
        outcomes[result["outcome"]] += 1
    took = time.perf_counter() - started
    return {
        "rows": len(rows), "seconds": round(took, 1),
        "rows_per_s": round(len(rows) / took, 1) if took else None, "outcomes": outcomes,
    }  # fmt: skip


def _worker(argv: list[str]) -> None:
    import django

    django.setup()
    from celery_scheduler import api

    what, rest = argv[0], argv[1:]
    result: Any = None
    if what == "migrate":
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)
        for i in range(TENANTS):
            api.create_tenant(f"t{i}", name=f"tenant {i}")
    elif what == "create":
        start, count, minute, start_at, procs, p = (int(x) for x in rest[1:])
        _create(rest[0], start, count, minute, start_at, procs, p)
    elif what == "history":
        result = _history(*(int(x) for x in rest[:4]))
    elif what == "measure":
        result = _measure()
    elif what == "retire":
        result = _retire()
    elif what == "workers":
        result = _workers(int(rest[0]), rest[1], rest[2])
    if result is not None:
        print(json.dumps(result, default=str))


# -- the orchestrator -----------------------------------------------------------------------


def django_step(env: dict[str, str], *args: str) -> Any:
    """Run one ``--worker`` step; its result is the last line it printed (JSON)."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.seed_scale", "--worker", *args],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True, check=True,
    )  # fmt: skip
    lines = out.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else None


def create(
    env: dict[str, str],
    kind: str,
    start: int,
    count: int,
    procs: int,
    *,
    minute: int = 0,
    start_at: datetime | None = None,
) -> float:
    """Create ``count`` schedules of ``kind`` in ``procs`` processes; the wall seconds."""
    started = time.monotonic()
    first = str(int(start_at.timestamp())) if start_at else "0"
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.seed_scale", "--worker", "create", kind,
             str(start), str(count), str(minute), first, str(procs), str(p)],
            cwd=ROOT, env=env,
        )
        for p in range(procs)
    ]  # fmt: skip
    for w in workers:
        if w.wait() != 0:
            raise SystemExit(f"a creating process failed ({w.returncode})")
    return time.monotonic() - started


def per_minute_count(rate: float, peak: int, largest: int) -> int:
    """Per-minute crons such that, with ``peak`` hourly and the rest daily at ``largest``
    schedules, the occurrences come at ``rate`` a day: rate/1440 = P + peak/60 + D/1440."""
    return max(0, round((rate - 24 * peak - (largest - peak)) / 1439))


def wal_lsn() -> int:
    with psycopg.connect(f"{PG}/{DB}") as conn:
        row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    assert row is not None
    return int(row[0])


def lag_summary(lags: list[float]) -> dict[str, Any]:
    if not lags:
        return {"n": 0}
    ordered = sorted(lags)
    finite = [x for x in ordered if x != float("inf")]

    def show(v: float) -> float | str:
        return "not arrived" if v == float("inf") else round(v, 2)

    return {
        "n": len(ordered), "missing": len(ordered) - len(finite),
        "p50": show(percentile(ordered, 0.5)), "p99": show(percentile(ordered, 0.99)),
        "max": show(ordered[-1]),
    }  # fmt: skip


def window_start(lead: float) -> datetime:
    """The first minute boundary at least ``lead`` seconds away."""
    soon = datetime.now(UTC) + timedelta(seconds=lead + 5)
    return soon.replace(second=0, microsecond=0) + timedelta(minutes=1)


def day_window(
    env: dict[str, str],
    args: argparse.Namespace,
    start: datetime,
    peak_minute: int,
    logdir: Path,
) -> dict[str, Any]:
    """The beats run through one window holding the peak minute; lags from the drain."""
    start = max(start, window_start(args.lead))
    end = start + timedelta(minutes=args.day_minutes)
    peak = start.replace(minute=peak_minute)
    if peak < start:
        peak += timedelta(hours=1)
    if peak >= end - timedelta(minutes=1):
        end = peak + timedelta(minutes=2)
    redis.Redis.from_url(BROKER).flushdb()
    out = logdir / f"drain-{start:%H%M}.json"
    drain = subprocess.Popen(
        [sys.executable, "-m", "bench.drain", BROKER, str(10**12),
         str(end.timestamp() + args.grace), str(out), "celery"],
        cwd=ROOT, env=env,
    )  # fmt: skip
    time.sleep(max(0.0, start.timestamp() - args.lead - time.time()))
    beats = [
        start_beat(env, logdir / f"beat{i}-{start:%H%M}.log", logdir / f"beat{i}.schedule")
        for i in range(args.nodes)
    ]
    print(f"day window {start:%H:%M}-{end:%H:%M} UTC, peak {peak:%H:%M}; beats started "
          f"{start.timestamp() - time.time():.0f}s before it", flush=True)  # fmt: skip
    time.sleep(max(0.0, start.timestamp() - time.time()))
    wal_start, load_start = wal_lsn(), load()
    time.sleep(max(0.0, end.timestamp() - time.time()))
    wal_end, load_end = wal_lsn(), load()
    drain.wait()
    rss = [peak_rss_mb(b.pid) for b in beats]
    for beat in beats:
        stop(beat)
    arrivals: dict[str, float] = json.loads(out.read_text())["arrivals"]
    with psycopg.connect(f"{PG}/{DB}") as conn:
        rows = conn.execute(
            "SELECT id::text, extract(epoch FROM scheduled_for), "
            "extract(epoch FROM created_at), extract(epoch FROM enqueued_at) "
            "FROM django_app_occurrence WHERE scheduled_for >= %s AND scheduled_for < %s",
            [start, end],
        ).fetchall()
    peak_at = peak.timestamp()
    lags: dict[str, list[float]] = {"off_peak": [], "peak": []}
    for oid, due, _, _ in rows:
        arrived = arrivals.get(oid)
        lag = float("inf") if arrived is None else arrived - float(due)
        lags["peak" if float(due) == peak_at else "off_peak"].append(lag)
    seconds = (end - start).total_seconds()
    lo, hi = start.timestamp(), end.timestamp()
    created = sum(1 for r in rows if r[2] is not None and lo <= float(r[2]) < hi)
    marked = sum(1 for r in rows if r[3] is not None)
    arrived_in = sum(1 for a in arrivals.values() if lo <= a < hi)
    return {
        "window": f"{start:%H:%M}-{end:%H:%M}", "peak": f"{peak:%H:%M}",
        "occurrences_due": len(rows),
        "rate_per_day": round(len(rows) / seconds * 86400),
        "lag_off_peak_s": lag_summary(lags["off_peak"]),
        "lag_peak_s": lag_summary(lags["peak"]),
        "materialized_per_s": round(created / seconds, 1),
        "relayed_per_s": round(arrived_in / seconds, 1),
        "marked": marked,
        "wal_bytes_per_occurrence": round((wal_end - wal_start) / max(1, len(rows))),
        "beat_peak_rss_mb": [round(x or 0) for x in rss],
        "load_at_start": load_start, "load_at_end": load_end,
        "bounds": [start.isoformat(), end.isoformat()],
    }  # fmt: skip


#: The tables that grow with occurrences (their size is the rate times the retention), not
#: with schedules.
HISTORY = ("occurrence", "attempt", "outboxentry")


def project(points: list[dict[str, Any]], rate: float) -> dict[str, Any]:
    """At the contract's scale: the schedule-side tables (table + indexes) at 20 M schedules,
    linear from the first size measured to the last; the history tables' bytes per day
    kept, at ``rate`` occurrences a day and the bytes per row of the last size."""
    last = points[-1]
    sizes = last["measure"]["sizes"]
    per_day = {
        name: round((s["table"] + s["indexes"]) / s["rows"] * rate)
        for name, s in sizes.items()
        if name in HISTORY and s["rows"]
    }
    at_20m: dict[str, int] = {}
    if len(points) > 1:
        first = points[0]
        span = last["size"] - first["size"]
        for name, s in sizes.items():
            if name in HISTORY:
                continue
            before = first["measure"]["sizes"].get(name, {"table": 0, "indexes": 0})
            grown = (s["table"] + s["indexes"]) - (before["table"] + before["indexes"])
            total = s["table"] + s["indexes"]
            at_20m[name] = round(total + grown / span * (CONTRACT_SCHEDULES - last["size"]))
    return {"schedule_tables_at_20M": at_20m, "history_per_day_kept": per_day}


def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = sorted(int(s) for s in args.sizes.split(","))
    logdir = Path(tempfile.mkdtemp(prefix="cs_scale_"))
    env = base_env(DB, BROKER, logdir)
    print(f"logs: {logdir}  load {load()}", flush=True)
    reset_database(DB)
    django_step(env, "migrate")
    report: dict[str, Any] = {"args": vars(args), "history": None, "points": []}
    if args.history_days:
        started = time.monotonic()
        with ThreadPoolExecutor(args.history_procs) as pool:
            parts = list(
                pool.map(
                    lambda part: django_step(
                        env, "history", str(args.history_days), str(args.history_per_day),
                        str(part), str(args.history_procs),
                    ),
                    range(args.history_procs),
                )
            )  # fmt: skip
        report["history"] = {
            "rows": args.history_days * args.history_per_day, "days": args.history_days,
            "processes": args.history_procs, "seconds": round(time.monotonic() - started, 1),
            "parts": parts,
        }  # fmt: skip
        print(f"history (seeded by SQL, past days): {report['history']}", flush=True)
    per_minute = per_minute_count(args.rate, args.peak, sizes[-1])
    live = args.peak + per_minute
    # The live crons come with the first size that runs a day window (the last one only,
    # with --day-at last), so that they start with it.
    live_at = sizes[-1] if args.day_at == "last" else sizes[0]
    if live > live_at:
        raise SystemExit(f"{live_at:,} cannot hold the peak and {per_minute:,} per-minute crons")
    created, peak_minute = 0, 0
    for size in sizes:
        started = time.monotonic()
        daily = size - created - (live if size == live_at else 0)
        create(env, "daily", created, daily, args.create_procs)
        created += daily
        start = window_start(args.lead)
        if size == live_at:
            # The peak and the per-minute crons start with the first window: no fire time of
            # theirs passes while nothing runs (a beat would find them late: MISSED rows).
            rate = daily / (time.monotonic() - started)
            start = window_start(live / rate * 1.3 + args.lead)
            peak_minute = (start + timedelta(minutes=args.day_minutes / 2)).minute
            create(env, "peak", created, args.peak, args.create_procs,
                   minute=peak_minute, start_at=start)  # fmt: skip
            create(env, "minute", created + args.peak, per_minute, args.create_procs,
                   start_at=start)  # fmt: skip
            created += live
        create_s = time.monotonic() - started
        step = size - (report["points"][-1]["size"] if report["points"] else 0)
        print(f"{size:,} schedules: +{step:,} in {create_s:.0f}s ({step / create_s:,.0f}/s)",
              flush=True)  # fmt: skip
        point: dict[str, Any] = {
            "size": size, "created": step, "create_s": round(create_s, 1),
            "create_per_s": round(step / create_s),
        }  # fmt: skip
        if args.day_minutes and (args.day_at == "all" or size == sizes[-1]):
            point["day"] = day_window(env, args, start, peak_minute, logdir)
            first, end = point["day"].pop("bounds")
            point["workers"] = django_step(env, "workers", str(args.worker_sample), first, end)
            print(json.dumps({"day": point["day"], "workers": point["workers"]}), flush=True)
        point["measure"] = django_step(env, "measure")
        point["retire"] = django_step(env, "retire") if args.history_days else None
        print(json.dumps({k: point[k] for k in ("measure", "retire")}, default=str), flush=True)
        report["points"].append(point)
    report["per_minute_crons"] = per_minute
    report["projected"] = project(report["points"], args.rate)
    outdir = ROOT / "bench" / "results"
    outdir.mkdir(exist_ok=True)
    path = outdir / f"scale-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    path.write_text(json.dumps(report, indent=2, default=str))
    print_report(report)
    print(f"wrote {path}")
    return report


def print_report(r: dict[str, Any]) -> None:
    mb = 1 << 20
    for p in r["points"]:
        m = p["measure"]
        print(f"\n== {p['size']:,} schedules: created {p['create_per_s']:,}/s; describe "
              f"{m['describe_ms']} ms, list {m['list_ms']} ms (by task {m['list_by_task_ms']}); "
              f"admin schedules {m['admin_schedule_list_ms']} ms (search "
              f"{m['admin_schedule_search_ms']}), occurrences {m['admin_occurrence_list_ms']} ms; "
              f"poll {m['poll_ms']} ms ({m['poll_queries']} queries); retire "
              f"{p['retire']}")  # fmt: skip
        for name, s in m["sizes"].items():
            print(f"   {name:24} {s['rows']:>12,} rows  table {s['table'] / mb:9,.0f} MB  "
                  f"indexes {s['indexes'] / mb:9,.0f} MB")  # fmt: skip
        if "day" in p:
            print(f"   day: {json.dumps(p['day'])}\n   workers: {json.dumps(p['workers'])}")
    projected = r["projected"]
    print("\nprojected: schedule-side tables at 20 M schedules (table + indexes)")
    for name, size in projected["schedule_tables_at_20M"].items():
        print(f"   {name:24} {size / mb:12,.0f} MB")
    print(f"history per day kept at {r['args']['rate']:,.0f} occurrences a day")
    for name, size in projected["history_per_day_kept"].items():
        print(f"   {name:24} {size / mb:12,.0f} MB")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _worker(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sizes", default="1000000,20000000", help="schedules, comma-separated")
    parser.add_argument("--rate", type=float, default=200e6, help="occurrences a day")
    parser.add_argument("--peak", type=int, default=500_000, help="crons of the peak minute")
    parser.add_argument("--day-minutes", type=int, default=30, help="0: no day window")
    parser.add_argument("--day-at", choices=("all", "last"), default="all")
    parser.add_argument("--nodes", type=int, default=2, help="beat processes")
    parser.add_argument("--lead", type=float, default=120.0, help="beats start this early")
    parser.add_argument("--grace", type=float, default=120.0, help="arrivals after the end")
    parser.add_argument("--history-days", type=int, default=31)
    parser.add_argument("--history-per-day", type=int, default=1_000_000)
    parser.add_argument("--history-procs", type=int, default=2, help="days seeded side by side")
    parser.add_argument("--worker-sample", type=int, default=5000)
    parser.add_argument("--create-procs", type=int, default=2)
    parser.add_argument("--create-rate-guess", type=float, default=3000.0)
    run(parser.parse_args())


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
    main()
