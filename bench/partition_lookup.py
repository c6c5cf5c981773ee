"""What a lookup by occurrence id alone costs on partitioned history.

    python -m bench.partition_lookup [--slots 1,8,31] [--rows-per-slot 20000] [--lookups 3000]

For each slot count K: drops and creates the database ``cs_part_lookup``, migrates it
(partitioned), creates K daily slots back from today, fills each with ``--rows-per-slot``
occurrences by SQL, and times ``--lookups`` primary-key reads (and counts the buffers one
touches) of random ids, once by ``id``
alone (every partition's index is probed: the worker's claim, the relay's marks) and once by
``id`` and ``scheduled_for`` (one partition). Prints microseconds per lookup, as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[1]
DB = "cs_part_lookup"


def _admin(sql: str) -> None:
    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as c:
        c.execute(sql)


def measure(slots: int, per_slot: int, lookups: int) -> dict[str, float]:
    _admin(f"DROP DATABASE IF EXISTS {DB}")
    _admin(f"CREATE DATABASE {DB}")
    url = f"postgresql://postgres@127.0.0.1:5432/{DB}"
    env = {**os.environ, "DATABASE_URL": url.replace("postgresql", "postgres", 1)}
    env["DJANGO_SETTINGS_MODULE"] = "example_project.settings"
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    subprocess.run(
        [sys.executable, "-c", "import django; django.setup(); from datetime import UTC, "
         "datetime, timedelta; from django_app.db import partitions; "
         f"partitions.ensure(datetime.now(UTC), width=timedelta(days=1), ahead=0, "
         f"behind={slots - 1}, wait=True); "
         "from django_app.models import Schedule, Tenant; "
         "t = Tenant.objects.create(slug='bench', name='bench'); "
         "Schedule.objects.create(tenant=t, name='bench', task='bench.ping', kind='CRON', "
         "cron='* * * * *')"],
        cwd=ROOT, env=env, check=True, capture_output=True,
    )  # fmt: skip
    with psycopg.connect(url, autocommit=True) as c:
        sid, tenant = c.execute("SELECT id, tenant_id FROM django_app_schedule").fetchone() or ()
        c.execute(
            "INSERT INTO django_app_occurrence (id, schedule_id, schedule_version, tenant_id, "
            "scheduled_for, available_at, state, manual, overlap_policy, attempt_count, "
            "fencing_token, lease_owner, created_at, last_error, reason) "
            "SELECT gen_random_uuid(), %s, 1, %s, t, t, 'SUCCEEDED', true, '', 1, 1, '', t, "
            "'', '' FROM generate_series(0, %s - 1) g, LATERAL (SELECT date_trunc('day', now()) "
            "- (g %% %s) * interval '1 day' + (g / %s) * interval '1 second' AS t) x",
            [sid, tenant, slots * per_slot, slots, slots],
        )
        c.execute("VACUUM ANALYZE django_app_occurrence")
        sample = c.execute(
            "SELECT id, scheduled_for FROM django_app_occurrence ORDER BY random() LIMIT %s",
            [lookups],
        ).fetchall()
        random.shuffle(sample)
        out: dict[str, float] = {}
        for name, sql, args in (
            ("id_only", "SELECT state FROM django_app_occurrence WHERE id = %s", 1),
            (
                "id_and_key",
                "SELECT state FROM django_app_occurrence WHERE id = %s AND scheduled_for = %s",
                2,
            ),
        ):
            with c.cursor() as cur:
                for row in sample[:200]:  # warm up
                    cur.execute(sql, row[:args])
                started = time.perf_counter()
                for row in sample:
                    cur.execute(sql, row[:args])
                    cur.fetchone()
                out[f"{name}_us"] = round((time.perf_counter() - started) / len(sample) * 1e6, 1)
                # Buffers touched per lookup: the load-independent figure.
                hits = 0
                for row in sample[:100]:
                    cur.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", row[:args])
                    plan: dict[str, Any] = (cur.fetchone() or [[{}]])[0][0]
                    hits += plan["Plan"].get("Shared Hit Blocks", 0)
                    hits += plan["Plan"].get("Shared Read Blocks", 0)
                out[f"{name}_buffers"] = round(hits / 100, 1)
    _admin(f"DROP DATABASE IF EXISTS {DB}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", default="1,8,31")
    parser.add_argument("--rows-per-slot", type=int, default=20_000)
    parser.add_argument("--lookups", type=int, default=3000)
    args = parser.parse_args()
    result = {k: measure(int(k), args.rows_per_slot, args.lookups) for k in args.slots.split(",")}
    print(json.dumps({"per_slot_count": result, "load": os.getloadavg()}, indent=2))


if __name__ == "__main__":
    main()
