"""One materializer pass over N hourly crons, in one process, optionally A/B against a migration.

``python -m bench.materialize_rate [--n 100000] [--rounds 2] [--against 0016] [--per-shard]``

Recreates the PostgreSQL database ``cs_mat_ab``, migrates it, creates N hourly crons due
in a few minutes through ``api.create_schedules``, then times ``materialize_due_bulk`` (the
beat's planning step) over all of them. Before each timed pass the occurrences and outbox
rows are deleted, the cursors reset and the tables vacuumed, so every pass plans the same
N rows from the same state. With ``--against M`` each round also migrates ``django_app``
back to ``M``, times a pass there, and migrates forward again: the same rows with and
without what the migrations after ``M`` changed (``--against 0016``: the seven foreign-key
indexes that 0017 dropped). ``--per-shard`` plans shard by shard, one call per shard, as a
beat does (``DatabaseScheduler._materialize_shards``).
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import UTC, datetime, timedelta

import django
import psycopg

PG = "postgresql://postgres@127.0.0.1:5432"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--against", default="", help="a django_app migration to compare")
    parser.add_argument("--db", default="cs_mat_ab")
    parser.add_argument("--per-shard", action="store_true", help="one call per shard, as a beat")
    args = parser.parse_args()

    with psycopg.connect(f"{PG}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{args.db}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{args.db}"')
    os.environ["DATABASE_URL"] = f"{PG}/{args.db}"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from celery_scheduler import api
    from celery_scheduler.core.clock import FrozenClock
    from django_app import conf
    from django_app.materialize.set_based import materialize_due_bulk

    call_command("migrate", verbosity=0)
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    due = now + timedelta(minutes=5)
    api.create_tenant("bench")
    items = [
        {"name": f"job {n}", "task": "billing.ping", "cron": f"{due.minute} * * * *",
         "kwargs": {"customer": n}}
        for n in range(args.n)
    ]  # fmt: skip
    for start in range(0, args.n, 10_000):
        api.create_schedules(items[start : start + 10_000], tenant="bench")

    def reset() -> None:
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM django_app_outboxentry")
            cursor.execute("DELETE FROM django_app_occurrence")
            cursor.execute("UPDATE django_app_schedulecursor SET next_run_at = %s", [due])
        connection.close()
        with psycopg.connect(f"{PG}/{args.db}", autocommit=True) as direct:
            for table in ("schedule", "schedulecursor", "occurrence", "outboxentry"):
                direct.execute(f"VACUUM (ANALYZE) django_app_{table}")

    def timed(label: str) -> None:
        reset()
        t0 = time.perf_counter()
        cpu0 = time.process_time()
        horizon = timedelta(minutes=30)
        if args.per_shard:
            created = sum(
                materialize_due_bulk(
                    clock=FrozenClock(now), horizon=horizon, shards=[shard]
                ).occurrences_created
                for shard in range(conf.get().shard_count)
            )
        else:
            created = materialize_due_bulk(
                clock=FrozenClock(now), horizon=horizon
            ).occurrences_created
        elapsed = time.perf_counter() - t0
        client = (time.process_time() - cpu0) / max(created, 1) * 1e6
        print(
            f"  {label:<28} {created:,} rows in {elapsed:.1f} s: "
            f"{created / elapsed:,.0f} rows/s (client CPU {client:.0f} us/row)",
            flush=True,
        )

    calls = "one call per shard" if args.per_shard else "one call"
    print(f"materializer pass, {args.n:,} hourly crons, {calls}, load {os.getloadavg()[0]:.2f}")
    for round_ in range(args.rounds):
        timed(f"head, round {round_}")
        if args.against:
            call_command("migrate", "django_app", args.against, verbosity=0)
            timed(f"at {args.against}, round {round_}")
            call_command("migrate", verbosity=0)


if __name__ == "__main__":
    main()
