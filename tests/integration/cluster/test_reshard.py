"""Issue 9, hole 5: lowering ``shard_count`` must never strand a schedule silently.

Schedules store their shard at create time. A beat restarted with a smaller ``shard_count``
leases only the shards below it: schedules stored above it were never materialized again.
Now the beat refuses to run with a message naming the fix, and ``manage.py reshard``
moves the stranded rows into range, after which every schedule fires.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any

import pytest
from celery import Celery
from django.core.management import call_command

from celery_scheduler import api, errors
from celery_scheduler.beat import DatabaseScheduler
from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.publishers import RecordingPublisher
from django_app import wiring
from django_app.models import Occurrence, OutboxEntry, Schedule

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
SCHEDULES = 40
pytestmark = pytest.mark.django_db


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("reshard-test", set_as_current=False)
    yield app
    app.close()


def run_ticks(s: DatabaseScheduler, clock: FrozenClock, seconds: float) -> None:
    end = clock.now() + timedelta(seconds=seconds)
    while clock.now() < end:
        clock.advance(max(s.tick(), 0.001))


def test_lowering_shard_count_strands_no_schedule(app: Celery, settings: Any) -> None:
    clock = FrozenClock(NOW)
    settings.CELERY_SCHEDULER = {"shard_count": 8}
    created = {
        str(api.create_schedule(name=f"s{i}", task="billing.ping", interval=60, clock=clock).id)
        for i in range(SCHEDULES)
    }
    assert Schedule.objects.filter(shard__gte=2).count() > SCHEDULES // 2  # the premise

    settings.CELERY_SCHEDULER = {"shard_count": 2}  # the restart with fewer shards
    publisher = RecordingPublisher()
    s = DatabaseScheduler(app=app, clock=clock, publisher=publisher)
    refused = ""
    try:
        run_ticks(s, clock, 5)
    except errors.ShardCountMismatch as exc:
        message = refused = str(exc)
        assert "shard_count" in message, message
        assert "manage.py reshard" in message, message
        assert publisher.sent == []  # refused before doing anything
        call_command("reshard", stdout=StringIO())
        run_ticks(s, clock, 5)
    s.close()

    fired = {m.schedule_id for m in publisher.sent}
    assert fired == created, f"{len(created - fired)} schedule(s) never fired"
    assert "schedule(s)" in refused  # the beat refused loudly (not a silent partial run)
    assert Occurrence.objects.filter(state="ENQUEUED").count() == SCHEDULES


def test_reshard_moves_schedules_and_outbox_rows_and_dry_run_writes_nothing(
    settings: Any,
) -> None:
    clock = FrozenClock(NOW)
    settings.CELERY_SCHEDULER = {"shard_count": 8}
    for i in range(10):
        api.create_schedule(name=f"s{i}", task="billing.ping", interval=60, clock=clock)
    wiring.materialize_due(clock=clock)  # outbox rows in the old shards too
    before = dict(Schedule.objects.values_list("id", "shard"))
    stranded = sum(1 for shard in before.values() if shard >= 2)
    assert stranded > 0
    assert OutboxEntry.objects.filter(shard__gte=2).exists()
    settings.CELERY_SCHEDULER = {"shard_count": 2}
    out = StringIO()
    call_command("reshard", "--dry-run", stdout=out)
    assert f"{stranded} schedule(s)" in out.getvalue()
    assert dict(Schedule.objects.values_list("id", "shard")) == before
    call_command("reshard", stdout=StringIO())
    out = StringIO()
    call_command("reshard", stdout=out)
    assert "0 schedule(s)" in out.getvalue()
    assert not Schedule.objects.filter(shard__gte=2).exists()
    assert not OutboxEntry.objects.filter(shard__gte=2).exists()
    for row in OutboxEntry.objects.select_related("occurrence__schedule"):
        assert row.shard == row.occurrence.schedule.shard
