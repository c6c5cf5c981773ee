"""Where a new schedule version starts: invalidated times run again, times that ran never do.

A lifecycle call that bumps the version (update, resume, and the beat_schedule sync through
update) cancels the older versions' unclaimed occurrences. The times of those that nobody had
claimed yet are planned again under the new version; a time that an older version claimed or
finished (RUNNING, SUCCEEDED, RETRY_WAIT, DEAD, MISSED, SKIPPED_OVERLAP, or CANCELED after a
claim) is never planned again, whatever the version: its new occurrence would have a new id,
so the default idempotency key would not dedupe it and the effect would run twice. Nor is a
time that was backfilled (a version-0 row), or that was taken in any of these ways and whose
row retention deleted since (its ``PrunedHistory``).

The set of times an older version "took" is frozen once the bump commits: a claim locks the
schedule row and re-checks the version, so nothing of an older version is claimed after it.
The lifecycle call therefore decides here, under the schedule row lock, and the materializers
(per-schedule and set-based) need no extra check: when taken times lie at or after the
re-plan start, this module materializes the span up to the last of them itself (skipping
them) and leaves the cursor after it, so no materializer pass ever plans a taken time.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta

from django.db.models import Q, QuerySet

from celery_scheduler.core import timeset
from celery_scheduler.core.enums import MisfirePolicy, OccurrenceState
from celery_scheduler.core.policies import PassPlan, plan_pass
from django_app import conf
from django_app.materialize import per_schedule as single
from django_app.models import Occurrence, PrunedHistory, Schedule
from django_app.schedules.backfill import BACKFILL_VERSION, RAN_STATES

#: An occurrence leaves its time free only if it was canceled before any claim (attempt 0).
TAKEN = ~Q(state=OccurrenceState.CANCELED.value, attempt_count=0)
#: A version's row that took its time without running (MISSED, SKIPPED_OVERLAP, CANCELED
#: after a claim): retention keeps its time in ``PrunedHistory.passed_over``.
PASSED_OVER = TAKEN & ~Q(state__in=RAN_STATES) & ~Q(schedule_version=BACKFILL_VERSION)


def is_taken(state: str, attempt_count: int) -> bool:
    """Python twin of :data:`TAKEN` (the reconciler filters rows it already loaded)."""
    return not (state == OccurrenceState.CANCELED and attempt_count == 0)


def _never_claimed_rows(schedule: Schedule) -> QuerySet[Occurrence]:
    # RETRY_WAIT (and ENQUEUED again after a lost lease) has been claimed: it is
    # invalidated, but its time is not re-planned.
    return Occurrence.objects.unclaimed().filter(
        schedule=schedule, schedule_version__lte=schedule.version, attempt_count=0, manual=False
    )


def earliest_never_claimed(schedule: Schedule) -> datetime | None:
    """The earliest time whose occurrence the coming invalidation cancels before any claim
    (call it before the version's unclaimed occurrences are canceled)."""
    rows = _never_claimed_rows(schedule).order_by("scheduled_for")
    return rows.values_list("scheduled_for", flat=True).first()


def never_claimed(schedule: Schedule) -> set[datetime]:
    """The times of the fire rows the coming invalidation cancels before any claim (call it
    before the invalidation): runs an older version decided and the workers have not
    started yet, which :func:`start_version_at` takes over as ``owed``."""
    return set(_never_claimed_rows(schedule).values_list("scheduled_for", flat=True))


def start_version_at(
    schedule: Schedule,
    start: datetime | None,
    *,
    now: datetime,
    owed: Collection[datetime] = (),
) -> datetime | None:
    """Plan the (already bumped) ``schedule.version`` from ``start``; returns the new cursor.

    ``owed``: times of an older version's fire rows that were invalidated before any claim
    (:func:`never_claimed`; the same trigger's times). The older version had decided that
    they fire, and a message waiting for a busy worker is not a missed time: they fire under
    the new version whatever their lateness now, never judged by the misfire policy again.

    Without taken times at or after ``start``, nor owed ones due by ``now`` or before
    ``start``, the cursor is ``start`` itself (the materializer continues from there).
    Otherwise the span from ``start`` to the last taken time (or to ``now`` if later, so the
    misfire policy sees every late time in one plan) is materialized here, in the caller's
    transaction, without the taken and the skipped times, the owed ones as fire rows; the
    returned cursor is the first fire time after that span (``None``: no fire time is left).
    """
    skipped = {datetime.fromisoformat(t) for t in schedule.skip_times or []}
    if start is None:
        _write_owed(schedule, set(owed) - skipped, now=now)
        return None
    taken = set(
        Occurrence.objects.filter(
            Q(manual=False) | Q(schedule_version=BACKFILL_VERSION),
            schedule=schedule,
            schedule_version__lt=schedule.version,
            scheduled_for__gte=start,
        )
        .filter(TAKEN)
        .values_list("scheduled_for", flat=True)
    )
    taken |= pruned_runs(schedule, start)
    owed = set(owed) - taken - skipped
    before = {t for t in owed if t < start}
    in_span = owed - before
    if not taken and not before and all(t > now for t in in_span):
        return start  # owed times still ahead are planned on time by the materializer
    until = max([*taken, now])
    # The skipped times too: their markers for this version are written after this plan
    # (the lifecycle's _open_version), so nothing else keeps them out of it.
    passed_over = taken | skipped | in_span
    cursor: datetime | None = start
    max_missed = conf.get().max_missed_per_pass
    # plan_pass bounds each plan; a long span takes a few (each is small).
    while cursor is not None and cursor <= until:
        plan = _plan(schedule, cursor, now=now, until=until, max_missed=max_missed)
        _write(schedule, _without(plan, passed_over), now=now)
        # The late times the policy jumped over (more than max_missed_per_pass), recorded
        # for the reconciler as the materializer records them, or each would read ABSENT.
        single.record_skipped_spans([(schedule, plan)], now=now, max_missed=max_missed)
        if plan.next_cursor is not None and plan.next_cursor <= cursor:
            break  # no progress (cannot happen with a valid trigger); let the materializer go on
        cursor = plan.next_cursor
    _write_owed(schedule, before | {t for t in in_span if t <= until}, now=now)
    return cursor


def _write_owed(schedule: Schedule, owed: set[datetime], *, now: datetime) -> None:
    """Fire rows of the new version for ``owed`` times; those past ``max_lateness`` are late
    (a CATCH_UP tenant's catch-up budget paces them, as the materializer's late times)."""
    if not owed:
        return
    late_before = now - timedelta(seconds=schedule.max_lateness_seconds)
    fire = sorted(owed)
    late = frozenset(t for t in fire if t < late_before)
    _write(schedule, PassPlan(fire=fire, missed=[], late=late, next_cursor=None), now=now)


def pruned_runs(schedule: Schedule, start: datetime) -> set[datetime]:
    """The times at or after ``start`` that were taken (ran, were backfilled or passed over)
    and whose rows retention has deleted since (:class:`PrunedHistory`): taken like the
    rows that are still there."""
    pruned = PrunedHistory.objects.filter(schedule_id=schedule.id).first()
    if pruned is None or pruned.through < start:
        return set()
    lo = timeset.to_int(start)
    kept = [
        *timeset.decode(pruned.ran),
        *timeset.decode(pruned.backfilled),
        *timeset.decode(pruned.passed_over),
    ]
    return {timeset.from_int(at) for at in kept if at >= lo}


def _plan(
    schedule: Schedule, cursor: datetime, *, now: datetime, until: datetime, max_missed: int
) -> PassPlan:
    return plan_pass(
        single.trigger_for(schedule),
        cursor,
        now=now,
        until=until,
        policy=MisfirePolicy(schedule.misfire_policy),
        max_lateness=timedelta(seconds=schedule.max_lateness_seconds),
        catchup_cap=schedule.catchup_cap,
        max_missed=max_missed,
        start_at=schedule.start_at,
        end_at=schedule.end_at,
    )


def _without(plan: PassPlan, taken: set[datetime]) -> PassPlan:
    return PassPlan(
        fire=[t for t in plan.fire if t not in taken],
        missed=[t for t in plan.missed if t not in taken],
        late=frozenset(plan.late - taken),
        next_cursor=plan.next_cursor,
        jumped=plan.jumped,
    )


def _write(schedule: Schedule, plan: PassPlan, *, now: datetime) -> None:
    """The rows a materializer pass would write for ``plan`` (same ids, same outbox rows).

    Late CATCH_UP times take slots of the tenant's shared catch-up budget, as in the
    materializer; the budget row is locked after the schedule row, the set-based
    materializer's order.
    """
    releases = single.reserve_catchup([(schedule, plan)], now=now)
    fire_rows = single.build_fire_rows(schedule, plan, now=now, releases=releases)
    created = single.insert_ignore(Occurrence, fire_rows)
    single.insert_ignore(Occurrence, single.build_missed_rows(schedule, plan, now=now))
    single.write_outbox(schedule, fire_rows, created)
