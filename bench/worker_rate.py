"""Worker throughput: plain Celery against scheduled runs of the same task, one command.

    python -m bench.worker_rate [--concurrency 1,2,4] [--plain 5000] [--runs 2000]
                                [--history-days 0] [--history-rows 20000]
                                [--drop-index INDEX,...]

For each ``-c`` (prefork, Redis broker, PostgreSQL, the example project's defaults):

- ``plain``: ``--plain`` messages of ``bench.append_line`` sent with ``apply_async``;
- ``scheduled``: ``--runs`` one-off schedules of the same task due at one instant; a beat
  materializes and publishes them all, is stopped, and only then the worker starts (the
  broker holds every message, as in issue 28);
- ``idempotent``: the same with ``bench.append_line_idempotent`` (``@idempotent_task``).

``--history-days D`` seeds, before each scheduled point, ``D`` daily history slots before
today's with ``--history-rows`` finished occurrences and attempts each (by SQL), as a
retention window keeps them: what a run reads then depends on how it finds its rows.

The worker starts only after the queue is full. A run's rate is (lines - 1) / (last line's
time - first line's time), each body writing its wall time (worker start-up is not in it).
Per run it reports the worker's SQL statements and connections opened (counted in each
child: ``bench.worker_tasks``), the database's transactions and sessions
(``pg_stat_database`` deltas of this database) and the WAL bytes of this database's
transactions (``pg_walinspect`` over the run's LSN range, records of transactions that
touched this database: other databases on the cluster do not count). The ratio is the
scheduled rate over the plain rate at the same ``-c``. CPU per run (from the tenth run on,
sampled from ``/proc`` every 0.2 s) is given for the worker's parent, its children, this
database's backends and redis-server: on a shared 2-core machine the rates move by 15 % from
one run to the next, the CPU a run costs each process much less.

``--drop-index a,b`` drops those indexes for the run and creates them again at its end: what
an index costs the worker path, as an experiment (bench/README.md, "What the occurrence's
indexes cost a run").

``DATABASE_URL`` (default ``postgres://postgres@127.0.0.1:5432/cs_worker``) and
``--broker`` (default ``redis://127.0.0.1:6379/5``) are wiped (scheduler tables, the Redis
db) before every point. Writes ``bench/results/worker_rate-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import redis

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/cs_worker"
DEFAULT_BROKER = "redis://127.0.0.1:6379/5"
TASKS = {"scheduled": "bench.append_line", "idempotent": "bench.append_line_idempotent"}


#: The tree whose django_app / example_project the beat and the worker run (``--code``).
CODE = ROOT


def env_for(db: str, broker: str, lines: Path, stats: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CELERY_SCHEDULER_FAULT")}
    env.update(
        DATABASE_URL=db,
        CELERY_BROKER_URL=broker,
        DJANGO_SETTINGS_MODULE="example_project.settings",
        # The code under test first, then this harness's bench package.
        PYTHONPATH=f"{CODE}{os.pathsep}{ROOT}",
        PYTHONUNBUFFERED="1",
        BENCH_LINES=str(lines),
        BENCH_STATS_DIR=str(stats),
    )
    return env


def stop(process: subprocess.Popen[bytes], timeout: float = 60) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)  # warm shutdown: children write their counters
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout)


def ensure_database(db: str) -> None:
    """Create the bench's database on a fresh machine (its tables are wiped per point)."""
    server, name = db.rsplit("/", 1)
    with psycopg.connect(server + "/postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def db_counters(db: str) -> dict[str, Any]:
    name = db.rsplit("/", 1)[1]
    with psycopg.connect(db.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        row = conn.execute(
            "SELECT d.oid, s.xact_commit + s.xact_rollback, s.sessions, s.tup_inserted, "
            "s.tup_updated, s.tup_deleted, pg_current_wal_flush_lsn()::text "
            "FROM pg_stat_database s JOIN pg_database d ON d.datname = s.datname "
            "WHERE s.datname = %s",
            [name],
        ).fetchone()
    assert row is not None
    keys = ("oid", "transactions", "sessions", "inserted", "updated", "deleted", "lsn")
    return dict(zip(keys, row, strict=True))


_WAL_SQL = (
    "WITH r AS (SELECT xid, record_length, block_ref "
    "FROM pg_get_wal_records_info(%s::pg_lsn, %s::pg_lsn)), "
    "mine AS (SELECT DISTINCT xid FROM r WHERE block_ref LIKE %s AND xid <> 0) "
    "SELECT coalesce(sum(record_length), 0) FROM r "
    "WHERE xid IN (SELECT xid FROM mine) OR (xid = 0 AND block_ref LIKE %s)"
)


class WalMeter(threading.Thread):
    """Sums the WAL of transactions that touched database ``oid``, read every second.

    The cluster is shared: other databases' WAL is left out, and reading it while the run
    goes on keeps each range inside WAL segments that a checkpoint has not recycled yet. A
    transaction whose records straddle two reads is split between them (its commit record
    may be missed: ~40 bytes). ``total`` is None when a range was already gone.
    """

    def __init__(self, db: str, oid: int, start: str) -> None:
        super().__init__(daemon=True)
        self.db, self.pattern, self.lsn = db, f"%/{oid}/%", start
        self.total: int | None = 0
        self.done = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.db, autocommit=True, application_name=METER) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
            while self.total is not None:
                last = self.done.wait(1.0)
                self._read(conn)
                if last:
                    return

    def _read(self, conn: psycopg.Connection[Any]) -> None:
        # The flushed end: a range past it is refused ("future end LSN").
        row = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()
        assert row is not None
        assert self.total is not None
        end = row[0]
        try:
            got = conn.execute(_WAL_SQL, [self.lsn, end, self.pattern, self.pattern]).fetchone()
        except psycopg.Error as exc:
            if "future" in str(exc):  # the flushed LSN had not moved past ours: read later
                return
            print(f"WAL not counted: {exc}", file=sys.stderr)
            self.total = None
            return
        self.total += int(got[0]) if got else 0
        self.lsn = end

    def stop(self) -> int | None:
        self.done.set()
        self.join()
        return self.total


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
#: The application_name of this harness's own sessions (the WAL and CPU meters): their
#: backends' CPU is not a run's.
METER = "bench-meter"


def cpu_seconds(pid: int) -> float | None:
    """A process's user + system CPU so far (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def redis_server_pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit() and _comm(int(d)) == "redis-server"]


def cpu_snapshot(
    conn: psycopg.Connection[Any], worker_pid: int, redis_pids: list[int]
) -> dict[str, dict[int, float]]:
    """CPU so far of the worker's parent, its children, this database's client backends
    and redis-server, by pid (``conn``: the meter's own session, left out)."""
    children = Path(f"/proc/{worker_pid}/task/{worker_pid}/children")
    child_pids = [int(x) for x in children.read_text().split()] if children.exists() else []
    backends = [
        r[0] for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND backend_type = 'client backend' AND application_name <> %s",
            [METER],
        )
    ]  # fmt: skip
    groups = dict(zip(CPU_GROUPS, ([worker_pid], child_pids, backends, redis_pids), strict=True))
    snapshot: dict[str, dict[int, float]] = {}
    for name, pids in groups.items():
        snapshot[name] = {p: c for p in pids if (c := cpu_seconds(p)) is not None}
    return snapshot


CPU_GROUPS = ("parent", "children", "postgres", "redis")


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return ""


class CpuMeter(threading.Thread):
    """CPU per group between start and stop, sampled every 0.2 s: the worker closes its
    database connection every ``CELERY_DB_REUSE_MAX`` tasks, so backends come and go. A
    process seen first after the start counts from zero (its whole life is the run's); one
    that ends counts up to its last sample (at most 0.2 s of it is missed)."""

    def __init__(self, db: str, worker_pid: int) -> None:
        super().__init__(daemon=True)
        # One session for every sample: a connection per sample would add a backend's
        # start-up to the server's load five times a second.
        self.conn = psycopg.connect(db, autocommit=True, application_name=METER)
        self.worker_pid = worker_pid
        self.redis_pids = redis_server_pids()  # once: the server outlives the run
        self.first = cpu_snapshot(self.conn, worker_pid, self.redis_pids)
        self.last = {name: dict(pids) for name, pids in self.first.items()}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.2):
            self.sample()

    def sample(self) -> None:
        for name, pids in cpu_snapshot(self.conn, self.worker_pid, self.redis_pids).items():
            self.last[name].update(pids)

    def stop(self, runs: int) -> dict[str, float]:
        """Milliseconds of CPU per run by group."""
        self.done.set()
        self.join()
        self.sample()
        self.conn.close()
        out = {}
        for name, last in self.last.items():
            spent = sum(c - self.first[name].get(p, 0.0) for p, c in last.items())
            out[name] = round(1000 * spent / max(runs, 1), 3)
        return out


