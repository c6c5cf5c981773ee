"""Limited runs (``max_runs``) and ``pause_after_failures``, on the worker's write path.

**max_runs.** A run is counted in the claim transaction, under the schedule row lock the
claim already holds (so racing claims count one after another): when a scheduled (not
manual) occurrence is claimed for its first attempt. A retry, a re-claim after a lost
lease or a replay of the same occurrence has ``attempt_count > 0`` and is the same run.
The claim that reaches ``max_runs`` completes the schedule in the same transaction: state
COMPLETED, cursor cleared, live version closed (the reconciler expects nothing after it),
and the occurrences planned ahead that never started become CANCELED with the reason. A
claim of a first attempt once the limit is reached is refused (STALE, body not run).

**pause_after_failures.** Each DEAD occurrence (worker failure or a lease expiry that
used up the attempts) adds one to ``consecutive_failures``; a success resets it. The
update runs in the transaction that writes the outcome, and that transaction locks the
schedule row *before* the occurrence row (the claim's order, so the two cannot deadlock),
only for schedules that have ``pause_after_failures`` set. Reaching the limit pauses the
schedule there (a new version, pending occurrences invalidated, the reason recorded).
"""

from __future__ import annotations

import uuid
from datetime import datetime

from django.db.models import F

from celery_scheduler.core.enums import OccurrenceState as S
from celery_scheduler.core.enums import ScheduleState
from celery_scheduler.core.states import UNCLAIMED
from django_app.models import Occurrence, OutboxEntry, Schedule, ScheduleCursor
from django_app.querysets import by_key
from django_app.schedules.lifecycle import close_live_version, pause_locked
from django_app.tenancy import waiting


def counts_as_run(occ: Occurrence) -> bool:
    return not occ.manual and occ.attempt_count == 0


def over_max_runs(schedule: Schedule, occ: Occurrence) -> str:
    """Why this claim must not start a new run ("" when it may)."""
    if schedule.max_runs is None or not counts_as_run(occ):
        return ""
    if schedule.runs_count < schedule.max_runs:
        return ""
    return f"max_runs reached ({schedule.runs_count} of {schedule.max_runs} runs made)"


def count_run(schedule: Schedule, occ: Occurrence, now: datetime) -> None:
    """Count the run ``occ`` starts (claim transaction, schedule row locked)."""
    if schedule.max_runs is None or not counts_as_run(occ):
        return
    schedule.runs_count += 1
    fields = {"runs_count": schedule.runs_count, "updated_at": now}
    if schedule.runs_count >= schedule.max_runs and schedule.state not in (
        ScheduleState.CANCELED,
        ScheduleState.COMPLETED,
    ):
        # The cursor row next (after the schedule, as every writer): a materializer's
        # cursor move waits for this transaction, then finds the schedule ended.
        ScheduleCursor.objects.select_for_update().filter(pk=schedule.pk).first()
        close_live_version(schedule, now)
        reason = f"max_runs reached ({schedule.max_runs} runs made)"
        ahead = (
            Occurrence.objects.unclaimed()
            .filter(schedule=schedule, manual=False, attempt_count=0)
            .exclude(pk=occ.pk)
        )
        ahead_rows = list(ahead.values_list("id", "tenant_id", "reason"))
        ahead_ids = [row[0] for row in ahead_rows]
        Occurrence.objects.filter(id__in=ahead_ids).transition(
            S.CANCELED, only_from=UNCLAIMED, finished_at=now, reason=reason
        )
        # Waiters among them leave their lines without a claim (tenancy.waiting).
        waiting.wake_after_leaving(((t, why) for _, t, why in ahead_rows), now)
        OutboxEntry.objects.unsent().filter(occurrence_id__in=ahead_ids).update(
            sent_at=now, claimed_by="completed", claim_expires_at=None
        )
        schedule.state = ScheduleState.COMPLETED.value
        schedule.next_run_at = None
        fields.update(state=schedule.state, next_run_at=None)
    Schedule.objects.filter(pk=schedule.pk).update(**fields)


def lock_for_failures(
    occurrence_id: uuid.UUID, scheduled_for: datetime | None = None
) -> Schedule | None:
    """Lock the occurrence's schedule if it counts failures (call first in the transaction);
    ``scheduled_for``, when known, is the occurrence's partition key."""
    row = (
        by_key(Occurrence.objects.filter(pk=occurrence_id), scheduled_for)
        .values_list("schedule_id", "schedule__pause_after_failures")
        .first()
    )
    if row is None or row[1] is None:
        return None
    return Schedule.objects.select_for_update().get(pk=row[0])


def record_outcome(
    schedule: Schedule | None, *, dead: bool, occurrence_id: uuid.UUID, now: datetime
) -> None:
    """After a DEAD (``dead``) or SUCCEEDED write, in its transaction (schedule locked)."""
    if schedule is None or schedule.pause_after_failures is None:
        return
    if not dead:
        if schedule.consecutive_failures:
            Schedule.objects.filter(pk=schedule.pk).update(consecutive_failures=0)
        return
    Schedule.objects.filter(pk=schedule.pk).update(
        consecutive_failures=F("consecutive_failures") + 1
    )
    schedule.consecutive_failures += 1
    limit = schedule.pause_after_failures
    if schedule.consecutive_failures < limit or schedule.state != ScheduleState.ACTIVE:
        return

    reason = (
        f"paused after {schedule.consecutive_failures} consecutive failed occurrences "
        f"(pause_after_failures={limit}; last: {occurrence_id})"
    )
    pause_locked(schedule, now, reason)
