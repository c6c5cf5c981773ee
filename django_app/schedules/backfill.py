"""Backfill: run the fire times of a past range of a schedule as occurrences, once.

Identity. A backfilled time ``t`` is the occurrence ``occurrence_id(schedule, 0, t)``
stored with ``schedule_version = 0`` (versions start at 1, so backfill has its own key
space under the ``(schedule, schedule_version, scheduled_for)`` unique constraint) and
``manual = True`` (like run now: it survives version changes and pauses, is never expected
by the reconciler, and does not count against ``max_runs``). The rows are inserted with
``ON CONFLICT DO NOTHING`` and an outbox row is written only for rows this call created, so
backfilling the same range twice (or overlapping ranges) never runs a time twice.

Times that already ran under the schedule are left out: a time with an occurrence of any
version that is pending, running, succeeded or dead (``replay_occurrence`` is the way to
re-run a dead one). Missed, canceled and skipped times are backfilled.

Pruned history. Retention deletes old occurrences, so "no row that ran" may mean "ran, and
its row is gone". Before it deletes, retention keeps per schedule what this rule reads of
the rows (:class:`~django_app.models.PrunedHistory`): the ``scheduled_for`` of the pruned
rows that ran (``ran``) and of the pruned backfill rows (``backfilled``), in a compact set
form. Those are left out like the rows they stand for, so a backfill over pruned history
runs exactly the times it would have run had nothing been pruned. Only the span pruned
before that record existed (``unknown_from``/``unknown_through``, set by migration 0024)
cannot be answered: a backfill that would have to run a time inside it is refused whole
(``HistoryPruned``, a ValidationError on ``start`` naming the span) and runs nothing. The
rows are read before the record: a prune committing in between has written the record of
a row before its delete commits, so the time is seen in one or the other.

Pacing. With the tenant's ``catchup_rate`` (per minute), the created occurrences become
publishable one per ``60 / rate`` seconds in consecutive slots reserved from the tenant's
shared catch-up budget (:func:`django_app.tenancy.budget.reserve_catchup`, the same one the
materializers use for late fire times, across every node), so backfills and catch-up of one
tenant queue behind each other; without a rate, all at once. The relay then publishes them
like any due row (fair order, ``max_trigger_rate``), and the claim applies the overlap
policy given here (default: the schedule's) and ``max_running``.

Not ahead of the schedule. On an ACTIVE schedule the range must end at its cursor: the
times from there on are the beats' to plan (behind ``now`` only after an outage) by the
misfire policy, and backfilled too they would run twice (``ValidationError`` on ``end``).
A paused or parked schedule may be backfilled over its whole past: the version that
resumes it counts backfilled times as taken (:mod:`django_app.schedules.replan`).

Bounds. ``end`` must not be in the future, and one call covers at most
``MAX_FIRE_TIMES`` fire times (``ValidationError`` on ``end`` beyond that: split the range).
Everything is one transaction under the schedule row lock.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.db import transaction

from celery_scheduler import errors
from celery_scheduler.api_types import BackfillReport
from celery_scheduler.core import ids, timeset
from celery_scheduler.core.enums import OccurrenceState as S
from celery_scheduler.core.enums import OverlapPolicy, ScheduleState
from celery_scheduler.core.timemath import fire_times
from django_app.db.retry import retry_lock_conflicts
from django_app.materialize.per_schedule import insert_ignore, trigger_for
from django_app.models import Occurrence, OutboxEntry, PrunedHistory, Schedule, Tenant
from django_app.schedules import audit, validation
from django_app.schedules.reads import BACKFILL_REASON, get_schedule
from django_app.tenancy import budget

#: Fire times one backfill call may create at most.
MAX_FIRE_TIMES = 10_000
#: The schedule_version of backfilled occurrences (a key space of their own).
BACKFILL_VERSION = 0
#: States of a version's row that count as ran (a backfill leaves its time out).
RAN_STATES = [
    s.value for s in (S.SCHEDULED, S.ENQUEUED, S.RUNNING, S.RETRY_WAIT, S.SUCCEEDED, S.DEAD)
]


@retry_lock_conflicts
def backfill(
    schedule_id: uuid.UUID | str,
    start: datetime | str,
    end: datetime | str,
    *,
    overlap_policy: str | None = None,
    tenant: str | None = None,
    audited_by: tuple[str, str] = ("", ""),
    now: datetime,
) -> BackfillReport:
    """See :func:`celery_scheduler.api.backfill`.

    ``audited_by`` is the ``(actor, reason)`` pair :func:`audit.check` passed; the entry is
    written in the backfill's transaction, with the range and the runs it created.
    """
    lo = validation.aware_datetime(start, "start")
    hi = validation.aware_datetime(end, "end")
    if lo is None:
        raise errors.ValidationError("start is required", field="start")
    if hi is None:
        raise errors.ValidationError("end is required", field="end")
    if hi <= lo:
        raise errors.ValidationError(
            f"end ({hi.isoformat()}) must be after start ({lo.isoformat()})", field="end"
        )
    if hi > now:
        raise errors.ValidationError(
            f"end ({hi.isoformat()}) is in the future; backfill covers past fire times only",
            field="end",
        )
    policy = ""
    if overlap_policy is not None:
        policy = validation.enum_member(OverlapPolicy, overlap_policy, "overlap_policy").value
    get_schedule(schedule_id, tenant)  # not found / another tenant's, before any lock
    with transaction.atomic():
        schedule = Schedule.objects.select_for_update().get(pk=uuid.UUID(str(schedule_id)))
        if schedule.state == ScheduleState.CANCELED:
            raise errors.InvalidStateTransition(
                f"schedule {schedule.id} is CANCELED; a canceled schedule cannot be backfilled"
            )
        times = _fire_times(schedule, lo, hi)
        _refuse_unplanned(schedule, times)
        done = set(
            Occurrence.objects.filter(
                schedule=schedule, scheduled_for__gte=lo, scheduled_for__lt=hi
            ).values_list("schedule_version", "scheduled_for", "state")
        )
        already_backfilled = {t for v, t, _ in done if v == BACKFILL_VERSION}
        already_ran = {t for v, t, state in done if v != BACKFILL_VERSION and state in RAN_STATES}
        pruned = PrunedHistory.objects.filter(schedule_id=schedule.id).first()
        if pruned is not None:  # read after the rows: see the module doc
            ran, backfilled = _pruned_left_out(pruned, times)
            already_ran |= ran
            already_backfilled |= backfilled
        wanted = [t for t in times if t not in already_backfilled and t not in already_ran]
        _refuse_unknown(pruned, wanted)
        slots = _release_slots(schedule, len(wanted), now)
        rows = [_row(schedule, t, at, policy, now) for t, at in zip(wanted, slots, strict=True)]
        created = insert_ignore(Occurrence, rows)
        OutboxEntry.objects.bulk_create(
            OutboxEntry(
                occurrence_id=row["id"], scheduled_for=row["scheduled_for"],
                tenant_id=schedule.tenant_id, shard=schedule.shard,
                available_at=row["available_at"], priority=schedule.priority,
            )
            for row in rows
            if row["id"] in created
        )  # fmt: skip
        releases = [row["available_at"] for row in rows if row["id"] in created]
        audit.entry(
            "backfill", schedule, actor=audited_by[0], reason=audited_by[1], at=now,
            detail={"start": lo.isoformat(), "end": hi.isoformat(), "created": len(created)},
        ).save(force_insert=True)  # fmt: skip
        return BackfillReport(
            schedule_id=schedule.id,
            start=lo,
            end=hi,
            fire_times=len(times),
            created=[row["id"] for row in rows if row["id"] in created],
            already_backfilled=len(already_backfilled & set(times)) + (len(rows) - len(created)),
            already_ran=len(already_ran & set(times)),
            releases_from=min(releases) if releases else None,
            releases_until=max(releases) if releases else None,
        )


def _pruned_left_out(
    pruned: PrunedHistory, times: list[datetime]
) -> tuple[set[datetime], set[datetime]]:
    """Of ``times``, those whose pruned rows backfill would leave out: (ran, backfilled)."""
    inside = {timeset.to_int(t): t for t in times if pruned.first <= t <= pruned.through}
    if not inside:
        return set(), set()
    ran = timeset.members(pruned.ran, inside)
    backfilled = timeset.members(pruned.backfilled, inside)
    return {inside[v] for v in ran}, {inside[v] for v in backfilled}


def _refuse_unplanned(schedule: Schedule, times: list[datetime]) -> None:
    """Refuse the times an ACTIVE schedule has still to plan itself (at or after its cursor:
    behind after an outage): its beats plan them by the misfire policy, and run also as
    backfills they would run twice. A paused or parked schedule's re-plan leaves out the
    times backfilled meanwhile (:mod:`django_app.schedules.replan`)."""
    cursor = schedule.next_run_at
    if schedule.state != ScheduleState.ACTIVE or cursor is None or not times:
        return
    if times[-1] >= cursor:
        raise errors.ValidationError(
            f"the schedule has not planned its fire times from {cursor.isoformat()} on yet "
            f"(its beats plan them by its misfire policy; backfilled too, they would run "
            f"twice); backfill up to {cursor.isoformat()}, or once the beats have planned "
            "them (the times they missed can be backfilled then)",
            field="end",
        )


def _refuse_unknown(pruned: PrunedHistory | None, wanted: list[datetime]) -> None:
    """Refuse when a time to run lies where retention deleted rows before it kept what
    backfill needs of them (an install pruned before migration 0024)."""
    if pruned is None or pruned.unknown_from is None or pruned.unknown_through is None:
        return
    lo, hi = pruned.unknown_from, pruned.unknown_through
    unknown = [t for t in wanted if lo <= t <= hi]
    if unknown:
        raise errors.HistoryPruned(
            f"retention deleted this schedule's runs scheduled between "
            f"{lo.isoformat()} and {hi.isoformat()} before it kept which of them ran, so "
            f"backfill cannot tell whether {len(unknown)} fire times of the range in that "
            f"span ran (the first: {unknown[0].isoformat()}); nothing was backfilled. Start "
            f"after {hi.isoformat()}, or run a time again on purpose with run_now"
        )


def _fire_times(schedule: Schedule, lo: datetime, hi: datetime) -> list[datetime]:
    """The fire times of the schedule's trigger in ``[lo, hi)``, at most MAX_FIRE_TIMES."""
    try:
        trigger = trigger_for(schedule)
        first = trigger.first_at_or_after(lo)
    except (errors.SchedulerError, ValueError) as exc:
        raise errors.ValidationError(
            f"the schedule's timing cannot be planned: {exc}", field="start"
        ) from exc
    times: list[datetime] = []
    if first is None or first >= hi:
        return times
    times.append(first)
    for t in fire_times(trigger, first, until=hi):
        if t >= hi:
            break
        times.append(t)
        if len(times) > MAX_FIRE_TIMES:
            raise errors.ValidationError(
                f"[{lo.isoformat()}, {hi.isoformat()}) holds more than {MAX_FIRE_TIMES} fire "
                "times; backfill it in smaller ranges",
                field="end",
            )
    return times


def _release_slots(schedule: Schedule, count: int, now: datetime) -> list[datetime]:
    """When each of ``count`` new occurrences becomes publishable: consecutive slots of the
    tenant's shared catch-up budget (the one late materializations use), or now."""
    rate = Tenant.objects.values_list("catchup_rate", flat=True).get(pk=schedule.tenant_id)
    if not rate or count == 0:
        return [now] * count
    first = budget.reserve_catchup({schedule.tenant_id: (rate, count)}, now)[schedule.tenant_id]
    step = budget.catchup_interval(rate)
    return [first + i * step for i in range(count)]


def _row(
    schedule: Schedule, t: datetime, at: datetime, policy: str, now: datetime
) -> dict[str, Any]:
    return {
        "id": ids.occurrence_id(schedule.id, BACKFILL_VERSION, t),
        "schedule_id": schedule.id,
        "schedule_version": BACKFILL_VERSION,
        "tenant_id": schedule.tenant_id,
        "scheduled_for": t,
        "available_at": at,
        "state": S.SCHEDULED.value,
        "manual": True,
        "reason": BACKFILL_REASON,
        "overlap_policy": policy,
        "created_at": now,
    }
