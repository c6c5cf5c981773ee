"""``scheduler_status``'s lag p99 (also ``/status`` on the metrics port): what it counts, and
on PostgreSQL that it reads only the history slots of its window.

It read "occurrences enqueued in the last N minutes": ``enqueued_at`` is not the history's
partition key and no index holds it, so every call read every occurrence the retention
window keeps (5 M rows: 327 ms; bench/README.md, "Operators' reads against the history").
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection

from celery_scheduler.core.clock import FrozenClock
from django_app.db import partitions
from django_app.models import Occurrence, OutboxEntry
from django_app.operations import health
from tests.integration.worker_support import make_occurrence, make_schedule

pytestmark = pytest.mark.django_db
DAY = timedelta(days=1)


def sent(schedule: Any, scheduled_for: datetime, lag: float | None, **fields: Any) -> None:
    occ = make_occurrence(schedule, scheduled_for)
    enqueued_at = None if lag is None else scheduled_for + timedelta(seconds=lag)
    Occurrence.objects.filter(pk=occ.pk).update(enqueued_at=enqueued_at, **fields)


def test_the_lag_is_of_sent_occurrences_scheduled_in_the_window(
    tenant: Any, frozen_clock: FrozenClock
) -> None:
    now = frozen_clock.now()
    schedule = make_schedule(tenant)
    sent(schedule, now - timedelta(seconds=60), 2.0)
    sent(schedule, now - timedelta(seconds=120), 10.0)
    sent(schedule, now - timedelta(seconds=180), 4.0)
    sent(schedule, now - timedelta(seconds=30), None)  # not sent yet: the backlog shows it
    sent(schedule, now - timedelta(seconds=90), 200.0, manual=True)  # "run now": no lag
    sent(schedule, now - timedelta(minutes=6), 300.0)  # scheduled before the window
    report = health.status(clock=frozen_clock, lag_minutes=5)
    assert report.lag_samples == 3
    assert report.lag_p99_seconds == 10.0
    assert health.status(clock=frozen_clock, lag_minutes=7).lag_p99_seconds == 300.0


@pytest.mark.postgres
def test_the_lag_reads_only_the_slots_of_its_window(frozen_clock: FrozenClock) -> None:
    now = frozen_clock.now()
    partitions.ensure(now, width=DAY, ahead=1, behind=3, wait=True)
    table = Occurrence._meta.db_table
    since = now - timedelta(minutes=5)
    past = {p.name for p in partitions.partitions(table) if p.end is not None and p.end <= since}
    assert len(past) >= 2
    sql, params = health.lag_window(now, 5).query.sql_with_params()
    with connection.cursor() as cur:
        cur.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        plan = json.dumps(cur.fetchone()[0])
    assert not [name for name in past if name in plan], plan


def test_unclaimed_past_redelivery_counts_what_the_redelivery_would_send_again(
    tenant: Any, frozen_clock: FrozenClock
) -> None:
    """It compared the first publish (enqueued_at): a run retried and published again a
    minute ago, or a waiter deferred for longer than the timeout, read as a lost message."""
    now = frozen_clock.now()
    schedule = make_schedule(tenant)
    lost = make_occurrence(schedule, now - timedelta(minutes=20))  # published, never claimed
    retried = make_occurrence(schedule, now - timedelta(minutes=30))
    OutboxEntry.objects.filter(occurrence=retried).update(sent_at=now - timedelta(minutes=1))
    waiting = make_occurrence(schedule, now - timedelta(minutes=40))
    OutboxEntry.objects.filter(occurrence=waiting).update(
        sent_at=None, available_at=now + timedelta(minutes=4)
    )
    report = health.status(clock=frozen_clock)
    assert report.unclaimed_past_redelivery == 1
    assert lost.state == "ENQUEUED"
