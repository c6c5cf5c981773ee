"""Memory of a burst held in one BurstRelay: RSS before and after claiming N prepared rows.

    python -m bench.held_memory --n 100000 [--fire] [--history-days 0] [--history-rows 20000]

Recreates the PostgreSQL database ``cs_scale_mem``, seeds N one-off schedules due in
``lead`` seconds (``bench.seed``), materializes them with the set-based materializer, then
one :class:`django_app.relay.burst.BurstRelay` with the Redis fast publisher claims and prepares
all of them (nothing is published: the rows are released at the end). Prints the process
RSS before and after the claim, the peak (VmHWM), the held count and bytes per held row.
``--history-days D`` first seeds D daily history slots before today's (``--history-rows``
finished occurrences and attempts each, by SQL, as ``bench.worker_rate`` does): with
``--fire``, what the wave's statements pay for the slots a retention window keeps.
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PG = "postgres://postgres@127.0.0.1:5432"
DB = "cs_scale_mem"
BROKER = "redis://127.0.0.1:6379/12"


def status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--lead", type=float, default=600.0, help="seconds to T")
    parser.add_argument("--fire", action="store_true", help="then lock, publish, mark")
    parser.add_argument("--history-days", type=int, default=0)
    parser.add_argument("--history-rows", type=int, default=20_000)
    args = parser.parse_args()
    import psycopg

    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{DB}"')
    os.environ.update(
        DATABASE_URL=f"{PG}/{DB}",
        CELERY_BROKER_URL=BROKER,
        DJANGO_SETTINGS_MODULE="example_project.settings",
    )
    at = (datetime.now(UTC) + timedelta(seconds=args.lead)).replace(microsecond=0)
    subprocess.run(
        [sys.executable, "-m", "bench.seed", "ours", str(args.n), at.isoformat()],
        cwd=ROOT,
        check=True,
    )
    import django

    django.setup()
    from celery_scheduler.core.clock import SYSTEM_CLOCK
    from celery_scheduler.publishers.redis_fast import publisher_for
    from django_app.materialize.set_based import materialize_due_bulk
    from django_app.relay.burst import BurstRelay
    from example_project.celery import app

    if args.history_days:
        from bench.worker_rate import seed_history

        seed_history(datetime.now(UTC), args.history_days, args.history_rows)
    report = materialize_due_bulk(clock=SYSTEM_CLOCK, horizon=timedelta(seconds=args.lead + 60))
    print(f"materialized {report.occurrences_created} occurrences")
    relay = BurstRelay(
        clock=SYSTEM_CLOCK,
        publisher=publisher_for(app),
        node="held-memory",
        lookahead=timedelta(seconds=args.lead + 60),
        max_rows=args.n,
    )
    gc.collect()
    before = status_mb("VmRSS")
    relay.claim_ahead()
    gc.collect()
    after, peak = status_mb("VmRSS"), status_mb("VmHWM")
    held = relay.held()
    per_row = (after - before) * 1024 * 1024 / held if held else float("nan")
    print(
        f"held {held} rows: RSS {before:.0f} MB -> {after:.0f} MB "
        f"({per_row:.0f} bytes/row), peak {peak:.0f} MB; stages {relay.stats.rates()}"
    )
    if args.fire:
        # Fire the held wave at once (a frozen clock at its instant: no waiting) to time
        # the lock / publish / mark stages on a fresh table; the messages go to Redis db 12.
        import redis
        from django.db import connection

        from celery_scheduler.core.clock import FrozenClock

        slow: list[tuple[float, str]] = []

        def timed(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            started = time.perf_counter()
            try:
                return execute(sql, params, many, context)
            finally:
                slow.append((time.perf_counter() - started, " ".join(sql.split())[:90]))

        relay.clock = FrozenClock(at)
        with connection.execute_wrapper(timed):
            fired = relay.publish_held()
        for seconds, sql in sorted(slow, reverse=True)[:6]:
            print(f"  {seconds:7.3f}s  {sql}")
        print(f"fired: {fired}; stages {relay.stats.rates()}")
        redis.Redis.from_url(BROKER).flushdb()
    print(f"released {relay.close()} claim(s)")


if __name__ == "__main__":
    main()
