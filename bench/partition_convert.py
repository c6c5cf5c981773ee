"""Convert a populated install's history tables to partitioned ones and time the lock.

    python -m bench.partition_convert [--rows 2000000] [--db cs_part_bench]

Drops and creates the database ``--db`` (PostgreSQL on 127.0.0.1:5432, user postgres),
migrates it (fresh: partitioned), turns the empty tables back into plain ones, seeds
``--rows`` occurrences over the last days by SQL (a sent outbox row and an attempt each, 1 %
of them without ``scheduled_for``, as rows written before migration 0020; 1 % dated far
ahead), then runs ``manage.py partitions convert`` while a writer thread inserts an
occurrence every 10 ms and records how long each insert took. Prints the conversion's steps
(seconds), the swap's lock time and the writer's slowest insert, as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]


def _admin(sql: str) -> None:
    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as c:
        c.execute(sql)


def _seed(url: str, rows: int) -> float:
    started = time.monotonic()
    with psycopg.connect(url, autocommit=True) as c:
        row = c.execute("SELECT id, tenant_id FROM django_app_schedule LIMIT 1").fetchone()
        assert row is not None
        sid, tenant = row
        c.execute(
            "INSERT INTO django_app_occurrence (id, schedule_id, schedule_version, tenant_id, "
            "scheduled_for, available_at, state, manual, overlap_policy, attempt_count, "
            "fencing_token, lease_owner, created_at, last_error, reason) "
            "SELECT gen_random_uuid(), %s, 1, %s, t, t, 'SUCCEEDED', false, '', 1, 1, '', t, "
            "'', '' FROM generate_series(1, %s) g, LATERAL (SELECT now() - g * interval "
            "'0.2 seconds' + CASE WHEN g %% 100 = 0 THEN interval '400 days' ELSE interval '0' "
            "END AS t) x",
            [sid, tenant, rows],
        )
        for table, extra in (
            ("django_app_attempt", ""),
            ("django_app_outboxentry", ""),
        ):
            if table == "django_app_attempt":
                c.execute(
                    f"INSERT INTO {table} (occurrence_id, number, fencing_token, worker, "
                    "started_at, outcome, error, scheduled_for) SELECT id, 1, 1, 'w', "
                    "scheduled_for, 'SUCCEEDED', '', CASE WHEN random() < 0.01 THEN NULL "
                    f"ELSE scheduled_for END FROM django_app_occurrence{extra}"
                )
            else:
                c.execute(
                    f"INSERT INTO {table} (occurrence_id, tenant_id, shard, available_at, "
                    "priority, sent_at, publish_count, claimed_by, created_at, scheduled_for) "
                    "SELECT id, tenant_id, 0, scheduled_for, 0, scheduled_for, 1, '', "
                    "scheduled_for, CASE WHEN random() < 0.01 THEN NULL ELSE scheduled_for "
                    f"END FROM django_app_occurrence{extra}"
                )
        c.execute("VACUUM ANALYZE")
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--db", default="cs_part_bench")
    args = parser.parse_args()
    url = f"postgresql://postgres@127.0.0.1:5432/{args.db}"
    _admin(f"DROP DATABASE IF EXISTS {args.db}")
    _admin(f"CREATE DATABASE {args.db}")
    env = {**os.environ, "DATABASE_URL": url.replace("postgresql", "postgres", 1)}
    env["DJANGO_SETTINGS_MODULE"] = "example_project.settings"
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    subprocess.run(
        [sys.executable, "-c", "import django; django.setup(); from django_app.db import "
         "partitions; partitions.unpartition_empty_tables(); "
         "from django_app.models import Schedule, Tenant; "
         "t = Tenant.objects.create(slug='bench', name='bench'); "
         "Schedule.objects.create(tenant=t, name='bench', task='bench.ping', kind='CRON', "
         "cron='* * * * *')"],
        cwd=ROOT, env=env, check=True,
    )  # fmt: skip
    seeded = _seed(url, args.rows)
    latencies: list[float] = []
    stop = threading.Event()

    def writer() -> None:
        with psycopg.connect(url, autocommit=True) as c:
            row = c.execute("SELECT id, tenant_id FROM django_app_schedule LIMIT 1").fetchone()
            assert row is not None
            while not stop.is_set():
                t = time.monotonic()
                c.execute(
                    "INSERT INTO django_app_occurrence (id, schedule_id, schedule_version, "
                    "tenant_id, scheduled_for, available_at, state, manual, overlap_policy, "
                    "attempt_count, fencing_token, lease_owner, created_at, last_error, "
                    "reason) VALUES (gen_random_uuid(), %s, 1, %s, now(), now(), "
                    "'SCHEDULED', true, '', 0, 0, '', now(), '', '')",
                    row,
                )
                latencies.append(time.monotonic() - t)
                time.sleep(0.01)

    thread = threading.Thread(target=writer)
    thread.start()
    done = subprocess.run(
        [*manage, "partitions", "convert", "--json"],
        cwd=ROOT, env=env, check=True, capture_output=True, text=True,
    )  # fmt: skip
    stop.set()
    thread.join()
    report = json.loads(done.stdout)
    latencies.sort()
    print(
        json.dumps(
            {
                "rows": args.rows,
                "seed_seconds": round(seeded, 1),
                "convert": report,
                "writer_inserts": len(latencies),
                "writer_p50_ms": round(latencies[len(latencies) // 2] * 1000, 1),
                "writer_max_ms": round(latencies[-1] * 1000, 1),
                "load": os.getloadavg(),
                "at": datetime.now(UTC).isoformat(timespec="seconds"),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