def reset(db: str, broker: str) -> None:
    redis.Redis.from_url(broker).flushdb()
    with psycopg.connect(db, autocommit=True) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND "
                "(tablename LIKE 'django_app_%%' OR tablename LIKE 'billing_%%')"
            )
        ]
        if tables:
            conn.execute("TRUNCATE " + ", ".join(f'"{t}"' for t in tables) + " CASCADE")


def wait_for(predicate: Any, deadline: float, what: str) -> None:
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.2)


def line_count(path: Path) -> int:
    try:
        with open(path, "rb") as fh:
            return sum(1 for _ in fh)
    except FileNotFoundError:
        return 0


def seed(n: int, task: str) -> None:
    """``n`` one-off schedules of ``task`` due 2 s from now (Schedule + ScheduleVersion)."""
    import uuid

    from celery_scheduler.core import ids
    from celery_scheduler.core.enums import ScheduleKind
    from django_app import conf
    from django_app.models import Schedule, ScheduleVersion, Tenant

    tenant = Tenant.objects.create(slug="bench", name="bench")
    shards = conf.get().shard_count
    now = datetime.now(UTC)
    at = now + timedelta(seconds=2)
    schedules, versions = [], []
    for i in range(n):
        sid = uuid.uuid4()
        schedules.append(
            Schedule(
                id=sid,
                tenant=tenant,
                name=f"bench-{i}",
                task=task,
                args=[i],
                kind=ScheduleKind.ONE_OFF.value,
                run_at=at,
                next_run_at=at,
                shard=ids.shard_for(sid, shards),
                source="bench",
            )
        )
        versions.append(
            ScheduleVersion(
                schedule_id=sid,
                version=1,
                kind=ScheduleKind.ONE_OFF.value,
                run_at=at,
                valid_from=now,
            )
        )
    Schedule.objects.bulk_create(schedules, batch_size=2000)
    ScheduleVersion.objects.bulk_create(versions, batch_size=2000)


