"""What one beat poll costs when nothing is due, at 1,000,000 schedules (PostgreSQL).

    python -m bench.poll_cost [--schedules 1000000] [--history 1000000] [--reuse]

Recreates the database ``cs_poll_bench`` (unless ``--reuse`` finds it seeded), inserts
``--schedules`` ACTIVE cron schedules whose next fire is a day ahead (none due, none within
the largest horizon) and ``--history`` past occurrences with their sent outbox rows, by
set-based SQL, then ANALYZEs. Then drives ``DatabaseScheduler`` in process with the
defaults of PostgreSQL + Redis (set-based materializer, burst relay, shard leases; a
recording publisher, so no broker is needed), one poll per tick, and prints per poll: the
wall time (p50, max), the number of queries, and each query's time with its plan's scan
kinds: a poll must read index ranges of what is due, never scan the tables.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta

PG = "postgres://postgres@127.0.0.1:5432"
DB = "cs_poll_bench"


def _psql(sql: str, db: str = "postgres") -> str:
    out = subprocess.run(
        ["psql", f"{PG}/{db}", "-Atqc", sql], check=True, capture_output=True, text=True
    )
    return out.stdout.strip()


def seed(schedules: int, history: int) -> None:
    from django.core.management import call_command
    from django.db import connection

    from django_app.models import Occurrence, OutboxEntry, Schedule, Tenant

    call_command("migrate", verbosity=0)
    tenant = Tenant.objects.create(slug="bench", name="bench")
    template = Schedule.objects.create(
        tenant=tenant, name="t", task="billing.ping", kind="CRON", cron="0 3 * * *",
        next_run_at=datetime.now(UTC) + timedelta(days=1),
    )  # fmt: skip
    cols = [f.column for f in Schedule._meta.concrete_fields]
    generated = {
        "id": "gen_random_uuid()",
        "shard": "g %% 64",
        "name": "'s' || g",
    }
    select = ", ".join(generated.get(c, c) for c in cols)
    table = Schedule._meta.db_table
    with connection.cursor() as cur:
        cur.execute(
            f"INSERT INTO {table} ({', '.join(cols)}) SELECT {select} "
            f"FROM {table}, generate_series(2, %s) g WHERE id = %s",
            [schedules, template.id],
        )
        cur.execute(
            "INSERT INTO django_app_schedulecursor (schedule_id, shard, version, active, "
            "next_run_at) SELECT id, shard, version, true, now() + interval '1 day' + "
            f"(abs(hashtext(id::text)) %% 3600) * interval '1 second' FROM {table} "
            "ON CONFLICT DO NOTHING"
        )
        occ, box = Occurrence._meta.db_table, OutboxEntry._meta.db_table
        cur.execute(
            f"INSERT INTO {occ} (id, schedule_id, schedule_version, scheduled_for, available_at,"
            " state, manual, attempt_count, fencing_token, lease_owner, created_at,"
            " enqueued_at, finished_at, last_error, reason, tenant_id, overlap_policy)"
            " SELECT gen_random_uuid(), %s, 1, now() - g * interval '1 second',"
            " now() - g * interval '1 second', 'SUCCEEDED', false, 1, 0, '', now(), now(),"
            " now(), '', '', %s, 'ALLOW' FROM generate_series(1, %s) g",
            [template.id, tenant.id, history],
        )
        cur.execute(
            f"INSERT INTO {box} (occurrence_id, tenant_id, shard, available_at, priority,"
            " sent_at, publish_count, claimed_by, created_at)"
            f" SELECT id, tenant_id, 0, available_at, 0, available_at, 1, 'bench', now()"
            f" FROM {occ}"
        )
        for t in (table, occ, box):
            cur.execute(f"ANALYZE {t}")


def plan_kinds(sql: str) -> str:
    """The scan kinds of a captured (interpolated) statement's plan."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("EXPLAIN " + sql.replace("%", "%%"))
        plan = "\n".join(r[0] for r in cur.fetchall())
    kinds = [k for k in ("Seq Scan", "Index Only Scan", "Index Scan", "Bitmap") if k in plan]
    return ", ".join(kinds) or "no table read"


def measure(polls: int) -> None:
    from celery import Celery
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from celery_scheduler.beat import DatabaseScheduler
    from celery_scheduler.core.clock import FrozenClock
    from celery_scheduler.publishers import RecordingPublisher

    app = Celery("poll-cost", set_as_current=False)
    app.conf.broker_url = "redis://127.0.0.1:6379/12"  # selects the burst relay; never used
    clock = FrozenClock(datetime.now(UTC))
    beat = DatabaseScheduler(
        app=app, clock=clock, publisher=RecordingPublisher(), lease_keeper=False
    )
    beat.tick()  # first poll: leases, static sync, relay set-up
    clock.advance(beat.poll_interval)
    walls: list[float] = []
    per_query: dict[str, list[float]] = defaultdict(list)
    sample: dict[str, str] = {}
    counts: list[int] = []
    for _ in range(polls):
        with CaptureQueriesContext(connection) as ctx:
            started = time.perf_counter()
            beat.tick()
            walls.append((time.perf_counter() - started) * 1000)
        counts.append(len(ctx.captured_queries))
        for q in ctx.captured_queries:
            key = re.sub(r"'[^']*'(::\w+)?|\b\d+\b", "?", " ".join(q["sql"].split()))[:110]
            per_query[key].append(float(q["time"]) * 1000)
            sample.setdefault(key, q["sql"])
        clock.advance(beat.poll_interval)
    beat.close()
    print(f"polls: {polls}; wall ms p50 {statistics.median(walls):.1f}, max {max(walls):.1f}; "
          f"queries per poll {min(counts)}-{max(counts)}")  # fmt: skip
    print(f"{'ms (median)':>11}  {'runs':>4}  {'plan':<28} query")
    for key, times in sorted(per_query.items(), key=lambda kv: -statistics.median(kv[1])):
        kinds = plan_kinds(sample[key]) if key.startswith(("SELECT", "UPDATE")) else ""
        print(f"{statistics.median(times):11.2f}  {len(times):4d}  {kinds:<28} {key}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--schedules", type=int, default=1_000_000)
    parser.add_argument("--history", type=int, default=1_000_000)
    parser.add_argument("--polls", type=int, default=30)
    parser.add_argument("--reuse", action="store_true")
    args = parser.parse_args()
    os.environ["DATABASE_URL"] = f"{PG}/{DB}"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
    exists = _psql(f"SELECT 1 FROM pg_database WHERE datname = '{DB}'") == "1"
    if not (args.reuse and exists):
        _psql(f"DROP DATABASE IF EXISTS {DB}")
        _psql(f"CREATE DATABASE {DB}")
    import django

    django.setup()
    if not (args.reuse and exists):
        started = time.perf_counter()
        seed(args.schedules, args.history)
        print(f"seeded {args.schedules:,} schedules and {args.history:,} past occurrences "
              f"in {time.perf_counter() - started:.0f} s", file=sys.stderr)  # fmt: skip
    measure(args.polls)


if __name__ == "__main__":
    main()
