"""The reconciler over a window of a million occurrences on PostgreSQL: time and peak RSS.

    python -m bench.reconcile_window [--schedules 1000] [--minutes 1000] [--old PATH]

Recreates the PostgreSQL database ``cs_h6_bench`` (migrations), creates ``--schedules``
per-minute cron schedules through the API with a clock frozen at T0 (so each has its
ScheduleVersion), then bulk-inserts one SUCCEEDED occurrence per schedule and minute of
``[T0, T0 + minutes)`` (``INSERT ... SELECT`` with ``generate_series``: 1,000 x 1,000 = one
million rows) and punches holes: 10 rows deleted (ABSENT), and 100 rows of one schedule
deleted under a ``SkippedSpan`` (skipped_by_policy). Then, each in a fresh process (so the
peak RSS, VmHWM, is that run's alone):

- ``stream``: ``iter_reconcile`` over the window, counting statuses (the library);
- ``command``: ``manage.py reconcile --json`` with stdout to /dev/null (the CLI end to end);
- ``old`` (with ``--old PATH``, a checkout of the previous reconciler, e.g.
  ``mkdir /tmp/old && git archive 691b9db | tar -x -C /tmp/old``): its ``reconcile()``
  on the same database.

Prints each run's wall time, peak RSS and status counts, and the plan of one chunk's read.
A narrow window of the same table (index matters, not volume), on the seeded database::

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/cs_h6_bench \\
        DJANGO_SETTINGS_MODULE=example_project.settings \\
        python -m bench.reconcile_window --stage=stream --offset=500 --minutes=60
    (cd /tmp/old && PYTHONPATH=. ... python /path/to/bench/reconcile_window.py --stage=old ...)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PG = "postgres://postgres@127.0.0.1:5432"
DB = "cs_h6_bench"
T0 = datetime(2026, 1, 5, 0, 0, tzinfo=UTC)


def peak_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise KeyError("VmHWM")


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": f"{PG}/{DB}",
        "DJANGO_SETTINGS_MODULE": "example_project.settings",
    }


def seed(schedules: int, minutes: int) -> None:
    import django

    django.setup()
    from django.db import connection

    from celery_scheduler import api
    from celery_scheduler.core.clock import FrozenClock
    from django_app.models import Occurrence, Schedule, SkippedSpan

    clock = FrozenClock(T0)
    started = time.perf_counter()
    for i in range(schedules):
        api.create_schedule(name=f"bench-{i}", task="billing.ping", cron="* * * * *", clock=clock)
    table = connection.ops.quote_name(Occurrence._meta.db_table)
    with connection.cursor() as cur:
        cur.execute(
            f"INSERT INTO {table} (id, schedule_id, schedule_version, tenant_id, scheduled_for, "
            "available_at, state, manual, attempt_count, fencing_token, lease_owner, "
            "created_at, last_error, reason) "
            "SELECT gen_random_uuid(), s.id, s.version, s.tenant_id, t, t, 'SUCCEEDED', false, "
            "1, 1, '', t, '', '' FROM django_app_schedule s "
            "CROSS JOIN generate_series(%s::timestamptz, %s::timestamptz, interval '1 minute') t",
            [T0, T0 + timedelta(minutes=minutes - 1)],
        )
        cur.execute(f"DELETE FROM {table} WHERE id IN (SELECT id FROM {table} LIMIT 10)")
        cur.execute(f"ANALYZE {table}")
    jumped = Schedule.objects.order_by("id").last()
    assert jumped is not None
    span_end = T0 + timedelta(minutes=100)
    Occurrence.objects.filter(schedule=jumped, scheduled_for__lt=span_end).delete()
    SkippedSpan.objects.create(
        schedule=jumped, schedule_version=jumped.version, first_at=T0, resume_at=span_end,
        recorded_at=span_end, reason="bench",
    )  # fmt: skip
    rows = Occurrence.objects.count()
    print(f"seeded {schedules} schedules, {rows:,} occurrences in "
          f"{time.perf_counter() - started:.1f} s")  # fmt: skip


def run_stream(minutes: int, offset: int) -> None:
    import django

    django.setup()
    from django_app.operations.reconcile import iter_reconcile, occurrence_window

    started = time.perf_counter()
    counts: Counter[str] = Counter()
    start = T0 + timedelta(minutes=offset)
    end = start + timedelta(minutes=minutes)
    for item in iter_reconcile(start=start, end=end, now=datetime.now(UTC)):
        counts[item.status] += 1
    report("stream", started, counts)
    from django_app.models import Schedule

    first = list(Schedule.objects.order_by("id").values_list("id", flat=True)[:500])
    plan = occurrence_window(first, start, end).explain().splitlines()
    print("chunk read plan:", " / ".join(x.strip() for x in plan if "Scan" in x))


def run_old(minutes: int, offset: int) -> None:
    import django

    django.setup()
    from django_app.operations.reconcile import reconcile  # the old module: cwd is the old checkout

    started = time.perf_counter()
    start = T0 + timedelta(minutes=offset)
    result = reconcile(start=start, end=start + timedelta(minutes=minutes), now=datetime.now(UTC))
    report("old", started, Counter(result.counts))


def report(label: str, started: float, counts: Counter[str]) -> None:
    elapsed = time.perf_counter() - started
    total = sum(v for k, v in counts.items() if k != "unexpected")
    print(json.dumps({"run": label, "seconds": round(elapsed, 1), "peak_rss_mb": round(peak_mb()),
                      "expected": total, "counts": dict(sorted(counts.items()))}))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schedules", type=int, default=1000)
    parser.add_argument("--minutes", type=int, default=1000)
    parser.add_argument("--old", default="", help="checkout of the previous reconciler")
    parser.add_argument("--stage", default="all", choices=["all", "seed", "stream", "old"])
    parser.add_argument(
        "--offset", type=int, default=0, help="stream/old stages: window starts T0 + this (min)"
    )
    args = parser.parse_args()
    if args.stage == "seed":
        return seed(args.schedules, args.minutes)
    if args.stage == "stream":
        return run_stream(args.minutes, args.offset)
    if args.stage == "old":
        return run_old(args.minutes, args.offset)
    import psycopg

    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{DB}"')
    env = _env()
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    me = [sys.executable, "-m", "bench.reconcile_window", f"--schedules={args.schedules}",
          f"--minutes={args.minutes}"]  # fmt: skip
    subprocess.run([*me, "--stage=seed"], cwd=ROOT, env=env, check=True)
    subprocess.run([*me, "--stage=stream"], cwd=ROOT, env=env, check=True)
    end = (T0 + timedelta(minutes=args.minutes)).isoformat()
    probe = (
        "import resource, subprocess, sys, time; t = time.perf_counter(); "
        "rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode; "
        "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024; "
        'print(f\'{{"run": "command", "seconds": {time.perf_counter() - t:.1f}, '
        '"peak_rss_mb": {peak:.0f}, "exit": {rc}}}\')'
    )
    subprocess.run(
        [sys.executable, "-c", probe, *manage, "reconcile", "--from", T0.isoformat(),
         "--to", end, "--json"],
        cwd=ROOT, env=env, check=True,
    )  # fmt: skip
    if args.old:
        # Run as a script with the old checkout first on the path: its django_app is imported.
        script = [sys.executable, str(Path(__file__).resolve()), "--stage=old",
                  f"--minutes={args.minutes}"]  # fmt: skip
        subprocess.run(script, cwd=args.old, env={**env, "PYTHONPATH": args.old}, check=True)


if __name__ == "__main__":
    main()