def seed_history(now: datetime, days: int, rows: int) -> None:
    """``days`` daily slots before today's, each holding ``rows`` SUCCEEDED occurrences of
    one schedule and one attempt each, inserted by SQL (history, not the runs measured),
    then analyzed as autovacuum would: the partitions a retention window keeps."""
    from django.db import connection

    from django_app.db import partitions
    from django_app.models import Schedule, Tenant

    tenant, _ = Tenant.objects.get_or_create(slug="history", defaults={"name": "history"})

    partitions.ensure(now, width=timedelta(days=1), ahead=3, behind=days, wait=True)
    schedule = Schedule.objects.create(
        tenant=tenant,
        name="history",
        task="bench.append_line",
        kind="CRON",
        cron="* * * * *",
        state="COMPLETED",  # history only: the beat plans nothing from it
    )
    start = now.replace(hour=0, minute=0, second=0) - timedelta(days=days)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO django_app_occurrence (id, schedule_id, schedule_version, tenant_id, "
            "scheduled_for, available_at, state, manual, overlap_policy, attempt_count, "
            "fencing_token, lease_owner, created_at, last_error, reason) "
            "SELECT gen_random_uuid(), %s, 1, %s, t, t, 'SUCCEEDED', true, '', 1, 1, '', t, "
            "'', '' FROM generate_series(0, %s - 1) g, LATERAL (SELECT %s::timestamptz "
            "+ (g %% %s) * interval '1 day' + (g / %s) * interval '1 second' AS t) x",
            [schedule.pk, tenant.pk, days * rows, start, days, days],
        )
        cursor.execute(
            "INSERT INTO django_app_attempt (occurrence_id, scheduled_for, number, "
            "fencing_token, worker, started_at, finished_at, outcome, error) "
            "SELECT id, scheduled_for, 1, 1, 'history', scheduled_for, scheduled_for, "
            "'SUCCEEDED', '' FROM django_app_occurrence WHERE schedule_id = %s",
            [schedule.pk],
        )
        cursor.execute("ANALYZE django_app_occurrence")
        cursor.execute("ANALYZE django_app_attempt")
    print(f"history: {days} daily slots of {rows:,} occurrences and attempts")


