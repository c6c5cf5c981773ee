"""Skip one fire time of a schedule without pausing it.

A skip is recorded twice, in the caller's transaction under the schedule row lock:

- in ``Schedule.skip_times`` (UTC ISO strings), so that it survives version changes: every
  version the lifecycle opens re-marks the skipped times from where it starts, and a
  re-plan of the span before that passes over them;
- as a CANCELED occurrence with the deterministic id of (schedule, live version, time) and
  the reason ``skipped by operator[: note]``. Both materializers insert with
  ``ON CONFLICT DO NOTHING`` and write an outbox row only for rows they created, so that
  time is never published; the reconciler finds the row (status ``canceled``), so the time
  is never reported ABSENT. If the time was already materialized and not yet claimed, that
  occurrence becomes CANCELED (a worker that gets its message anyway sees a finished
  occurrence and does not run the body).
"""

from __future__ import annotations

import uuid
from datetime import datetime

from django.db import transaction

from celery_scheduler import errors
from celery_scheduler.api_types import SkipResult
from celery_scheduler.core import ids
from celery_scheduler.core.enums import OccurrenceState, ScheduleState
from celery_scheduler.core.states import UNCLAIMED
from django_app.db.retry import retry_lock_conflicts
from django_app.materialize.per_schedule import insert_ignore, trigger_for
from django_app.models import Occurrence, OutboxEntry, Schedule
from django_app.querysets import transition
from django_app.schedules import audit, validation
from django_app.schedules.reads import SKIP_REASON, get_schedule, skip_key
from django_app.tenancy import waiting

#: Longest skip note: the marker's ``reason`` column holds ``"<SKIP_REASON>: <note>"``.
MAX_NOTE = (Occurrence._meta.get_field("reason").max_length or 0) - len(f"{SKIP_REASON}: ")


@retry_lock_conflicts
def skip_occurrence(
    schedule_id: uuid.UUID | str,
    scheduled_for: datetime | str | None = None,
    *,
    note: str = "",
    tenant: str | None = None,
    audited_by: tuple[str, str] = ("", ""),
    now: datetime,
) -> SkipResult:
    """See :func:`celery_scheduler.api.skip_occurrence`.

    ``audited_by`` is the ``(actor, reason)`` pair :func:`audit.check` passed; the entry is
    written in the skip's transaction, so a skip is never made without it.
    """
    # The note is kept in the marker's reason (a 200-character column) after the prefix.
    note = validation.checked_text(note, "note", max_length=MAX_NOTE)
    target = validation.aware_datetime(scheduled_for, "scheduled_for")
    reason = f"{SKIP_REASON}: {note}" if note else SKIP_REASON
    get_schedule(schedule_id, tenant)  # not found / other tenant, before taking a lock
    with transaction.atomic():
        schedule = Schedule.objects.select_for_update().get(pk=uuid.UUID(str(schedule_id)))
        if schedule.state in (ScheduleState.CANCELED, ScheduleState.COMPLETED):
            raise errors.InvalidStateTransition(
                f"schedule {schedule.id} is {schedule.state}; nothing is left to skip"
            )
        if target is None:
            target = _next_unrun(schedule)
        else:
            _require_fire_time(schedule, target, now)
        key = skip_key(target)
        occurrence = (
            Occurrence.objects.select_for_update()
            .filter(
                schedule=schedule,
                schedule_version=schedule.version,
                scheduled_for=target,
                manual=False,
            )
            .first()
        )
        occurrence_id = None
        if occurrence is not None:
            occurrence_id = _cancel(occurrence, reason, now)
        elif target < now and (schedule.next_run_at is None or target < schedule.next_run_at):
            raise errors.ValidationError(
                f"{target.isoformat()} is in the past and was never planned to run",
                field="scheduled_for",
            )
        if key not in (schedule.skip_times or []):
            # The earlier skips stay, behind the cursor too: a new version may re-plan from
            # before them (an unclaimed time), and its marker rows are only the old
            # version's. The lifecycle drops those before the version it opens.
            schedule.skip_times = sorted({*(schedule.skip_times or []), key})
            schedule.save(update_fields=["skip_times", "updated_at"])
        if occurrence is None and schedule.state == ScheduleState.ACTIVE:
            _mark(schedule, target, reason, now)
        actor, why = audited_by
        audit.entry(
            "skip", schedule, actor=actor, reason=why or note, at=now,
            detail={"scheduled_for": target.isoformat()},
        ).save(force_insert=True)  # fmt: skip
        return SkipResult(
            schedule_id=schedule.id,
            scheduled_for=target,
            occurrence_id=occurrence_id,
            reason=reason,
        )


