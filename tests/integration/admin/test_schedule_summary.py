"""The schedule list's row summaries (django_app.admin.schedule_summary): a retried run that
then succeeded still counts as the last failure, and a page costs what its rows' latest and
unusual occurrences cost, not their whole history."""

# The fixtures are imported from admin_support, so their parameters shadow the imports.
# ruff: noqa: F811

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from celery_scheduler.core import ids
from celery_scheduler.core.clock import SYSTEM_CLOCK
from django_app.admin.schedule_summary import summarize
from django_app.models import Attempt, Occurrence
from tests.integration.admin_support import (  # noqa: F401 (fixtures)
    add_occurrence,
    make_schedule,
    tenants,
    users,
)
from tests.integration.plans import read_by

pytestmark = pytest.mark.django_db


def retried(schedule: Any, minutes_ago: float) -> datetime:
    """A run whose first attempt failed and was retried, and whose second succeeded; returns
    when the first attempt ended."""
    occ = add_occurrence(schedule, state="SUCCEEDED", minutes_ago=minutes_ago)
    Occurrence.objects.filter(pk=occ.pk).update(attempt_count=2)
    failed_at = occ.scheduled_for + timedelta(seconds=2)
    for number, outcome, ended in ((1, "RETRY", failed_at), (2, "SUCCEEDED", failed_at)):
        Attempt.objects.create(
            occurrence=occ, number=number, fencing_token=number, started_at=occ.scheduled_for,
            finished_at=ended + timedelta(seconds=10 * (number - 1)), outcome=outcome,
        )  # fmt: skip
    return failed_at


def test_a_retry_that_then_succeeded_is_the_last_failure(make_schedule: Any) -> None:
    schedule = make_schedule(interval=60)
    failed_at = retried(schedule, minutes_ago=3)
    latest = add_occurrence(schedule, state="SUCCEEDED", minutes_ago=1)

    summary = summarize([schedule])[schedule.pk]
    assert summary.last_failure == failed_at
    assert (summary.last_state, summary.last_scheduled_for) == ("SUCCEEDED", latest.scheduled_for)
    assert summary.last_success is not None
    assert summary.next_pending is None


def history(schedule: Any, n: int, now: datetime) -> None:
    """``n`` SUCCEEDED runs a minute apart before the last hour, each with its attempt."""
    times = [(now - timedelta(hours=1, minutes=k)).replace(microsecond=0) for k in range(n)]
    rows = Occurrence.objects.bulk_create(
        Occurrence(
            id=ids.occurrence_id(schedule.id, schedule.version, at),
            schedule=schedule,
            schedule_version=schedule.version,
            tenant=schedule.tenant,
            scheduled_for=at,
            available_at=at,
            state="SUCCEEDED",
            enqueued_at=at,
            finished_at=at,
            attempt_count=1,
        )
        for at in times
    )
    Attempt.objects.bulk_create(
        Attempt(
            occurrence=occ,
            scheduled_for=occ.scheduled_for,
            number=1,
            fencing_token=1,
            started_at=occ.scheduled_for,
            finished_at=occ.scheduled_for,
            outcome="SUCCEEDED",
        )
        for occ in rows
    )


@pytest.mark.postgres
def test_a_page_reads_its_rows_latest_and_unusual_occurrences_not_their_history(
    make_schedule: Any,
) -> None:
    """Seen failing before the summaries were read by index (the aggregates over each
    schedule's rows, and the join of all their attempts, read all 3 x 1,000 runs)."""
    now = SYSTEM_CLOCK.now()
    schedules = [make_schedule(interval=60 + i) for i in range(3)]
    for schedule in schedules:
        history(schedule, 1_000, now)
        add_occurrence(schedule, state="SUCCEEDED", minutes_ago=5)
        add_occurrence(schedule, state="DEAD", minutes_ago=4)
        add_occurrence(schedule, state="SCHEDULED", minutes_ago=-1, lag=None)
        retried(schedule, minutes_ago=30)
    with connection.cursor() as cur:
        cur.execute("ANALYZE django_app_occurrence, django_app_attempt")
    with CaptureQueriesContext(connection) as captured:
        summaries = summarize(schedules)
    assert all(s.last_failure and s.next_pending for s in summaries.values())
    read = read_by(captured.captured_queries, ("django_app_occurrence", "django_app_attempt"))
    assert read < 200, read