def fill_queue(mode: str, n: int, env: dict[str, str], broker: str, work: Path) -> None:
    queue = redis.Redis.from_url(broker)
    if mode == "plain":
        from bench import worker_tasks
        from example_project.celery import app

        app.set_current()  # shared_task binds to it
        for i in range(n):
            worker_tasks.append_line.apply_async(args=[i])
        return
    seed(n, TASKS[mode])
    with open(work / f"beat-{mode}.log", "ab") as log:
        beat = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "example_project", "beat", "-l", "WARNING",
             "-S", "celery_scheduler.beat:DatabaseScheduler",
             "-s", str(work / "beat-schedule")],
            cwd=CODE, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            wait_for(lambda: queue.llen("celery") >= n, time.monotonic() + 180, "the beat")
        finally:
            stop(beat)


def read_stats(stats: Path) -> Counter[str]:
    total: Counter[str] = Counter()
    for path in stats.glob("*.json"):
        total.update(json.loads(path.read_text()))
        path.unlink()
    return total


#: ``--history-days`` / ``--history-rows``: history seeded before every scheduled point.
HISTORY = (0, 0)


def drop_indexes(db: str, names: list[str]) -> list[str]:
    """Drop ``names`` (partitioned: every partition's too); returns their definitions."""
    definitions = []
    with psycopg.connect(db, autocommit=True) as conn:
        for name in names:
            row = conn.execute("SELECT pg_get_indexdef(%s::regclass)", [name]).fetchone()
            assert row is not None, name
            definitions.append(str(row[0]).replace(" ON ONLY ", " ON "))
            conn.execute(f'DROP INDEX "{name}"')
    if names:
        print(f"dropped for this run: {', '.join(names)}", flush=True)
    return definitions


def restore_indexes(db: str, definitions: list[str]) -> None:
    with psycopg.connect(db, autocommit=True) as conn:
        for definition in definitions:
            conn.execute(definition)


