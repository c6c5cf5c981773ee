"""Waiters for a slot are served oldest ``scheduled_for`` first, and only the head polls.

Each line: a group's slots, a schedule's own cap, a tenant's ``max_running``. Time is a
FrozenClock; the same promise with real worker processes is in
tests/acceptance/test_waiting_workers.py.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.core.enums import OccurrenceState as S
from django_app.models import Occurrence, OutboxEntry, Schedule
from django_app.tenancy import waiting
from django_app.worker import claim, finish
from django_app.worker.claim import ClaimOutcome
from tests.integration.worker_support import make_occurrence, make_schedule

LEASE = timedelta(seconds=30)
pytestmark = pytest.mark.django_db


def claim_as(occ: Any, clock: FrozenClock, who: str = "w") -> claim.ClaimResult:
    return claim.claim(occ.id, worker=who, clock=clock, lease=LEASE)


def line_up(clock: FrozenClock, holder: Any, head: Any, *parked: Any) -> int:
    """The holder takes the resource; the head waits and polls, the rest are parked.
    Returns the holder's fencing token."""
    t0 = clock.now()
    token = claim_as(holder, clock).fencing_token
    assert token is not None
    assert claim_as(head, clock).retry_at == t0 + claim.DEFER
    for occ in parked:
        assert claim_as(occ, clock).retry_at == t0 + waiting.PARK
    return token


def group_pair(tenant: Any) -> tuple[Schedule, Schedule]:
    kw = {"concurrency_limit": 1, "concurrency_group": "reports"}
    return make_schedule(tenant, **kw), make_schedule(tenant, **kw)


def own_cap_pair(tenant: Any) -> tuple[Schedule, Schedule]:
    one = make_schedule(tenant, concurrency_limit=1)
    return one, one


def tenant_pair(tenant_factory: Callable[..., Any]) -> tuple[Schedule, Schedule]:
    capped = tenant_factory("capped", max_running=1)
    return make_schedule(capped), make_schedule(capped)


LINES = {
    "group": lambda tenant, factory: group_pair(tenant),
    "own cap": lambda tenant, factory: own_cap_pair(tenant),
    "tenant max_running": lambda tenant, factory: tenant_pair(factory),
}


@pytest.mark.parametrize("line", list(LINES))
def test_a_freed_slot_goes_to_the_oldest_waiter_not_to_a_later_arrival(
    line: str, tenant: Any, tenant_factory: Callable[..., Any], frozen_clock: FrozenClock
) -> None:
    a, b = LINES[line](tenant, tenant_factory)
    t0 = frozen_clock.now()
    holder = make_occurrence(a, t0 - timedelta(seconds=10))
    older = make_occurrence(a, t0)
    later = make_occurrence(b, t0 + timedelta(seconds=1))
    token = claim_as(holder, frozen_clock).fencing_token
    assert token is not None
    assert claim_as(older, frozen_clock).outcome is ClaimOutcome.DEFERRED  # it waits
    finish.complete(holder.id, token, clock=frozen_clock)

    # The slot is free, but an older occurrence waits for it: the later one must not pass.
    passed = claim_as(later, frozen_clock)
    assert passed.outcome is ClaimOutcome.DEFERRED, passed
    assert claim_as(older, frozen_clock).claimed
    states = dict(Occurrence.objects.values_list("pk", "state"))
    assert (states[older.pk], states[later.pk]) == (S.RUNNING, S.ENQUEUED)


