"""Create throughput on PostgreSQL: single creates, bulk creates, and a 1,000,000-row load.

``python -m bench.create_rate [--db NAME] [--single 2000] [--batch 10000] [--total 1000000]
[--drop-index a,b]`` drops and recreates the database ``NAME`` (default ``cs_create_bench``) on
``postgres://postgres@127.0.0.1:5432``, migrates it, then times, in one process:

* ``create_schedule`` one at a time (rows/s), once with the server's commit settings (every
  commit waits for its WAL flush: the disk's fsync bounds it) and once with
  ``synchronous_commit = off`` for the session (what the code itself costs);
* ``create_schedules`` in batches of ``--batch`` (rows/s of each batch, median);
* loading ``--total`` schedules through ``create_schedules`` (wall time, rows/s).

Items vary like a real load: 60 cron minutes in 4 time zones, every fifth an interval, every
tenth with tags, every item with an idempotency key (the lookup is part of the cost). The
items of a batch are built before its timer starts. ``--drop-index a,b`` drops those indexes
after the migration: what each costs a create.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from datetime import timedelta
from typing import Any

import django

ZONES = ("UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo")


def item(n: int, prefix: str) -> dict[str, Any]:
    value: dict[str, Any] = {
        "name": f"{prefix} job {n}",
        "task": "billing.ping",
        "idempotency_key": f"{prefix}-{n}",
        "kwargs": {"customer": f"c-{n % 997}"},
    }
    if n % 5 == 0:
        value["interval"] = 60 * (1 + n % 30)
    else:
        value["cron"] = f"{n % 60} {n % 24} * * *"
        value["timezone"] = ZONES[n % len(ZONES)]
    if n % 10 == 0:
        value["tags"] = {"team": f"t{n % 7}", "env": "prod"}
    return value


class Cpu:
    """CPU seconds used by this process and by its PostgreSQL backend (same machine: the
    backend's /proc stat), so the code's cost reads apart from what other processes take."""

    def __init__(self) -> None:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            self.pid = cursor.fetchone()[0]
        self.tick = os.sysconf("SC_CLK_TCK")

    def read(self) -> tuple[float, float]:
        try:
            with open(f"/proc/{self.pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            server = (int(fields[11]) + int(fields[12])) / self.tick  # utime + stime
        except OSError:
            server = float("nan")
        return time.process_time(), server

    def per_row(self, start: tuple[float, float], rows: int) -> str:
        client, server = (b - a for a, b in zip(start, self.read(), strict=True))
        return (
            f"cpu/row: client {client * 1e6 / rows:,.0f} us, server {server * 1e6 / rows:,.0f} us"
        )


def fresh_database(name: str) -> None:
    import psycopg

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{name}"')


def migrated_database(name: str) -> None:
    """A fresh database ``name``, Django set up on it and its migrations applied."""
    fresh_database(name)
    os.environ["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{name}"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="cs_create_bench")
    parser.add_argument("--single", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--total", type=int, default=1_000_000)
    parser.add_argument("--drop-index", default="", help="comma-separated index names")
    args = parser.parse_args()

    fresh_database(args.db)
    os.environ["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{args.db}"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
    django.setup()
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    dropped = [name for name in args.drop_index.split(",") if name]
    with connection.cursor() as cursor:
        for name in dropped:
            cursor.execute(f'DROP INDEX "{name}"')
    if dropped:
        print(f"dropped for this run: {', '.join(dropped)}", flush=True)

    from celery_scheduler import api
    from django_app.models import AuditEntry, Schedule, ScheduleTag, ScheduleVersion

    api.create_tenant("bench")
    api.create_schedule(name="warm", task="billing.ping", cron="* * * * *", tenant="bench")

    rows: list[tuple[str, str]] = []
    cpu = Cpu()

    def single(label: str, prefix: str) -> None:
        items = [item(n, prefix) for n in range(args.single)]
        start = cpu.read()
        t0 = time.perf_counter()
        for value in items:
            api.create_schedule(**value, tenant="bench")
        elapsed = time.perf_counter() - t0
        rows.append(
            (
                label,
                f"{args.single / elapsed:,.0f} rows/s  ({elapsed * 1e3 / args.single:.2f} ms "
                f"each; {cpu.per_row(start, args.single)})",
            )
        )

    single(f"create_schedule x {args.single:,} (durable commits)", "single")
    with connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit = off")
    single(f"create_schedule x {args.single:,} (synchronous_commit=off)", "single-async")
    with connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit = on")

    rates = []
    batches_cpu = cpu.read()
    for b in range(5):
        items = [item(n, f"batch{b}") for n in range(args.batch)]
        t0 = time.perf_counter()
        report = api.create_schedules(items, tenant="bench")
        elapsed = time.perf_counter() - t0
        assert report.created == args.batch
        rates.append(args.batch / elapsed)
    rows.append(
        (
            f"create_schedules, batch {args.batch:,} (x5)",
            f"{statistics.median(rates):,.0f} rows/s median  "
            f"(min {min(rates):,.0f}, max {max(rates):,.0f}; "
            f"{cpu.per_row(batches_cpu, 5 * args.batch)}, item building included)",
        )
    )

    loaded = 0
    build = 0.0
    load_cpu = cpu.read()
    t0 = time.perf_counter()
    while loaded < args.total:  # --total 0: no load
        size = min(args.batch, args.total - loaded)
        b0 = time.perf_counter()
        items = [item(n, "load") for n in range(loaded, loaded + size)]
        build += time.perf_counter() - b0
        api.create_schedules(items, tenant="bench")
        loaded += size
    wall = time.perf_counter() - t0
    load = wall - build
    if args.total:
        rows.append(
            (
                f"load {args.total:,} via create_schedules",
                f"{timedelta(seconds=round(load))} ({args.total / load:,.0f} rows/s; "
                f"+{build:.0f} s building the items; {cpu.per_row(load_cpu, args.total)})",
            )
        )

    total = Schedule.objects.count()
    print(
        f"PostgreSQL {connection.pg_version}, {os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.1f}; "
        f"{total:,} schedules, {ScheduleVersion.objects.count():,} versions, "
        f"{ScheduleTag.objects.count():,} tags, {AuditEntry.objects.count():,} audit entries"
    )
    width = max(len(label) for label, _ in rows)
    for label, figure in rows:
        print(f"  {label:<{width}}  {figure}")


if __name__ == "__main__":
    main()
