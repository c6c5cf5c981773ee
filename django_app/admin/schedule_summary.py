"""What the schedule list shows per row, fetched once per page rather than once per row.

For the schedules on one changelist page: the next pending occurrence (the earliest one still
SCHEDULED: the internal ``next_run_at`` cursor is one period later), the last finished one
with its state and lag (a CANCELED or a future SCHEDULED row is not a run), and when the
schedule last succeeded and last failed. Three queries per page, whatever its length.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Max, Min, Q
from django.db.models.functions import Coalesce

from celery_scheduler.core.enums import AttemptOutcome, OccurrenceState
from django_app.models import Attempt, Occurrence
from django_app.querysets import SAME_SLOT

#: States in which an occurrence has run its course (CANCELED was invalidated, not run).
FINISHED = (
    OccurrenceState.SUCCEEDED.value,
    OccurrenceState.DEAD.value,
    OccurrenceState.MISSED.value,
    OccurrenceState.SKIPPED_OVERLAP.value,
)
#: When an occurrence ended; rows finished by the reaper or a policy may lack finished_at.
ENDED = Coalesce("finished_at", "enqueued_at", "scheduled_for")
FAILED_ATTEMPTS = (AttemptOutcome.FAILED.value, AttemptOutcome.RETRY.value)


@dataclass(frozen=True)
class RowSummary:
    next_pending: datetime | None = None
    last_state: str | None = None
    last_scheduled_for: datetime | None = None
    last_lag: float | None = None
    #: Why the last run exists when not by the schedule ("run now", "backfill"), else "".
    last_reason: str = ""
    last_success: datetime | None = None
    last_failure: datetime | None = None


def _latest(*instants: datetime | None) -> datetime | None:
    known = [t for t in instants if t is not None]
    return max(known) if known else None


def summarize(schedules: Iterable[Any]) -> dict[Any, RowSummary]:
    """Schedule pk -> RowSummary for the given schedules."""
    ids = [s.pk for s in schedules]
    if not ids:
        return {}
    per_schedule: dict[Any, dict[str, Any]] = {
        row["schedule_id"]: dict(row)
        for row in Occurrence.objects.filter(schedule_id__in=ids)
        .values("schedule_id")
        .annotate(
            next_pending=Min("scheduled_for", filter=Q(state=OccurrenceState.SCHEDULED.value)),
            last_finished=Max("scheduled_for", filter=Q(state__in=FINISHED)),
            last_success=Max(ENDED, filter=Q(state=OccurrenceState.SUCCEEDED.value)),
            last_dead=Max(ENDED, filter=Q(state=OccurrenceState.DEAD.value)),
        )
    }
    last_rows: dict[Any, Any] = {}
    pairs = [(pk, row["last_finished"]) for pk, row in per_schedule.items() if row["last_finished"]]
    if pairs:
        match = Q()
        for pk, when in pairs:
            match |= Q(schedule_id=pk, scheduled_for=when)
        for occurrence in Occurrence.objects.filter(match, state__in=FINISHED).only(
            "schedule_id", "scheduled_for", "state", "enqueued_at", "reason"
        ):
            last_rows[occurrence.schedule_id] = occurrence
    failures = dict(
        Attempt.objects.filter(
            SAME_SLOT, occurrence__schedule_id__in=ids, outcome__in=FAILED_ATTEMPTS
        )
        .values("occurrence__schedule_id")
        .annotate(at=Max("finished_at"))
        .values_list("occurrence__schedule_id", "at")
    )
    summaries = {}
    for pk in ids:
        row = per_schedule.get(pk, {})
        last = last_rows.get(pk)
        summaries[pk] = RowSummary(
            next_pending=row.get("next_pending"),
            last_state=last.state if last else None,
            last_scheduled_for=last.scheduled_for if last else None,
            last_lag=last.lag_seconds if last else None,
            last_reason=last.reason if last else "",
            last_success=row.get("last_success"),
            last_failure=_latest(failures.get(pk), row.get("last_dead")),
        )
    return summaries
