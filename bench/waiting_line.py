"""1,000 waiters on a group of limit 1: broker messages and database statements per minute.

``python -m bench.waiting_line [--waiters 1000] [--minutes 3] [--hold 20] [--db cs_wait]``

Recreates and migrates the PostgreSQL database ``--db``, creates 10 interval schedules of
one tenant sharing the concurrency group ``one-slot`` (limit 1) through
``api.create_schedule``, one running occurrence that holds the slot, and ``--waiters``
occurrences due now (as the beat leaves them: ENQUEUED, outbox row unsent). Then it plays
a worker and the beat's relay on a frozen clock advanced in 0.25 s steps for ``--minutes``
simulated minutes: each step runs the real relay (``relay_due``, default settings) into a
recording publisher and claims every published message with the real worker claim
(``claim.claim``), as a worker receiving it would.
Every ``--hold`` simulated seconds the running occurrence completes (``finish.complete``)
and the slot goes to the next waiter. Counted per simulated minute: messages published,
claims, and SQL statements (through ``connection.execute_wrapper``) of the workers (claims
and completions) and of the relay (its passes, 4 a second here, most of them finding
nothing due). Minute 1 includes the first delivery of every waiter.
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import django
import psycopg

PG = "postgresql://postgres@127.0.0.1:5432"
STEP = 0.25


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waiters", type=int, default=1000)
    parser.add_argument("--minutes", type=int, default=3)
    parser.add_argument("--hold", type=float, default=20.0)
    parser.add_argument("--db", default="cs_wait")
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
    from celery_scheduler.core.ids import occurrence_id
    from celery_scheduler.publishers import RecordingPublisher
    from django_app.models import Occurrence, OutboxEntry, Schedule, Tenant
    from django_app.relay.batch import relay_due
    from django_app.worker import claim, finish

    call_command("migrate", verbosity=0)
    api.create_tenant("bench-wait")
    tenant = Tenant.objects.get(slug="bench-wait")
    start = datetime.now(UTC).replace(microsecond=0)
    clock = FrozenClock(start)
    schedules = [
        api.create_schedule(
            name=f"report {n}", task="billing.ping", interval=3600, tenant="bench-wait",
            start_at=start + timedelta(days=1), concurrency_group="one-slot",
            concurrency_limit=1,
        )
        for n in range(10)
    ]  # fmt: skip
    rows = {s.id: Schedule.objects.get(pk=s.id) for s in schedules}
    occs = []
    for n in range(args.waiters + 1):
        schedule = rows[schedules[n % len(schedules)].id]
        at = start - timedelta(seconds=args.waiters + 1 - n)  # distinct, oldest first
        occs.append(
            Occurrence(
                id=occurrence_id(schedule.id, schedule.version, at), schedule=schedule,
                schedule_version=schedule.version, tenant_id=tenant.id, scheduled_for=at,
                available_at=at, state="ENQUEUED", enqueued_at=at,
            )
        )  # fmt: skip
    Occurrence.objects.bulk_create(occs)
    OutboxEntry.objects.bulk_create(
        [
            OutboxEntry(occurrence=o, tenant_id=tenant.id, shard=rows[o.schedule_id].shard,
                        available_at=start)
            for o in occs
        ]
    )  # fmt: skip
    lease = timedelta(hours=1)
    holder = claim.claim(occs[0].id, worker="bench", clock=clock, lease=lease)
    assert holder.claimed, holder
    running: tuple[uuid.UUID, int] = (occs[0].id, holder.fencing_token or 0)

    statements: Counter[int] = Counter()
    relay_statements: Counter[int] = Counter()
    in_relay = False
    messages: Counter[int] = Counter()
    claims: Counter[int] = Counter()
    started: list[uuid.UUID] = []
    minute = 0

    def count(execute: Callable[..., Any], sql: str, *rest: Any) -> Any:
        (relay_statements if in_relay else statements)[minute] += 1
        return execute(sql, *rest)

    publisher = RecordingPublisher()
    seen = 0
    next_release = args.hold
    wall = time.monotonic()
    with connection.execute_wrapper(count):
        for step in range(1, int(args.minutes * 60 / STEP) + 1):
            clock.advance(STEP)
            elapsed = step * STEP
            minute = int((elapsed - 1e-9) // 60) + 1
            if elapsed >= next_release:
                next_release += args.hold
                finish.complete(running[0], running[1], clock=clock)
            in_relay = True
            relay_due(clock=clock, publisher=publisher)
            in_relay = False
            fresh = publisher.sent[seen:]
            seen = len(publisher.sent)
            messages[minute] += len(fresh)
            for message in fresh:
                claims[minute] += 1
                result = claim.claim(message.task_id, worker="bench", clock=clock, lease=lease)
                if result.claimed:
                    running = (result.occurrence_id, result.fencing_token or 0)
                    started.append(result.occurrence_id)
    seconds = time.monotonic() - wall
    order = [o.id for o in occs[1:]]
    in_order = started == order[: len(started)]
    print(f"{args.waiters} waiters, group limit 1, a hand-over every {args.hold:g} s")
    print("minute  messages  claims  worker statements  relay statements")
    for m in range(1, args.minutes + 1):
        print(
            f"{m:>6}  {messages[m]:>8}  {claims[m]:>6}  {statements[m]:>17}"
            f"  {relay_statements[m]:>16}"
        )
    print(f"started {len(started)} waiters, in scheduled order: {in_order}")
    print(f"wall time {seconds:.1f} s (shared 2-core machine)")


if __name__ == "__main__":
    main()
