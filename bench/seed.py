"""Seed N jobs due at one instant for one system (run in its own process: one settings module).

``python -m bench.seed <ours|dcb|redbeat> <N> <T ISO>`` with ``DJANGO_SETTINGS_MODULE`` and
``DATABASE_URL`` set by the harness. Creation speed is not what the benchmark measures, so
rows go in with bulk inserts that mirror what each system's own API writes.
"""

from __future__ import annotations

import sys
import time
import uuid
from datetime import UTC, datetime

import django

BATCH = 5000


def seed_ours(n: int, at: datetime) -> None:
    """Mirror ``celery_scheduler.api.create_schedule(run_at=at)``: Schedule + ScheduleVersion."""
    from celery_scheduler.core import ids
    from celery_scheduler.core.enums import ScheduleKind
    from django_app import conf
    from django_app.models import Schedule, ScheduleVersion, Tenant

    tenant = Tenant.objects.create(slug="bench", name="bench")
    shard_count = conf.get().shard_count
    now = datetime.now(UTC)
    for start in range(0, n, BATCH):
        schedules, versions = [], []
        for i in range(start, min(n, start + BATCH)):
            sid = uuid.uuid4()
            schedules.append(
                Schedule(
                    id=sid,
                    tenant=tenant,
                    name=f"bench-{i}",
                    task="billing.ping",
                    args=[i],
                    kind=ScheduleKind.ONE_OFF.value,
                    run_at=at,
                    next_run_at=at,
                    shard=ids.shard_for(sid, shard_count),
                    source="bench",
                )
            )
            versions.append(
                ScheduleVersion(
                    schedule_id=sid,
                    version=1,
                    kind=ScheduleKind.ONE_OFF.value,
                    run_at=at,
                    valid_from=now,
                )
            )
        Schedule.objects.bulk_create(schedules)
        ScheduleVersion.objects.bulk_create(versions)


def seed_dcb(n: int, at: datetime) -> None:
    """django-celery-beat: N one-off PeriodicTasks on one ClockedSchedule at ``at``."""
    from django_celery_beat.models import ClockedSchedule, PeriodicTask, PeriodicTasks

    clocked = ClockedSchedule.objects.create(clocked_time=at)
    for start in range(0, n, BATCH):
        PeriodicTask.objects.bulk_create(
            PeriodicTask(
                name=f"bench-{i}",
                task="billing.ping",
                clocked=clocked,
                one_off=True,
                args=f"[{i}]",
                enabled=True,
            )
            for i in range(start, min(n, start + BATCH))
        )
    PeriodicTasks.update_changed()


def seed_redbeat(n: int, at: datetime) -> None:
    """celery-redbeat: N entries with a one-shot rrule starting at ``at``."""
    from redbeat import RedBeatSchedulerEntry
    from redbeat.schedules import rrule

    from example_project.celery import app

    app.conf.beat_scheduler = "redbeat.RedBeatScheduler"
    for i in range(n):
        schedule = rrule("MINUTELY", dtstart=at, count=1, app=app)
        RedBeatSchedulerEntry(f"bench-{i}", "billing.ping", schedule, args=[i], app=app).save()


def main(argv: list[str]) -> None:
    system, n, at = argv[0], int(argv[1]), datetime.fromisoformat(argv[2])
    django.setup()
    if system != "redbeat":
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)
    started = time.monotonic()
    {"ours": seed_ours, "dcb": seed_dcb, "redbeat": seed_redbeat}[system](n, at)
    print(f"seeded {n} {system} jobs due {at.isoformat()} in {time.monotonic() - started:.1f}s")


if __name__ == "__main__":
    main(sys.argv[1:])
