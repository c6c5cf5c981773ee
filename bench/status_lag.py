"""``scheduler_status`` (and ``/status`` on the metrics port) against the history it reads.

``python -m bench.status_lag [--days 4] [--rows-per-day 1000000] [--db cs_status_lag]``

Recreates the PostgreSQL database ``--db``, migrates it and seeds, by SQL, ``--days`` past
daily slots of ``--rows-per-day`` sent occurrences each, plus today's share of a day up to
now (each sent a second after its time), then ANALYZE. Times ``health.status()`` (median of
5 after one warm-up call) and the lag window it reads (``health.lag_window``: occurrences
scheduled in the last 5 minutes and sent), and, for comparison, the window the status read
before: occurrences *enqueued* in the last 5 minutes, which no index or partition bound
could narrow. Its cost grows with the retention window; the lag window's should not.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.create_rate import migrated_database
from bench.seed_scale import insert_succeeded


def seed(days: int, rows: int, now: datetime) -> int:
    from django.db import connection

    from django_app.db import partitions
    from django_app.models import Schedule, Tenant

    partitions.ensure(now, width=timedelta(days=1), ahead=1, behind=days, wait=True)
    tenant = Tenant.objects.create(slug="history")
    schedule = Schedule.objects.create(
        tenant=tenant, name="history", task="bench.append_line", kind="CRON",
        cron="* * * * *", state="COMPLETED",  # history only
    )  # fmt: skip
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    total = 0
    with connection.cursor() as cur:
        for d in range(days, -1, -1):
            start = today - timedelta(days=d)
            n = rows if d else int(rows * (now - today) / timedelta(days=1))
            insert_succeeded(
                cur, schedule.pk, tenant.pk, start=start, n=n, step=86_400 / rows,
                sent_after=1.0,
            )  # fmt: skip
            total += n
            print(f"  {start:%Y-%m-%d}: {n:,} occurrences", flush=True)
        cur.execute("ANALYZE django_app_occurrence")
    return total


def median_ms(call: Callable[[], Any]) -> tuple[float, Any]:
    result = call()
    times = []
    for _ in range(5):
        began = time.perf_counter()
        result = call()
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=4)
    parser.add_argument("--rows-per-day", type=int, default=1_000_000)
    parser.add_argument("--db", default="cs_status_lag")
    args = parser.parse_args()

    migrated_database(args.db)
    from django_app.models import Occurrence
    from django_app.operations import health

    now = datetime.now(UTC).replace(microsecond=0)
    total = seed(args.days, args.rows_per_day, now)
    since = now - timedelta(minutes=5)
    enqueued = (
        Occurrence.objects.filter(manual=False, enqueued_at__gte=since, enqueued_at__lte=now)
        .order_by("-enqueued_at")
        .values_list("enqueued_at", "scheduled_for")[: health.LAG_SAMPLE_LIMIT]
    )
    status_ms, report = median_ms(lambda: health.status(lag_minutes=5))
    window_ms, rows = median_ms(lambda: list(health.lag_window(now, 5)))
    before_ms, before = median_ms(lambda: list(enqueued.all()))
    print(f"occurrences: {total:,} ({args.days} past days and today's so far)")
    print(f"health.status(): {status_ms:.1f} ms (lag p99 {report.lag_p99_seconds} s)")
    print(f"lag window (scheduled in the last 5 min, sent): {window_ms:.1f} ms, {len(rows)} rows")
    print(f"enqueued in the last 5 min (before): {before_ms:.1f} ms, {len(before)} rows")


if __name__ == "__main__":
    main()
