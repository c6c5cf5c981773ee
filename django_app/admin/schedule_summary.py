"""What the schedule list shows per row, fetched once per page rather than once per row.

For the schedules on one changelist page: the next pending occurrence (the earliest one still
SCHEDULED: the internal ``next_run_at`` cursor is one period later), the last finished one
with its state and lag (a CANCELED or a future SCHEDULED row is not a run), and when the
schedule last succeeded and last failed. Four queries per page, whatever its length.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import F, Max, Min, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce

from celery_scheduler.core.enums import AttemptOutcome, OccurrenceState
from django_app.models import Attempt, Occurrence, Schedule
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
SCHEDULED = OccurrenceState.SCHEDULED.value
SUCCEEDED = OccurrenceState.SUCCEEDED.value
DEAD = OccurrenceState.DEAD.value


@dataclass(frozen=True)
class RowSummary:
    next_pending: datetime | None = None
    last_state: str | None = None
    last_scheduled_for: datetime | None = None
    last_lag: float | None = None
    #: Why the last run exists when not by the schedule ("run now", "backfill"), else "".
    last_reason: str = ""
    #: When the latest successful run (by scheduled time) ended.
    last_success: datetime | None = None
    #: When an attempt last failed or was retried, or a run last went DEAD.
    last_failure: datetime | None = None


def _latest(*instants: datetime | None) -> datetime | None:
    known = [t for t in instants if t is not None]
    return max(known) if known else None


def _newest(states: Iterable[str], value: Any) -> Subquery:
    """``value`` of the schedule's (``OuterRef("pk")``) latest row in ``states``: a walk back
    through its rows by time (``occurrence_schedule_time``) that stops at the first match."""
    rows = Occurrence.objects.filter(schedule_id=OuterRef("pk"), state__in=list(states))
    return Subquery(rows.order_by("-scheduled_for").annotate(v=value).values("v")[:1])


def summarize(schedules: Iterable[Any]) -> dict[Any, RowSummary]:
    """Schedule pk -> RowSummary for the given schedules.

    Each figure is read where an index holds it, so a page costs what its rows' latest and
    unusual occurrences cost, not their whole history: the pending and DEAD rows through the
    indexes by state (which hold no SUCCEEDED rows), the latest finished and succeeded rows
    by walking back from the newest, and the failed attempts from the rows that can have
    one (not SUCCEEDED, or tried more than once: ``occurrence_retried``).
    """
    ids = [s.pk for s in schedules]
    if not ids:
        return {}
    per_schedule: dict[Any, dict[str, Any]] = {pk: {} for pk in ids}
    for found in (
        Occurrence.objects.filter(schedule_id__in=ids, state__in=[SCHEDULED, DEAD])
        .values("schedule_id")
        .annotate(
            next_pending=Min("scheduled_for", filter=Q(state=SCHEDULED)),
            last_dead=Max(ENDED, filter=Q(state=DEAD)),
        )
    ):
        per_schedule[found["schedule_id"]].update(found)
    for pk, last_finished, last_success in (
        Schedule.objects.filter(pk__in=ids)
        .annotate(
            last_finished=_newest(FINISHED, F("scheduled_for")),
            last_success=_newest([SUCCEEDED], ENDED),
        )
        .values_list("pk", "last_finished", "last_success")
    ):
        per_schedule[pk].update(last_finished=last_finished, last_success=last_success)
    last_rows: dict[Any, Any] = {}
    pairs = [(pk, row.get("last_finished")) for pk, row in per_schedule.items()]
    pairs = [(pk, when) for pk, when in pairs if when]
    if pairs:
        match = Q()
        for pk, when in pairs:
            match |= Q(schedule_id=pk, scheduled_for=when)
        for occurrence in Occurrence.objects.filter(match, state__in=FINISHED).only(
            "schedule_id", "scheduled_for", "state", "enqueued_at", "reason"
        ):
            last_rows[occurrence.schedule_id] = occurrence
    may_have_failed = ~Q(occurrence__state=SUCCEEDED) | Q(occurrence__attempt_count__gt=1)
    failures = dict(
        Attempt.objects.filter(
            SAME_SLOT,
            may_have_failed,
            occurrence__schedule_id__in=ids,
            outcome__in=FAILED_ATTEMPTS,
        )
        .values("occurrence__schedule_id")
        .annotate(at=Max("finished_at"))
        .values_list("occurrence__schedule_id", "at")
    )
    summaries = {}
    for pk in ids:
        row = per_schedule[pk]
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
