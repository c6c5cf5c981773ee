"""describe_schedule and list_schedules at N schedules (PostgreSQL; a benchmark, not a test).

``DATABASE_URL=postgres://... python -m bench.management_api 1000000`` seeds N schedules over
100 tenants with ``generate_series`` (states, tasks, cursors and a tag on every tenth one
vary), 5,000 occurrences on one schedule, then times each call (median of 20 runs, warm)
and prints the plan of the deep-page query so the index it uses is on record. The seed is
kept between runs (``--reseed`` drops it first).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import django

SEED_SQL = """
INSERT INTO django_app_tenant (slug, name, relay_weight, created_at)
SELECT 'bench-' || g, 'bench ' || g, 1, now() FROM generate_series(0, 99) g
ON CONFLICT DO NOTHING;
INSERT INTO django_app_schedule (
  id, tenant_id, name, task, args, kwargs, queue, priority, kind, cron, timezone, version,
  state, shard, parked_reason, misfire_policy, max_lateness_seconds,
  catchup_cap, overlap_policy, flexible_window_seconds, concurrency_group, content_hash,
  source, created_at, updated_at, pause_reason, runs_count, consecutive_failures, skip_times
)
SELECT md5('bench' || g)::uuid, t.id, 'bench job ' || g,
  CASE WHEN g % 7 = 0 THEN 'billing.create_invoice' ELSE 'billing.ping' END,
  '[]', '{}', '', 0, 'CRON', '*/5 * * * *', 'UTC', 1,
  CASE WHEN g % 50 = 0 THEN 'PAUSED' WHEN g % 97 = 0 THEN 'CANCELED' ELSE 'ACTIVE' END,
  g % 64, '', 'SKIP', 300, 10, 'ALLOW', 0, '', '', 'bench',
  TIMESTAMPTZ '2026-01-01 00:00:00+00' + g * INTERVAL '1 millisecond', now(), '', 0, 0, '[]'
FROM generate_series(0, {n} - 1) g
JOIN django_app_tenant t ON t.slug = 'bench-' || (g % 100);
INSERT INTO django_app_schedulecursor (schedule_id, shard, version, active, next_run_at)
SELECT s.id, s.shard, s.version, s.state = 'ACTIVE',
  TIMESTAMPTZ '2026-03-01 12:00:00+00'
  + (substring(s.name from 11)::int % 86400) * INTERVAL '1 second'
FROM django_app_schedule s WHERE s.source = 'bench'
ON CONFLICT DO NOTHING;
INSERT INTO django_app_scheduletag (schedule_id, tenant_id, key, value)
SELECT s.id, s.tenant_id, 'team', CASE WHEN s.name LIKE '%%0' THEN 'billing' ELSE 'ops' END
FROM django_app_schedule s WHERE s.source = 'bench' AND right(s.name, 2) IN ('10', '20');
ANALYZE;
"""

DROP_SQL = """
DELETE FROM django_app_occurrence WHERE schedule_id IN
  (SELECT id FROM django_app_schedule WHERE source = 'bench');
DELETE FROM django_app_scheduletag WHERE schedule_id IN
  (SELECT id FROM django_app_schedule WHERE source = 'bench');
DELETE FROM django_app_schedulecursor WHERE schedule_id IN
  (SELECT id FROM django_app_schedule WHERE source = 'bench');
DELETE FROM django_app_schedule WHERE source = 'bench';
DELETE FROM django_app_tenant WHERE slug LIKE 'bench-%%';
"""


def timed(call: Callable[[], Any], runs: int = 20) -> float:
    call()  # warm
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1000


def main(n: int, reseed: bool) -> None:
    from django.db import connection

    from celery_scheduler import api
    from celery_scheduler.core import ids
    from celery_scheduler.core.clock import FrozenClock
    from django_app.models import Occurrence, Schedule
    from django_app.schedules import reads

    with connection.cursor() as cur:
        if reseed:
            cur.execute(DROP_SQL)
        cur.execute("SELECT count(*) FROM django_app_schedule WHERE source = 'bench'")
        have = cur.fetchone()[0]
        if have != n:
            cur.execute(DROP_SQL)
            t0 = time.perf_counter()
            cur.execute(SEED_SQL.replace("{n}", str(int(n))))
            print(f"seeded {n} schedules in {time.perf_counter() - t0:.0f} s")
    busy = Schedule.objects.filter(source="bench").order_by("created_at").first()
    assert busy is not None
    if not Occurrence.objects.filter(schedule=busy).exists():
        base = datetime(2026, 1, 1, tzinfo=UTC)
        Occurrence.objects.bulk_create(
            Occurrence(
                id=ids.occurrence_id(busy.id, 1, base + timedelta(minutes=5 * i)),
                schedule=busy,
                schedule_version=1,
                tenant_id=busy.tenant_id,
                scheduled_for=base + timedelta(minutes=5 * i),
                available_at=base + timedelta(minutes=5 * i),
                state="SUCCEEDED" if i % 10 else "DEAD",
                attempt_count=1,
                started_at=base + timedelta(minutes=5 * i),
            )
            for i in range(5000)
        )
    clock = FrozenClock(datetime(2026, 3, 1, 11, 0, tzinfo=UTC))
    # A cursor deep into the table: the 900,000th schedule of the whole list.
    deep = Schedule.objects.filter(source="bench").order_by("created_at", "id")[n * 9 // 10]
    deep_cursor = reads.encode_cursor(deep.created_at, deep.id)
    tenant_deep = Schedule.objects.filter(tenant_id=deep.tenant_id).order_by("created_at", "id")[
        (n // 100) * 9 // 10
    ]
    tenant_cursor = reads.encode_cursor(tenant_deep.created_at, tenant_deep.id)
    cut = datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC)
    cases: dict[str, Callable[[], Any]] = {
        "describe (5,000 occurrences)": lambda: api.describe_schedule(busy.id, clock=clock),
        "list, first page (50)": lambda: api.list_schedules(),
        "list, page at 90%": lambda: api.list_schedules(after=deep_cursor),
        "list tenant, first page": lambda: api.list_schedules(tenant="bench-7"),
        "list tenant, page at 90%": lambda: api.list_schedules(
            tenant=tenant_deep.tenant.slug, after=tenant_cursor
        ),
        "list tenant + state=PAUSED": lambda: api.list_schedules(tenant="bench-0", state="PAUSED"),
        "list tenant + tag team=billing": lambda: api.list_schedules(
            tenant="bench-10", tag="team=billing"
        ),
        "list task=create_invoice": lambda: api.list_schedules(task="billing.create_invoice"),
        "list next_run_before (first 30 s)": lambda: api.list_schedules(next_run_before=cut),
        "list next_run_after (last 30 s)": lambda: api.list_schedules(
            next_run_after=cut + timedelta(hours=23, minutes=59)
        ),
        "list tenant + name_contains": lambda: api.list_schedules(
            tenant="bench-99", name_contains="job 99999"
        ),
        "list name_contains (whole table)": lambda: api.list_schedules(name_contains="job 99999"),
    }
    deep_qs = (
        reads.filtered().filter(created_at__gte=deep.created_at).order_by("created_at", "id")[:51]
    )
    print("plan of the page at 90%:\n  " + deep_qs.explain().replace("\n", "\n  "))
    print(f"{n} schedules, PostgreSQL {connection.pg_version}, median of 20 warm runs")
    for label, call in cases.items():
        print(f"  {label:36s} {timed(call):8.1f} ms")


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
    django.setup()
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000, "--reseed" in sys.argv)
