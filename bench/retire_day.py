"""Retiring a day of history on PostgreSQL: what ``partitions.drop_old`` (the beats' round
with ``partition_retention_days``, and ``manage.py partitions drop``) costs, and how long
the run path waits for it.

``python -m bench.retire_day [--rows 1000000] [--schedules 10000] [--db cs_retire_day]``

Recreates the PostgreSQL database ``--db``, migrates it and seeds, by SQL (history, not the
measured path), two past daily slots of ``--rows`` SUCCEEDED occurrences each, spread over
``--schedules`` schedules, with their attempts and sent outbox rows; the newer of the two
also holds one DEAD occurrence, which retention keeps (so that slot is refused). Today's
slot holds one RUNNING occurrence. Then VACUUM ANALYZE (what autovacuum would have done),
and:

- **the bookkeeping's memory**: ``record_pruned`` over the older slot in a transaction
  rolled back, its peak Python memory by ``tracemalloc``;

- **one round**: ``drop_old`` with both slots expired, which drops the older and refuses the
  newer, while two other connections update today's occurrence in a loop, as a worker's
  heartbeat and claim would: one planned on each call (a custom plan, which locks today's
  partition only), one on a generic plan (prepared, ``plan_cache_mode =
  force_generic_plan``: a warm worker's claim function, which locks every partition of the
  history when it starts, on PostgreSQL before 17). For each, the round's seconds, how long
  its updates were held by a lock (in all, and the longest wait), and the longest of the
  others;
- **a refused round**: ``drop_old`` again, with only the refused slot left: the median of 3
  (what each beat pays every maintenance round while a DEAD row holds a slot back).
"""

from __future__ import annotations

import argparse
import threading
import time
import tracemalloc
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from bench.create_rate import migrated_database
from bench.seed_scale import median_ms, seed_day

DAY = timedelta(days=1)
#: The run path's two kinds of plan (StallProbe).
PLANS = ("custom", "generic")


def seed(rows: int, schedules: int, today: datetime) -> tuple[Any, datetime]:
    """Seed the two past slots and today's RUNNING row; returns the row's key."""
    from django.db import connection

    from django_app.db import partitions
    from django_app.models import Occurrence, Schedule, Tenant

    partitions.ensure(today, width=DAY, ahead=1, behind=9, wait=True)
    tenant = Tenant.objects.create(slug="history")
    history_only = {"task": "bench.append_line", "kind": "CRON", "cron": "* * * * *"}
    made = Schedule.objects.bulk_create(
        Schedule(tenant=tenant, name=f"history-{i}", state="COMPLETED", **history_only)
        for i in range(schedules)
    )
    ids = [s.pk for s in made]
    with connection.cursor() as cur:
        for d in (9, 8):
            seed_day(cur, ids, tenant.pk, day=today - d * DAY, n=rows // schedules)
            print(f"  {today - d * DAY:%Y-%m-%d}: {rows:,} occurrences seeded", flush=True)
    held = Occurrence.objects.filter(scheduled_for__gte=today - 8 * DAY).order_by("?")[:1]
    Occurrence.objects.filter(pk__in=[o.pk for o in held]).update(state="DEAD")
    live = Occurrence.objects.create(
        id=uuid.uuid4(), schedule=made[0], schedule_version=1, tenant=tenant,
        scheduled_for=today, available_at=today, state="RUNNING", manual=True,
    )  # fmt: skip
    with connection.cursor() as cur:
        cur.execute(
            "VACUUM ANALYZE django_app_occurrence, django_app_attempt, django_app_outboxentry"
        )
    return live.pk, today


def bookkeeping_peak(start: datetime) -> float:
    """Peak MB of Python memory (tracemalloc) of ``record_pruned`` over the day's slot from
    ``start``, in a transaction rolled back."""
    from django.db import transaction

    from django_app.models import Occurrence
    from django_app.operations import retention

    tracemalloc.start()
    with transaction.atomic():
        retention.record_pruned(
            Occurrence.objects.filter(scheduled_for__gte=start, scheduled_for__lt=start + DAY)
        )
        transaction.set_rollback(True)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / 1e6


class StallProbe(threading.Thread):
    """Updates one of today's occurrences in a loop on its own connection, each statement
    with a 50 ms lock timeout (retried at once): keeps the spans it was held by a lock
    (first timeout to next success) apart from the other statements' latencies (the
    machine's own stalls: I/O, CPU)."""

    def __init__(self, url: str, occurrence: Any, at: datetime, *, generic: bool) -> None:
        super().__init__(daemon=True)
        self.url, self.key, self.generic = url, (occurrence, at), generic
        self.latencies: list[float] = []
        self.locked: list[float] = []
        self.done = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("SET lock_timeout = '50ms'")
            if self.generic:
                conn.execute("SET plan_cache_mode = force_generic_plan")
            blocked_since = None
            while not self.done.is_set():
                started = time.perf_counter()
                try:
                    conn.execute(
                        "UPDATE django_app_occurrence SET reason = 'heartbeat' "
                        "WHERE id = %s AND scheduled_for = %s",
                        self.key,
                        prepare=self.generic,
                    )
                except psycopg.errors.LockNotAvailable:
                    blocked_since = blocked_since or started
                    continue
                now = time.perf_counter()
                if blocked_since:
                    self.locked.append(now - blocked_since)
                    blocked_since = None
                else:
                    self.latencies.append(now - started)
                time.sleep(0.002)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--db", default="cs_retire_day")
    args = parser.parse_args()

    migrated_database(args.db)
    from django_app.db import partitions
    from django_app.operations import retention

    now = datetime.now(UTC)
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    began = time.perf_counter()
    live, at = seed(args.rows, args.schedules, today)
    print(f"seeded in {time.perf_counter() - began:.0f} s", flush=True)
    print(f"record_pruned of the older slot: peak {bookkeeping_peak(today - 9 * DAY):.1f} MB "
          "of Python memory (tracemalloc; rolled back)", flush=True)  # fmt: skip

    url = f"postgres://postgres@127.0.0.1:5432/{args.db}"
    probes = {plan: StallProbe(url, live, at, generic=plan == "generic") for plan in PLANS}
    for probe in probes.values():
        probe.start()
    time.sleep(0.5)
    started = time.perf_counter()
    report = partitions.drop_old(now, now - (today - 7 * DAY), on_prune=retention.record_pruned)
    took = time.perf_counter() - started
    time.sleep(0.5)
    for probe in probes.values():
        probe.done.set()
        probe.join()
    print(f"one round: {took:.2f} s; dropped {report.dropped} ({report.rows}); "
          f"refused {list(report.refused)}", flush=True)  # fmt: skip
    for plan, probe in probes.items():
        held = sorted(probe.locked) or [0.0]
        print(f"run path ({plan} plan) held by a lock: {len(probe.locked)} times, "
              f"{sum(held) * 1000:.0f} ms in all, longest {held[-1] * 1000:.0f} ms; other "
              f"updates: {len(probe.latencies)}, longest {max(probe.latencies) * 1000:.0f} ms",
              flush=True)  # fmt: skip

    def refused_round() -> None:
        again = partitions.drop_old(now, now - (today - 7 * DAY), on_prune=retention.record_pruned)
        assert again.refused, again
        assert not again.dropped, again

    print(f"a refused round: {median_ms(refused_round, 3):.1f} ms", flush=True)


if __name__ == "__main__":
    main()
