"""Materializer and relay throughput on the database ``DATABASE_URL`` points at.

``python -m bench.portable_paths N [--per-schedule]`` migrates that database, empties the
scheduler's tables, seeds N one-off schedules due at one instant T (``bench.seed``'s rows),
then, with the clock frozen at T and the in-memory publisher (the broker is not measured):

1. ``materialize_due``: every due schedule -> its occurrence and outbox row (the path the
   database's defaults select: set-based on PostgreSQL, per schedule elsewhere;
   ``--per-schedule`` pins the per-schedule path on PostgreSQL for a like-for-like figure);
2. ``relay_due``: every outbox row claimed, published and marked sent (the general relay,
   ``FOR UPDATE SKIP LOCKED`` where the database has it).

Prints one JSON line: vendor, path, N, seconds and rows/s of each stage.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime

import django


def main(argv: list[str]) -> None:
    n = int(argv[0])
    per_schedule = "--per-schedule" in argv[1:]
    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection

    from bench.seed import seed_ours
    from celery_scheduler.core.clock import FrozenClock
    from celery_scheduler.publishers import RecordingPublisher
    from django_app import conf
    from django_app.models import (
        Attempt,
        Occurrence,
        OutboxEntry,
        Schedule,
        ScheduleVersion,
        Tenant,
    )
    from django_app.relay.batch import relay_due
    from django_app.wiring import materialize_due

    if per_schedule:
        settings.CELERY_SCHEDULER = {**settings.CELERY_SCHEDULER, "bulk_materialize": False}
    call_command("migrate", verbosity=0)
    for model in (OutboxEntry, Attempt, Occurrence, ScheduleVersion, Schedule, Tenant):
        model.objects.all().delete()
    at = datetime.now(UTC).replace(microsecond=0)
    seed_ours(n, at)
    clock = FrozenClock(at)

    started = time.perf_counter()
    materialized = materialize_due(clock=clock, horizon=None)
    materialize_s = time.perf_counter() - started

    publisher = RecordingPublisher()
    started = time.perf_counter()
    relayed = relay_due(clock=clock, publisher=publisher)
    relay_s = time.perf_counter() - started

    assert OutboxEntry.objects.filter(sent_at__isnull=True).count() == 0
    assert len(set(publisher.task_ids)) == n, (len(publisher.task_ids), n)
    path = "set-based" if conf.bulk_materialize_enabled(connection.vendor) else "per-schedule"
    print(
        json.dumps(
            {
                "vendor": connection.vendor,
                "server": connection.mysql_server_info
                if connection.vendor == "mysql"
                else connection.vendor,
                "materializer": path,
                "n": n,
                "materialize_s": round(materialize_s, 2),
                "materialize_per_s": round(n / materialize_s),
                "relay_s": round(relay_s, 2),
                "relay_per_s": round(n / relay_s),
                "reports": [repr(materialized), repr(relayed)],
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1:])
