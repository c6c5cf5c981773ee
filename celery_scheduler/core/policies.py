"""Misfire decisions: which past fire times still fire after downtime, and which are MISSED.

Pure: the materializer hands in the fire times it enumerated from the durable cursor and the
current time; the plan says what to insert. No Django, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

from celery_scheduler.core.enums import MisfirePolicy
from celery_scheduler.errors import InvalidPolicy


@dataclass(frozen=True, kw_only=True)
class MisfirePlan:
    """``fire``: times to materialize as firing occurrences; ``missed``: times recorded MISSED.

    Both keep the input order; together they are exactly the input.
    """

    fire: list[datetime] = field(default_factory=list)
    missed: list[datetime] = field(default_factory=list)


def is_late(scheduled_for: datetime, *, now: datetime, max_lateness: timedelta) -> bool:
    """A fire time is LATE when ``now - scheduled_for > max_lateness`` (strictly)."""
    return now - scheduled_for > max_lateness


def plan_misfire(
    fire_times_due: Sequence[datetime],
    *,
    now: datetime,
    policy: MisfirePolicy | str,
    max_lateness: timedelta,
    catchup_cap: int,
) -> MisfirePlan:
    """Split the due fire times of one schedule into those that fire and those MISSED.

    Contract:

    - A fire time ``t`` is LATE when ``now - t > max_lateness``. Exactly ``max_lateness``
      late is not late. Times in the future are never late.
    - Non-late times always fire, under every policy.
    - Late times, by policy:

      * ``SKIP``: every late time is MISSED.
      * ``FIRE_ONCE``: only the latest late time fires; the other late times are MISSED.
      * ``CATCH_UP``: the latest ``catchup_cap`` late times fire (0 fires none); the other
        late times are MISSED.

    - ``fire`` and ``missed`` are disjoint, keep the input order and together equal the
      input. The input is expected in ascending order (as enumerated from the cursor).

    Recovery always starts from the schedule's durable cursor (``next_run_at``), never from
    "now": the caller enumerates ``fire_times_due`` from the cursor, so a restart sees the
    same late times a crash-free run would have, and this function decides their fate.
    """
    if catchup_cap < 0:
        raise InvalidPolicy(f"catchup_cap must be >= 0, got {catchup_cap}")
    if max_lateness < timedelta(0):
        raise InvalidPolicy(f"max_lateness must be >= 0, got {max_lateness}")
    policy = MisfirePolicy(policy)
    # Sorted by time so "the latest" holds even if a caller passes unsorted input.
    late_idx = sorted(
        (i for i, t in enumerate(fire_times_due) if is_late(t, now=now, max_lateness=max_lateness)),
        key=lambda i: fire_times_due[i],
    )
    if policy is MisfirePolicy.SKIP:
        keep = 0
    elif policy is MisfirePolicy.FIRE_ONCE:
        keep = 1
    elif policy is MisfirePolicy.CATCH_UP:
        keep = catchup_cap
    else:  # pragma: no cover - exhaustive over the enum
        raise InvalidPolicy(f"unknown misfire policy {policy!r}")
    missed_idx = set(late_idx[: max(len(late_idx) - keep, 0)])
    plan = MisfirePlan()
    for i, t in enumerate(fire_times_due):
        (plan.missed if i in missed_idx else plan.fire).append(t)
    return plan


class _Triggerish(Protocol):
    def next_after(self, after: datetime) -> datetime | None: ...
    def first_at_or_after(self, at: datetime) -> datetime | None: ...


@dataclass(frozen=True, kw_only=True)
class PassPlan:
    """What one materializer pass does for one schedule.

    ``fire`` / ``missed``: fire times to insert as firing / MISSED occurrences (ascending).
    ``late``: the subset of ``fire`` that is LATE (for catch-up rate limiting).
    ``next_cursor``: the new ``next_run_at``; ``None`` means the schedule has no further
    fire time (one-off done, past ``end_at``) and becomes COMPLETED.
    ``jumped``: ``(first, resume)`` when late fire times in ``[first, resume)`` were passed
    over without a row each, because there were more than the per-pass bound.
    """

    fire: list[datetime]
    missed: list[datetime]
    late: frozenset[datetime]
    next_cursor: datetime | None
    jumped: tuple[datetime, datetime] | None = None


def _kept_late(policy: MisfirePolicy, catchup_cap: int) -> int:
    return {MisfirePolicy.SKIP: 0, MisfirePolicy.FIRE_ONCE: 1}.get(policy, catchup_cap)


def plan_pass(
    trigger: _Triggerish,
    cursor: datetime,
    *,
    now: datetime,
    until: datetime,
    policy: MisfirePolicy | str,
    max_lateness: timedelta,
    catchup_cap: int,
    max_missed: int,
    start_at: datetime | None = None,
    end_at: datetime | None = None,
) -> PassPlan:
    """Enumerate a schedule's fire times from its durable cursor and apply the misfire policy.

    Fire times considered are ``t >= max(cursor, start_at)``, ``t <= until`` and
    ``t <= end_at`` (``end_at`` is inclusive). Bounds, so one pass is always small:

    - at most ``max_missed + kept`` LATE times are enumerated (``kept`` = 0 for SKIP, 1 for
      FIRE_ONCE, ``catchup_cap`` for CATCH_UP). When there are more, the older ones are
      jumped over: the cursor resumes at the earliest instant from which no more than that
      many late times remain (found by bisection, each probe bounded too), and ``jumped``
      says which span got no rows. Those times are never fired, exactly as if recorded
      MISSED; they just have no row each.
    - at most ``max_missed + kept + 1`` non-late times are enumerated; if more are due, the
      cursor stops after them and the schedule stays due for the next pass.
    """
    policy = MisfirePolicy(policy)
    bound = max_missed + _kept_late(policy, catchup_cap)
    late_before = now - max_lateness  # t is LATE iff t < late_before
    last_ok = until if end_at is None else min(until, end_at)
    first = trigger.first_at_or_after(cursor if start_at is None else max(cursor, start_at))
    if first is None or (end_at is not None and first > end_at):
        return PassPlan(fire=[], missed=[], late=frozenset(), next_cursor=None)

    def take(t: datetime | None, *, below: datetime | None, limit: int) -> list[datetime]:
        out: list[datetime] = []
        while t is not None and len(out) < limit and t <= last_ok:
            if below is not None and t >= below:
                break
            out.append(t)
            t = trigger.next_after(t)
        return out

    late = take(first, below=late_before, limit=bound + 1)
    jumped = None
    if len(late) > bound:
        lo, hi = first, late_before  # invariant: from lo too many late times, from hi few enough
        while hi - lo > timedelta(seconds=1):
            mid = lo + (hi - lo) / 2
            probe = take(trigger.first_at_or_after(mid), below=late_before, limit=bound + 1)
            lo, hi = (lo, mid) if len(probe) <= bound else (mid, hi)
        late = take(trigger.first_at_or_after(hi), below=late_before, limit=bound)
        jumped = (first, hi)
    if late:
        resume = trigger.next_after(late[-1])
    else:
        resume = trigger.first_at_or_after(jumped[1]) if jumped else first
    due = late + take(resume, below=None, limit=bound + 1)
    plan = plan_misfire(
        due, now=now, policy=policy, max_lateness=max_lateness, catchup_cap=catchup_cap
    )
    nxt = trigger.next_after(due[-1]) if due else resume
    if nxt is not None and end_at is not None and nxt > end_at:
        nxt = None
    return PassPlan(
        fire=plan.fire,
        missed=plan.missed,
        late=frozenset(t for t in plan.fire if t < late_before),
        next_cursor=nxt,
        jumped=jumped,
    )