def test_waiters_start_in_scheduled_order_whatever_order_they_are_delivered_in(
    tenant: Any, frozen_clock: FrozenClock
) -> None:
    a, b = group_pair(tenant)
    t0 = frozen_clock.now()
    holder = make_occurrence(a, t0 - timedelta(seconds=10))
    waiters = [make_occurrence((a, b)[i % 2], t0 + timedelta(seconds=i)) for i in range(6)]
    token = claim_as(holder, frozen_clock).fencing_token
    for occ in waiters:
        assert claim_as(occ, frozen_clock).outcome is ClaimOutcome.DEFERRED
    started = []
    running = (holder, token)
    for _ in waiters:
        frozen_clock.advance(2)
        assert running[1] is not None
        finish.complete(running[0].id, running[1], clock=frozen_clock)
        # Every waiter is delivered again, newest first: only the oldest may start.
        results = {occ.pk: claim_as(occ, frozen_clock) for occ in reversed(waiters)}
        claimed = [occ for occ in waiters if results[occ.pk].claimed]
        assert len(claimed) == 1, results
        started.append(claimed[0])
        running = (claimed[0], results[claimed[0].pk].fencing_token)
        waiters = [occ for occ in waiters if occ is not claimed[0]]
    assert [o.scheduled_for for o in started] == sorted(o.scheduled_for for o in started)


@pytest.mark.parametrize("line", list(LINES))
def test_only_the_head_polls_and_a_taken_slot_wakes_the_next_waiter(
    line: str, tenant: Any, tenant_factory: Callable[..., Any], frozen_clock: FrozenClock
) -> None:
    a, b = LINES[line](tenant, tenant_factory)
    t0 = frozen_clock.now()
    holder, head, second, third = (
        make_occurrence((a, b)[i % 2], t0 + timedelta(seconds=i)) for i in range(4)
    )
    token = line_up(frozen_clock, holder, head, second, third)

    finish.complete(holder.id, token, clock=frozen_clock)
    assert claim_as(head, frozen_clock).claimed
    # The next waiter is due now (it polls while the head runs); the third stays parked.
    due = dict(OutboxEntry.objects.values_list("occurrence_id", "available_at"))
    assert (due[second.pk], due[third.pk]) == (t0, t0 + waiting.PARK)


def test_a_head_invalidated_while_waiting_does_not_leave_the_line_parked(
    tenant: Any, frozen_clock: FrozenClock
) -> None:
    a, b = group_pair(tenant)
    t0 = frozen_clock.now()
    holder, head, second = (make_occurrence(a, t0 + timedelta(seconds=i)) for i in range(3))
    newcomer = make_occurrence(b, t0 + timedelta(seconds=5))
    token = claim_as(holder, frozen_clock).fencing_token
    assert token is not None
    claim_as(head, frozen_clock)
    claim_as(second, frozen_clock)
    Occurrence.objects.filter(pk=head.pk).update(state=S.CANCELED)  # as a pause does
    finish.complete(holder.id, token, clock=frozen_clock)

    # The next claim of the line finds the parked waiter ahead and makes it due now.
    assert claim_as(newcomer, frozen_clock).outcome is ClaimOutcome.DEFERRED
    row = OutboxEntry.objects.get(occurrence=second)
    assert (row.sent_at, row.available_at) == (None, t0)
    assert claim_as(second, frozen_clock).claimed


