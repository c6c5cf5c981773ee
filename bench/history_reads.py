"""Operators' reads against the history they cross: ``scheduler_status``, a schedule's
describe, the admin schedule list's row summaries and the tenants list.

``python -m bench.history_reads [--days 4] [--rows-per-day 1000000] [--busy 50]
[--db cs_history_reads]``

Recreates the PostgreSQL database ``--db``, migrates it and seeds, by SQL (history, not the
measured path), ``--days`` past daily slots plus today's share up to now of:

- ``--rows-per-day`` occurrences of one filler schedule;
- ``--busy`` per-minute schedules (catch-up misfire policy), one occurrence a minute each,
  the last 10 minutes' not yet sent (a short backlog: the tenants list's catch-up count);

every occurrence SUCCEEDED and sent a second after its time (but that backlog), with its
attempt (one busy occurrence in 100 a retried first try, then a second attempt that
succeeded) and its outbox row. Then VACUUM
ANALYZE (what autovacuum would have done), and each read's median of 5 after one warm-up
call: ``health.status()`` and the lag window it reads (occurrences scheduled in the last 5
minutes and sent), for comparison the window the status read before (occurrences
*enqueued* in the last 5 minutes), the describe's ``reads.counters`` of one busy schedule,
``schedule_summary.summarize`` over the busy schedules (one admin page) and
``tenants.list_tenants``.
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.create_rate import migrated_database
from bench.seed_scale import insert_succeeded, median_ms

BACKLOG = timedelta(minutes=10)


def seed(days: int, rows: int, busy: int, now: datetime) -> list[Any]:
    """Seed the history; returns the busy schedules."""
    from django.db import connection

    from django_app.db import partitions
    from django_app.models import Schedule, Tenant

    partitions.ensure(now, width=timedelta(days=1), ahead=1, behind=days, wait=True)
    tenant = Tenant.objects.create(slug="history")
    filler = Schedule.objects.create(
        tenant=tenant, name="filler", task="bench.append_line", kind="CRON",
        cron="* * * * *", state="COMPLETED",  # history only
    )  # fmt: skip
    busy_fields = {"task": "bench.append_line", "kind": "CRON", "cron": "* * * * *"}
    schedules = [
        Schedule.objects.create(
            tenant=tenant, name=f"busy-{i:03}", misfire_policy="CATCH_UP", **busy_fields
        )
        for i in range(busy)
    ]
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    with connection.cursor() as cur:
        for d in range(days, -1, -1):
            start = today - timedelta(days=d)
            part = 1.0 if d else (now - today) / timedelta(days=1)
            insert_succeeded(
                cur, filler.pk, tenant.pk, start=start, n=int(rows * part), step=86_400 / rows,
                sent_after=1.0,
            )  # fmt: skip
            for schedule in schedules:
                insert_succeeded(
                    cur, schedule.pk, tenant.pk, start=start, n=int(1440 * part), step=60,
                    sent_after=1.0,
                )  # fmt: skip
            print(f"  {start:%Y-%m-%d}: occurrences seeded", flush=True)
        retried = (
            "schedule_id <> %(filler)s AND "
            "(extract(epoch FROM scheduled_for)::bigint / 60) %% 100 = 7"
        )
        cur.execute(
            "INSERT INTO django_app_attempt (occurrence_id, scheduled_for, number, "
            "fencing_token, worker, started_at, finished_at, outcome, error) "
            "SELECT id, scheduled_for, 1, 1, 'history', scheduled_for, scheduled_for, "
            f"CASE WHEN {retried} THEN 'RETRY' ELSE 'SUCCEEDED' END, '' "
            "FROM django_app_occurrence",
            {"filler": filler.pk},
        )
        cur.execute(
            "INSERT INTO django_app_attempt (occurrence_id, scheduled_for, number, "
            "fencing_token, worker, started_at, finished_at, outcome, error) "
            "SELECT id, scheduled_for, 2, 2, 'history', scheduled_for, scheduled_for, "
            f"'SUCCEEDED', '' FROM django_app_occurrence WHERE {retried}",
            {"filler": filler.pk},
        )
        cur.execute(
            f"UPDATE django_app_occurrence SET attempt_count = 2 WHERE {retried}",
            {"filler": filler.pk},
        )
        cur.execute(
            "INSERT INTO django_app_outboxentry (occurrence_id, scheduled_for, tenant_id, "
            "shard, available_at, priority, sent_at, publish_count, claimed_by, created_at) "
            "SELECT id, scheduled_for, tenant_id, 0, scheduled_for, 0, "
            "CASE WHEN unsent THEN NULL ELSE enqueued_at END, "
            "CASE WHEN unsent THEN 0 ELSE 1 END, '', scheduled_for FROM ("
            "  SELECT *, schedule_id <> %(filler)s AND scheduled_for > %(since)s AS unsent"
            "  FROM django_app_occurrence) o",
            {"filler": filler.pk, "since": now - BACKLOG},
        )
        cur.execute(
            "UPDATE django_app_occurrence SET state = 'ENQUEUED', enqueued_at = NULL, "
            "finished_at = NULL WHERE schedule_id <> %(filler)s AND scheduled_for > %(since)s",
            {"filler": filler.pk, "since": now - BACKLOG},
        )
        # What autovacuum would have done by now: statistics, the visibility map, and the
        # outbox's BRIN ranges summarized (this machine's server runs without autovacuum).
        cur.execute(
            "VACUUM ANALYZE django_app_occurrence, django_app_attempt, django_app_outboxentry"
        )
    return schedules


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=4)
    parser.add_argument("--rows-per-day", type=int, default=1_000_000)
    parser.add_argument("--busy", type=int, default=50)
    parser.add_argument("--db", default="cs_history_reads")
    args = parser.parse_args()

    migrated_database(args.db)
    from django_app import tenants
    from django_app.admin import schedule_summary
    from django_app.models import Occurrence
    from django_app.operations import health
    from django_app.schedules import reads

    now = datetime.now(UTC).replace(microsecond=0)
    began = time.perf_counter()
    busy = seed(args.days, args.rows_per_day, args.busy, now)
    print(f"seeded {Occurrence.objects.count():,} occurrences with their attempts and "
          f"outbox rows in {time.perf_counter() - began:.0f} s", flush=True)  # fmt: skip
    since = now - timedelta(minutes=5)
    enqueued = (
        Occurrence.objects.filter(manual=False, enqueued_at__gte=since, enqueued_at__lte=now)
        .order_by("-enqueued_at")
        .values_list("enqueued_at", "scheduled_for")[: health.LAG_SAMPLE_LIMIT]
    )
    figures = {
        "health.status()": lambda: health.status(lag_minutes=5),
        "lag window: scheduled in the last 5 min, sent": lambda: list(health.lag_window(now, 5)),
        "before: enqueued in the last 5 min": lambda: list(enqueued.all()),
        "describe's counters, one busy schedule": lambda: reads.counters(busy[0]),
        "admin row summaries, the busy schedules": lambda: schedule_summary.summarize(busy),
        "tenants.list_tenants()": lambda: tenants.list_tenants(now=now),
    }
    for label, call in figures.items():
        result = call()
        ms = median_ms(call, 5)
        size = f", {len(result)} rows" if isinstance(result, list | dict) else ""
        print(f"{label}: {ms:.1f} ms{size}", flush=True)
    usage = {u.tenant.slug: u for u in tenants.list_tenants(now=now)}["history"]
    print(f"(the tenants list counted a catch-up backlog of {usage.catchup_backlog} rows)")


if __name__ == "__main__":
    main()
