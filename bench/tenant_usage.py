"""The tenants list (``list_tenants``: HTTP, CLI, admin) against the outbox history it reads.

``python -m bench.tenant_usage [--days 7] [--rows-per-day 1000000] [--db cs_tenant_usage]``

Recreates the PostgreSQL database ``--db``, migrates it and seeds, by SQL, ``--days`` past
daily slots plus today's of ``--rows-per-day`` outbox rows each for 10 tenants, written in
time order as the beats plan them: every row whose time has passed sent half a second after
it, today's later ones unsent; 1,000 rows of the last hour and 20 of past days are sent
again in the last minute (retries, and late catch-ups that no bound on the partition key
could find). Then VACUUM
ANALYZE (which summarizes the BRIN ranges, as autovacuum does), and times
``tenants.list_tenants`` (median of 5 after one warm-up call) and the buffers its "published
in the last minute" count reads, with the outbox's ``outbox_sent_at`` index (migration 0028)
and after dropping it. The two counts must agree.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import UTC, datetime, timedelta

from bench.create_rate import migrated_database

TENANTS = 10
#: Rows sent again in the last minute: retries of the last hour's runs, and a few late
#: catch-ups of past days' rows (which no bound on the partition key could find).
RESENT_RECENT = 1_000
RESENT_OLD = 20


def seed(days: int, rows: int, now: datetime) -> None:
    from django.db import connection

    from django_app.db import partitions
    from django_app.models import OutboxEntry, Tenant

    partitions.ensure(now, width=timedelta(days=1), ahead=1, behind=days, wait=True)
    ids = [Tenant.objects.create(slug=f"tenant-{i}").pk for i in range(TENANTS)]
    table = OutboxEntry._meta.db_table
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    step = 86_400 / rows
    with connection.cursor() as cur:
        for d in range(days, -1, -1):
            start = today - timedelta(days=d)
            began = time.perf_counter()
            cur.execute(
                f"INSERT INTO {table} (occurrence_id, scheduled_for, tenant_id, shard,"
                " available_at, priority, sent_at, publish_count, claimed_by, created_at)"
                " SELECT gen_random_uuid(), t, (%(ids)s::bigint[])[(i %% %(n)s) + 1], i %% 64,"
                " t, 0, CASE WHEN t <= %(now)s THEN t + interval '0.5 s' END,"
                " CASE WHEN t <= %(now)s THEN 1 ELSE 0 END, '', t - interval '10 min'"
                " FROM (SELECT i, %(start)s + i * %(step)s * interval '1 s' AS t"
                "       FROM generate_series(0, %(rows)s - 1) AS i) AS x ORDER BY t",
                {"ids": ids, "n": TENANTS, "now": now, "start": start, "step": step,
                 "rows": rows},
            )  # fmt: skip
            print(f"  {start:%Y-%m-%d}: {rows:,} rows in {time.perf_counter() - began:.0f} s",
                  flush=True)  # fmt: skip
        # Rows published again in the last minute (retries, late catch-ups).
        for lo, hi, n in ((now - timedelta(hours=1), now, RESENT_RECENT),
                          (today - timedelta(days=days), today, RESENT_OLD)):  # fmt: skip
            cur.execute(
                f"UPDATE {table} SET sent_at = %(now)s - interval '10 s', publish_count = 2"
                f" WHERE (occurrence_id, scheduled_for) IN (SELECT occurrence_id,"
                f" scheduled_for FROM {table} WHERE scheduled_for >= %(lo)s AND"
                f" scheduled_for < %(hi)s ORDER BY occurrence_id LIMIT %(n)s)",
                {"now": now, "lo": lo, "hi": hi, "n": n},
            )


def measure(label: str, now: datetime) -> int:
    from django.db import connection

    from django_app import tenants
    from django_app.models import OutboxEntry

    tenants.list_tenants(now=now)  # warm-up
    times = []
    for _ in range(5):
        began = time.perf_counter()
        usage = tenants.list_tenants(now=now)
        times.append(time.perf_counter() - began)
    published = sum(u.published_last_minute for u in usage)
    query = OutboxEntry.objects.published_since(now - tenants.PUBLISHED_WINDOW, now)
    query = query.values_list("tenant_id")
    sql, params = query.query.sql_with_params()
    with connection.cursor() as cur:
        cur.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", params)
        plan = cur.fetchone()[0][0]
    buffers = plan["Plan"].get("Shared Hit Blocks", 0) + plan["Plan"].get("Shared Read Blocks", 0)
    nodes = sorted(set(_node_types(plan["Plan"])))
    print(
        f"{label:<28} list_tenants median {statistics.median(times) * 1000:9.1f} ms"
        f" (min {min(times) * 1000:.1f}); published last minute {published:,};"
        f" its count read {buffers:,} buffers; plan: {', '.join(nodes)}"
    )
    return published


def _node_types(node: dict) -> list[str]:
    out = [node["Node Type"]]
    for child in node.get("Plans", []):
        out += _node_types(child)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--rows-per-day", type=int, default=1_000_000)
    parser.add_argument("--db", default="cs_tenant_usage")
    args = parser.parse_args()

    migrated_database(args.db)
    from django.db import connection

    now = datetime.now(UTC).replace(microsecond=0)
    total = (args.days + 1) * args.rows_per_day
    print(f"seeding {total:,} outbox rows ({args.days} past days and today)", flush=True)
    seed(args.days, args.rows_per_day, now)
    with connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE django_app_outboxentry")
        cur.execute(
            "SELECT pg_size_pretty(sum(pg_total_relation_size(relid)))"
            " FROM pg_partition_tree('django_app_outboxentry')"
        )
        print(f"outbox with its indexes: {cur.fetchone()[0]}")
    with_index = measure("with outbox_sent_at (BRIN)", now)
    with connection.cursor() as cur:
        cur.execute('DROP INDEX "outbox_sent_at"')
        cur.execute("ANALYZE django_app_outboxentry")
    without = measure("without it", now)
    print(json.dumps({"rows": total, "agree": with_index == without}))
    if with_index != without:
        raise SystemExit("the two counts differ")


if __name__ == "__main__":
    main()