def run_point(mode: str, n: int, c: int, db: str, broker: str, work: Path) -> dict[str, Any]:
    lines = work / f"lines-{mode}-{c}.txt"
    stats = work / "stats"
    stats.mkdir(exist_ok=True)
    read_stats(stats)
    lines.unlink(missing_ok=True)
    env = env_for(db, broker, lines, stats)
    os.environ["BENCH_LINES"] = str(lines)
    reset(db, broker)
    if HISTORY[0] and mode != "plain":
        seed_history(datetime.now(UTC), *HISTORY)
    fill_queue(mode, n, env, broker, work)
    time.sleep(1.5)  # let the beat's backends flush their statistics before the snapshot
    before = db_counters(db)
    wal = WalMeter(db, before["oid"], before["lsn"])
    wal.start()
    with open(work / f"worker-{mode}-{c}.log", "ab") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "example_project", "worker", "-P", "prefork",
             "-c", str(c), "-I", "bench.worker_tasks", "-l", "WARNING"],
            cwd=CODE, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            # CPU is counted from the tenth of the runs on: the worker's start-up is not in it.
            wait_for(lambda: line_count(lines) >= n // 10, time.monotonic() + 900, "runs")
            meter, first_lines = CpuMeter(db, worker.pid), line_count(lines)
            meter.start()
            wait_for(lambda: line_count(lines) >= n, time.monotonic() + 900, f"{n} lines")
            if mode != "plain":
                wait_for(lambda: succeeded(db) >= n, time.monotonic() + 60, "the completions")
            cpu = meter.stop(n - first_lines)
        finally:
            stop(worker)
    time.sleep(1.5)  # backends flush their statistics when they exit
    after = db_counters(db)
    wal_total = wal.stop()
    times = sorted(float(x) for x in lines.read_text().split())
    rate = (len(times) - 1) / (times[-1] - times[0])
    counts = read_stats(stats)
    delta = {k: after[k] - before[k] for k in ("transactions", "sessions", "inserted",
                                               "updated", "deleted")}  # fmt: skip
    point: dict[str, Any] = {
        "mode": mode, "c": c, "n": n, "lines": len(times), "per_s": round(rate, 1),
        "statements_per_run": round(counts["statements"] / n, 2),
        "connections_per_run": round(counts["connections"] / n, 3),
        "verbs_per_run": {
            k.split(":", 1)[1]: round(v / n, 2) for k, v in sorted(counts.items())
            if k.startswith("statements:")
        },
        "transactions_per_run": round(delta["transactions"] / n, 2),
        "sessions_per_run": round(delta["sessions"] / n, 3),
        "rows_written_per_run": round(
            (delta["inserted"] + delta["updated"] + delta["deleted"]) / n, 2
        ),
        "cpu_ms_per_run": cpu,
    }  # fmt: skip
    if mode != "plain":
        point["wal_bytes_per_run"] = None if wal_total is None else round(wal_total / n)
    return point


def succeeded(db: str) -> int:
    with psycopg.connect(db, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM django_app_occurrence o JOIN django_app_tenant t "
            "ON t.id = o.tenant_id WHERE o.state = 'SUCCEEDED' AND t.slug = 'bench'"
        ).fetchone()
    return int(row[0]) if row else 0


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--concurrency", default="1,2,4")
    parser.add_argument("--modes", default="plain,scheduled,idempotent")
    parser.add_argument("--plain", type=int, default=5000, help="plain messages per point")
    parser.add_argument("--runs", type=int, default=2000, help="scheduled runs per point")
    parser.add_argument("--broker", default=DEFAULT_BROKER)
    parser.add_argument(
        "--code", default=str(ROOT), help="a checkout whose worker to run (A/B: an older commit)"
    )
    parser.add_argument(
        "--history-days", type=int, default=0,
        help="daily history slots before today, seeded before each scheduled point",
    )  # fmt: skip
    parser.add_argument("--history-rows", type=int, default=20_000, help="rows per slot")
    parser.add_argument(
        "--drop-index", default="",
        help="comma-separated indexes of the database to drop for this run and create again "
        "at its end: what an index costs the worker path (an experiment, not a setting)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    global CODE, HISTORY
    HISTORY = (args.history_days, args.history_rows)
    CODE = Path(args.code).resolve()
    db = os.environ.get("DATABASE_URL", DEFAULT_DB)
    os.environ.update(
        DATABASE_URL=db, CELERY_BROKER_URL=args.broker,
        DJANGO_SETTINGS_MODULE="example_project.settings",
    )  # fmt: skip
    ensure_database(db)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    work = Path(tempfile.mkdtemp(prefix="worker_rate-"))
    dropped = drop_indexes(db, [x for x in args.drop_index.split(",") if x])
    try:
        points = run_points(args, db, work)
    finally:
        restore_indexes(db, dropped)
    report(points, argv, work)


def run_points(args: argparse.Namespace, db: str, work: Path) -> list[dict[str, Any]]:
    points = []
    for c in [int(x) for x in args.concurrency.split(",")]:
        for mode in args.modes.split(","):
            n = args.plain if mode == "plain" else args.runs
            point = run_point(mode, n, c, db, args.broker, work)
            points.append(point)
            print(json.dumps(point), flush=True)
    return points


def report(points: list[dict[str, Any]], argv: list[str], work: Path) -> None:
    print(f"\n{'-c':>3} {'mode':<11} {'runs/s':>8} {'ratio':>6} {'stmts':>6} {'conns':>6} "
          f"{'xacts':>6} {'rows':>6} {'WAL B':>7}   CPU ms/run: parent children postgres "
          f"redis")  # fmt: skip
    for p in points:
        plain = next((q for q in points if q["mode"] == "plain" and q["c"] == p["c"]), None)
        ratio = f"{p['per_s'] / plain['per_s']:.2f}" if plain else "-"
        print(
            f"{p['c']:>3} {p['mode']:<11} {p['per_s']:>8.1f} {ratio:>6} "
            f"{p['statements_per_run']:>6} {p['connections_per_run']:>6} "
            f"{p['transactions_per_run']:>6} {p['rows_written_per_run']:>6} "
            f"{p.get('wal_bytes_per_run') or '-':>7}   "
            + " ".join(f"{p['cpu_ms_per_run'][k]:.2f}" for k in CPU_GROUPS)
        )
    by_c = {(p["mode"], p["c"]): p for p in points}
    for c in sorted({p["c"] for p in points}):
        s, i = by_c.get(("scheduled", c)), by_c.get(("idempotent", c))
        if s and i:
            extra = 1000 / i["per_s"] - 1000 / s["per_s"]
            print(f"-c {c}: @idempotent_task adds {extra:.2f} ms of wall time per run")
    out = ROOT / "bench" / "results" / f"worker_rate-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"argv": argv, "code": str(CODE), "points": points}, indent=1))
    print(f"wrote {out} (logs in {work})")


if __name__ == "__main__":
    main(sys.argv[1:])