def _next_unrun(schedule: Schedule) -> datetime:
    """The earliest time of the live version not claimed yet: pending row, else the cursor."""
    if schedule.state != ScheduleState.ACTIVE:
        raise errors.InvalidStateTransition(
            f"schedule {schedule.id} is {schedule.state}: it has no next occurrence; "
            "give scheduled_for to skip a given time"
        )
    pending = (
        Occurrence.objects.unclaimed()
        # attempt 0: a run waiting to retry (RETRY_WAIT) was claimed, it is not "next".
        .filter(schedule=schedule, schedule_version=schedule.version, manual=False, attempt_count=0)
        .order_by("scheduled_for")
        .values_list("scheduled_for", flat=True)
        .first()
    )
    if pending is not None:
        return pending
    cursor = schedule.next_run_at
    skipped = set(schedule.skip_times or [])
    if cursor is not None and skip_key(cursor) in skipped:
        trigger = trigger_for(schedule)
        while cursor is not None and skip_key(cursor) in skipped:
            cursor = trigger.next_after(cursor)
    if cursor is None or (schedule.end_at is not None and cursor > schedule.end_at):
        raise errors.InvalidStateTransition(f"schedule {schedule.id} has no next fire time")
    return cursor


def _require_fire_time(schedule: Schedule, target: datetime, now: datetime) -> None:
    try:
        trigger = trigger_for(schedule)
        is_fire_time = trigger.first_at_or_after(target) == target
    except (errors.SchedulerError, ValueError) as exc:
        raise errors.ValidationError(
            f"the schedule's timing cannot be planned: {exc}", field="scheduled_for"
        ) from exc
    if not is_fire_time:
        raise errors.ValidationError(
            f"{target.isoformat()} is not a fire time of this schedule", field="scheduled_for"
        )
    if schedule.end_at is not None and target > schedule.end_at:
        raise errors.ValidationError(
            f"{target.isoformat()} is after the schedule's end_at", field="scheduled_for"
        )


def _cancel(occurrence: Occurrence, reason: str, now: datetime) -> uuid.UUID:
    state = OccurrenceState(occurrence.state)
    if state is OccurrenceState.CANCELED and occurrence.reason.startswith(SKIP_REASON):
        return occurrence.id  # skipped before: the same answer
    if state not in UNCLAIMED:
        raise errors.InvalidStateTransition(
            f"occurrence {occurrence.id} at {occurrence.scheduled_for.isoformat()} is "
            f"{state}; only an occurrence not yet claimed can be skipped"
        )
    # Locked above (select_for_update) in an unclaimed state: the move cannot miss.
    transition(
        occurrence.pk, OccurrenceState.CANCELED, only_from=state, finished_at=now, reason=reason
    )
    OutboxEntry.objects.unsent().filter(occurrence_id=occurrence.pk).update(
        sent_at=now, claimed_by="skipped", claim_expires_at=None
    )
    waiting.wake_after_leaving([(occurrence.tenant_id, occurrence.reason)], now)
    return occurrence.id


def _mark(schedule: Schedule, at: datetime, reason: str, now: datetime) -> None:
    insert_ignore(
        Occurrence,
        [
            {
                "id": ids.occurrence_id(schedule.id, schedule.version, at),
                "schedule_id": schedule.id,
                "schedule_version": schedule.version,
                "tenant_id": schedule.tenant_id,
                "scheduled_for": at,
                "available_at": at,
                "state": OccurrenceState.CANCELED.value,
                "finished_at": now,
                "reason": reason,
                "created_at": now,
            }
        ],
    )


def mark_skipped_times(schedule: Schedule, valid_from: datetime) -> None:
    """Re-mark the skipped times still ahead for the version the lifecycle just opened.

    A time that is no longer a fire time of the (possibly updated) trigger is dropped from
    ``skip_times``: it would never fire anyway. The caller saves the schedule row.
    """
    try:
        trigger = trigger_for(schedule)
    except (errors.SchedulerError, ValueError):
        return  # cannot be planned: the materializer will park it; keep the skips
    kept = []
    for key in schedule.skip_times or []:
        at = datetime.fromisoformat(key)
        if at < valid_from or trigger.first_at_or_after(at) != at:
            continue
        kept.append(key)
        _mark(schedule, at, SKIP_REASON, valid_from)
    schedule.skip_times = kept