# (An own cap's line is one schedule's: pausing its head pauses every waiter of it.)
@pytest.mark.parametrize("line", ["group", "tenant max_running"])
@pytest.mark.parametrize("leaves_by", ["pause", "cancel", "skip"])
def test_a_head_that_leaves_by_a_pause_or_cancel_wakes_the_next_waiter(
    line: str,
    leaves_by: str,
    tenant: Any,
    tenant_factory: Callable[..., Any],
    frozen_clock: FrozenClock,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """With no other claim of the line to come, the next waiter must not sit out its park
    (5 minutes) behind a head that will never poll again: the pause, cancel or skip that
    takes the head out of the line makes the next one due. Seen failing on the tenant's
    max_running line, where no completion wakes anyone (and on a slot line whose holder's
    completion had already woken the head)."""
    from django_app.schedules import lifecycle, skips

    a, b = LINES[line](tenant, tenant_factory)
    t0 = frozen_clock.now()
    holder = make_occurrence(b, t0)
    head = make_occurrence(a, t0 + timedelta(minutes=1))  # fire times: a skip names one
    second = make_occurrence(b, t0 + timedelta(minutes=2))
    token = line_up(frozen_clock, holder, head, second)
    if line == "group":  # the holder's completion wakes the head, which is then taken out
        finish.complete(holder.id, token, clock=frozen_clock)
    frozen_clock.advance(0.5)

    with django_capture_on_commit_callbacks(execute=True):  # after the call's commit
        if leaves_by == "skip":
            skips.skip_occurrence(a.pk, head.scheduled_for, now=frozen_clock.now())
        else:
            leave = lifecycle.pause_schedule if leaves_by == "pause" else lifecycle.cancel_schedule
            leave(a.pk, clock=frozen_clock)

    assert Occurrence.objects.get(pk=head.pk).state == S.CANCELED
    row = OutboxEntry.objects.get(occurrence=second)
    assert (row.sent_at, row.available_at) == (None, frozen_clock.now())


@pytest.mark.parametrize("line", ["group", "tenant max_running"])
def test_a_head_that_goes_stale_at_its_claim_wakes_the_next_waiter(
    line: str,
    tenant: Any,
    tenant_factory: Callable[..., Any],
    frozen_clock: FrozenClock,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """A head whose schedule used up its max_runs meanwhile is canceled by its next ask,
    not run: the next waiter, parked, is woken then (seen failing: left parked)."""
    a, b = LINES[line](tenant, tenant_factory)
    t0 = frozen_clock.now()
    holder = make_occurrence(b, t0)
    head = make_occurrence(a, t0 + timedelta(seconds=1))
    second = make_occurrence(b, t0 + timedelta(seconds=2))
    line_up(frozen_clock, holder, head, second)
    Schedule.objects.filter(pk=a.pk).update(max_runs=3, runs_count=3)
    frozen_clock.advance(claim.DEFER.total_seconds())

    with django_capture_on_commit_callbacks(execute=True):
        assert claim_as(head, frozen_clock).outcome is ClaimOutcome.STALE

    row = OutboxEntry.objects.get(occurrence=second)
    assert (row.sent_at, row.available_at) == (None, frozen_clock.now())


def test_a_wake_that_fails_after_the_commit_is_not_the_callers_failure(
    tenant_factory: Callable[..., Any],
    frozen_clock: FrozenClock,
    django_capture_on_commit_callbacks: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The pause committed: a database error in the wake after it is logged, not raised
    (a 500 for a pause that was made). Seen failing: the pause raised."""
    from django.db import OperationalError

    from django_app.schedules import lifecycle

    a, b = tenant_pair(tenant_factory)
    t0 = frozen_clock.now()
    holder, head = make_occurrence(b, t0), make_occurrence(a, t0 + timedelta(minutes=1))
    assert claim_as(holder, frozen_clock).claimed
    assert claim_as(head, frozen_clock).retry_at == t0 + claim.DEFER

    def broken(*_: Any, **__: Any) -> int:
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(waiting.Line, "wake_oldest", broken)
    with django_capture_on_commit_callbacks(execute=True):
        lifecycle.pause_schedule(a.pk, clock=frozen_clock)
    assert Schedule.objects.get(pk=a.pk).state == "PAUSED"
    assert "not woken" in caplog.text


def _three_in_line(capped: Any, a: Schedule, b: Schedule, clock: FrozenClock) -> tuple[Any, ...]:
    """A holder of the tenant's one run, then A1 (the head), A2 and B1 parked behind it."""
    t0 = clock.now()
    holder = make_occurrence(make_schedule(capped), t0)
    a1, a2 = (make_occurrence(a, t0 + timedelta(minutes=m)) for m in (1, 2))
    b1 = make_occurrence(b, t0 + timedelta(minutes=3))
    token = line_up(clock, holder, a1, a2, b1)
    finish.complete(holder.id, token, clock=clock)
    clock.advance(claim.DEFER.total_seconds())
    return a1, a2, b1


@pytest.mark.parametrize("leaves_by", ["max_runs", "overlap"])
def test_a_waiter_canceled_or_skipped_by_a_claim_wakes_the_next_waiter(
    leaves_by: str,
    tenant_factory: Callable[..., Any],
    frozen_clock: FrozenClock,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """The head's claim wakes the next waiter (A2); if that claim then takes A2 out of the
    line (its schedule's last run: A2 canceled; or A2's next ask finds A1 running and its
    schedule skips overlaps), B1 must be woken, not left parked 5 minutes (nothing else
    wakes a tenant's max_running line). Seen failing: B1 parked, both ways."""
    capped = tenant_factory("capped", max_running=1)
    fields = {"overlap_policy": "SKIP_IF_RUNNING"} if leaves_by == "overlap" else {}
    a, b = make_schedule(capped, **fields), make_schedule(capped)
    a1, a2, b1 = _three_in_line(capped, a, b, frozen_clock)
    if leaves_by == "max_runs":
        Schedule.objects.filter(pk=a.pk).update(max_runs=1, runs_count=0)
    with django_capture_on_commit_callbacks(execute=True):
        run = claim_as(a1, frozen_clock)
    assert run.claimed
    if leaves_by == "overlap":
        with django_capture_on_commit_callbacks(execute=True):
            assert claim_as(a2, frozen_clock).outcome is ClaimOutcome.SKIPPED_OVERLAP
    assert Occurrence.objects.get(pk=a2.pk).state in (S.CANCELED, S.SKIPPED_OVERLAP)
    assert run.fencing_token is not None
    finish.complete(a1.id, run.fencing_token, clock=frozen_clock)

    row = OutboxEntry.objects.get(occurrence=b1)
    assert (row.sent_at, row.available_at) == (None, frozen_clock.now())


def test_a_head_whose_message_was_lost_is_published_again(
    tenant: Any, frozen_clock: FrozenClock
) -> None:
    a, b = group_pair(tenant)
    t0 = frozen_clock.now()
    holder, head = make_occurrence(a, t0), make_occurrence(a, t0 + timedelta(seconds=1))
    newcomer = make_occurrence(b, t0 + timedelta(seconds=2))
    token = claim_as(holder, frozen_clock).fencing_token
    assert token is not None
    claim_as(head, frozen_clock)
    # The relay published the head's next ask, and the broker lost it.
    OutboxEntry.objects.filter(occurrence=head).update(sent_at=t0 + claim.DEFER)
    frozen_clock.advance(claim.DEFER.total_seconds() + waiting.LOST_AFTER.total_seconds() + 1)
    finish.complete(holder.id, token, clock=frozen_clock)

    assert claim_as(newcomer, frozen_clock).outcome is ClaimOutcome.DEFERRED
    row = OutboxEntry.objects.get(occurrence=head)
    assert (row.sent_at, row.available_at) == (None, frozen_clock.now())


@pytest.mark.parametrize("line", ["group", "own cap"])
def test_a_released_slot_wakes_the_head_to_take_it_now(
    line: str, tenant: Any, tenant_factory: Callable[..., Any], frozen_clock: FrozenClock
) -> None:
    """The completion that frees a slot makes the head due at once, on every database's
    completion path (PostgreSQL's one statement too), not at its next poll."""
    a, b = LINES[line](tenant, tenant_factory)
    t0 = frozen_clock.now()
    holder, head = make_occurrence(a, t0), make_occurrence(b, t0 + timedelta(seconds=1))
    token = claim_as(holder, frozen_clock).fencing_token
    assert token is not None
    assert claim_as(head, frozen_clock).retry_at == t0 + claim.DEFER

    finish.complete(holder.id, token, clock=frozen_clock)
    assert OutboxEntry.objects.get(occurrence_id=head.pk).available_at == t0
