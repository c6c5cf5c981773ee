"""The worker's ORM store: claims, fencing, leases, overlap, concurrency slots, reap, replay.

Time is a FrozenClock; the races that need real concurrency are in test_worker_races.py.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from celery_scheduler import errors
from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.core.enums import AttemptOutcome, OverlapPolicy, ScheduleState
from celery_scheduler.core.enums import OccurrenceState as S
from django_app import observe, tasks
from django_app.models import Attempt, ConcurrencySlot, Occurrence, OutboxEntry
from django_app.worker import claim, finish
from django_app.worker.claim import ClaimOutcome
from tests.integration.worker_support import make_occurrence, make_schedule

LEASE = timedelta(seconds=30)
pytestmark = pytest.mark.django_db


@pytest.fixture
def clock(frozen_clock: FrozenClock) -> FrozenClock:
    return frozen_clock


def claim_as(occ: Any, clock: FrozenClock, who: str = "w1") -> claim.ClaimResult:
    return claim.claim(occ.id, worker=who, clock=clock, lease=LEASE)


def state_of(occ: Any) -> str:
    return Occurrence.objects.get(pk=occ.pk).state


def two_in_one_group(tenant: Any, clock: FrozenClock) -> tuple[Any, Any]:
    """Occurrences of two schedules sharing the group "invoices", capped at 1."""
    a = make_schedule(tenant, concurrency_limit=1, concurrency_group="invoices")
    b = make_schedule(tenant, concurrency_limit=1, concurrency_group="invoices")
    return make_occurrence(a, clock.now()), make_occurrence(b, clock.now())


def test_claim_starts_an_attempt_and_a_duplicate_delivery_does_not(
    tenant: Any, clock: FrozenClock
) -> None:
    occ = make_occurrence(make_schedule(tenant), clock.now())
    before = observe.worker_events["duplicate_claims"]
    first = claim_as(occ, clock)
    second = claim_as(occ, clock, "w2")
    assert first.outcome is ClaimOutcome.CLAIMED
    assert (first.fencing_token, first.attempt_number, first.attempts_in_run) == (1, 1, 1)
    assert second.outcome is ClaimOutcome.DUPLICATE
    assert observe.worker_events["duplicate_claims"] == before + 1
    row = Occurrence.objects.get(pk=occ.pk)
    assert (row.state, row.lease_owner, row.attempt_count) == (S.RUNNING, "w1", 1)
    assert row.lease_expires_at == clock.now() + LEASE
    attempt = Attempt.objects.get(occurrence=occ)
    assert (attempt.number, attempt.fencing_token, attempt.worker) == (1, 1, "w1")


def test_complete_is_fenced_and_a_succeeded_occurrence_is_not_run_again(
    tenant: Any, clock: FrozenClock
) -> None:
    occ = make_occurrence(make_schedule(tenant), clock.now())
    token = claim_as(occ, clock).fencing_token
    assert token is not None
    finish.complete(occ.id, token, {"ok": 1}, clock=clock)
    row = Occurrence.objects.get(pk=occ.pk)
    assert (row.state, row.result) == (S.SUCCEEDED, {"ok": 1})
    assert Attempt.objects.get(occurrence=occ).outcome == AttemptOutcome.SUCCEEDED
    with pytest.raises(errors.StaleWrite):
        finish.complete(occ.id, token, {"ok": 2}, clock=clock)
    assert claim_as(occ, clock).outcome is ClaimOutcome.DUPLICATE
    assert Occurrence.objects.get(pk=occ.pk).result == {"ok": 1}


def test_expired_lease_is_reclaimed_and_the_stale_worker_is_fenced_out(
    tenant: Any, clock: FrozenClock
) -> None:
    occ = make_occurrence(make_schedule(tenant), clock.now())
    old = claim_as(occ, clock, "slow")
    clock.advance(LEASE + timedelta(seconds=1))
    new = claim_as(occ, clock, "fast")
    assert new.outcome is ClaimOutcome.CLAIMED
    assert old.fencing_token is not None
    assert new.fencing_token == old.fencing_token + 1
    assert not finish.renew(occ.id, old.fencing_token, clock=clock, lease=LEASE, holds_slot=False)
    with pytest.raises(errors.StaleWrite, match="token 1 rejected"):
        finish.complete(occ.id, old.fencing_token, "late", clock=clock)
    with pytest.raises(errors.StaleWrite):
        finish.fail(occ.id, old.fencing_token, "late", clock=clock)
    finish.complete(occ.id, new.fencing_token, "winner", clock=clock)
    assert Occurrence.objects.get(pk=occ.pk).result == "winner"
    outcomes = list(Attempt.objects.filter(occurrence=occ).values_list("outcome", flat=True))
    assert outcomes == [AttemptOutcome.LOST, AttemptOutcome.SUCCEEDED]


def test_renew_extends_the_lease_only_for_the_current_token(
    tenant: Any, clock: FrozenClock
) -> None:
    occ = make_occurrence(make_schedule(tenant, concurrency_limit=1), clock.now())
    token = claim_as(occ, clock).fencing_token
    assert token is not None
    clock.advance(20)
    assert finish.renew(occ.id, token, clock=clock, lease=LEASE, holds_slot=True)
    expected = clock.now() + LEASE
    assert Occurrence.objects.get(pk=occ.pk).lease_expires_at == expected
    assert ConcurrencySlot.objects.get(occurrence_id=occ.id).expires_at == expected
    assert Attempt.objects.get(occurrence=occ).heartbeat_at == clock.now()
    assert not finish.renew(occ.id, token + 1, clock=clock, lease=LEASE, holds_slot=True)


@pytest.mark.parametrize("change", ["version", "cancel"])
def test_stale_or_canceled_occurrence_is_recorded_and_not_run(
    tenant: Any, clock: FrozenClock, change: str
) -> None:
    schedule = make_schedule(tenant)
    occ = make_occurrence(schedule, clock.now())
    if change == "version":
        schedule.version += 1
    else:
        schedule.state = ScheduleState.CANCELED.value
    schedule.save()
    result = claim_as(occ, clock)
    assert result.outcome is ClaimOutcome.STALE
    row = Occurrence.objects.get(pk=occ.pk)
    assert row.state == S.CANCELED
    attempt = Attempt.objects.get(occurrence=occ)
    assert attempt.outcome == AttemptOutcome.STALE
    assert attempt.error == result.reason


def test_manual_occurrence_survives_a_version_bump(tenant: Any, clock: FrozenClock) -> None:
    schedule = make_schedule(tenant)
    occ = make_occurrence(schedule, clock.now())
    Occurrence.objects.filter(pk=occ.pk).update(manual=True)
    schedule.version += 1
    schedule.save()
    assert claim_as(occ, clock).outcome is ClaimOutcome.CLAIMED


def test_retry_goes_back_through_the_outbox_with_the_same_id(
    tenant: Any, clock: FrozenClock
) -> None:
    occ = make_occurrence(make_schedule(tenant), clock.now())
    token = claim_as(occ, clock).fencing_token
    assert token is not None
    retry_at = clock.now() + timedelta(seconds=7)
    assert finish.fail(occ.id, token, "ConnectionError", retry_at=retry_at, clock=clock) == (
        S.RETRY_WAIT
    )
    outbox = OutboxEntry.objects.get(occurrence=occ)
    assert (outbox.sent_at, outbox.available_at) == (None, retry_at)
    row = Occurrence.objects.get(pk=occ.pk)
    assert (row.state, row.retry_at, row.last_error) == (S.RETRY_WAIT, retry_at, "ConnectionError")
    clock.advance(7)
    second = claim_as(occ, clock)
    assert (second.outcome, second.attempt_number, second.attempts_in_run) == (
        ClaimOutcome.CLAIMED,
        2,
        2,
    )
    outcomes = list(Attempt.objects.filter(occurrence=occ).values_list("outcome", flat=True))
    assert outcomes == [AttemptOutcome.RETRY, AttemptOutcome.RUNNING]


def test_a_message_before_the_retrys_backoff_ends_runs_nothing(
    tenant: Any, clock: FrozenClock
) -> None:
    """A copy of the message (the redelivery's, while the queue was slow) read a second
    after the run failed: the next attempt waits for retry_at, and the retry's message still
    goes out then, whether the failure's outbox row was still pending or already sent."""
    occ = make_occurrence(make_schedule(tenant), clock.now())
    token = claim_as(occ, clock).fencing_token
    assert token is not None
    retry_at = clock.now() + timedelta(seconds=60)
    finish.fail(occ.id, token, "ThrottledError", retry_at=retry_at, clock=clock)
    outbox = OutboxEntry.objects.filter(occurrence=occ)
    for sent in (None, clock.now()):
        outbox.update(sent_at=sent)
        clock.advance(1)
        early = claim_as(occ, clock, "w2")
        assert (early.outcome, early.retry_at) == (ClaimOutcome.DEFERRED, retry_at)
        row = Occurrence.objects.get(pk=occ.pk)
        assert (row.state, row.attempt_count, row.retry_at) == (S.RETRY_WAIT, 1, retry_at)
        assert list(outbox.values_list("sent_at", "available_at")) == [(None, retry_at)]
    assert Attempt.objects.filter(occurrence=occ).count() == 1
    clock.set(retry_at)
    on_time = claim_as(occ, clock, "w2")
    assert (on_time.outcome, on_time.attempt_number) == (ClaimOutcome.CLAIMED, 2)


def test_dead_then_replay_keeps_the_id_history_and_gives_a_fresh_budget(
    tenant: Any, clock: FrozenClock
) -> None:
    occ = make_occurrence(make_schedule(tenant), clock.now())
    token = claim_as(occ, clock).fencing_token
    assert token is not None
    assert finish.fail(occ.id, token, "TypeError: bad", clock=clock) == S.DEAD
    assert claim_as(occ, clock).outcome is ClaimOutcome.DUPLICATE  # DEAD is not re-run
    with pytest.raises(errors.InvalidStateTransition):
        finish.replay_occurrence(make_occurrence(make_schedule(tenant), clock.now()).id)
    clock.advance(60)
    replayed = finish.replay_occurrence(occ.id, clock=clock)
    assert (replayed.id, replayed.state, replayed.last_error) == (
        occ.id,
        S.ENQUEUED,
        "TypeError: bad",
    )
    outbox = OutboxEntry.objects.get(occurrence=occ)
    assert (outbox.sent_at, outbox.available_at) == (None, clock.now())
    again = claim_as(occ, clock)
    assert (again.attempt_number, again.attempts_in_run) == (2, 1)
    assert Attempt.objects.filter(occurrence=occ).count() == 2


def test_replay_of_unknown_occurrence() -> None:
    with pytest.raises(errors.OccurrenceNotFound):
        finish.replay_occurrence("00000000-0000-0000-0000-000000000000")
    with pytest.raises(errors.OccurrenceNotFound):
        finish.replay_occurrence("not-a-uuid")


def test_reap_expired_marks_lost_and_republishes(tenant: Any, clock: FrozenClock) -> None:
    occ = make_occurrence(make_schedule(tenant, concurrency_limit=1), clock.now())
    claim_as(occ, clock)
    assert finish.reap_expired(clock=clock) == 0  # live lease: untouched
    clock.advance(LEASE + timedelta(seconds=1))
    assert finish.reap_expired(clock=clock) == 1
    assert finish.reap_expired(clock=clock) == 0
    row = Occurrence.objects.get(pk=occ.pk)
    assert (row.state, row.retry_at) == (S.RETRY_WAIT, clock.now())
    assert Attempt.objects.get(occurrence=occ).outcome == AttemptOutcome.LOST
    assert OutboxEntry.objects.get(occurrence=occ).sent_at is None
    assert ConcurrencySlot.objects.get(occurrence_id=None).owner == ""
    assert claim_as(occ, clock).attempt_number == 2


def test_reap_goes_dead_when_lost_attempts_use_up_max_attempts(
    tenant: Any, clock: FrozenClock
) -> None:
    occ = make_occurrence(make_schedule(tenant, max_attempts=2), clock.now())
    for _ in range(2):
        claim_as(occ, clock)
        clock.advance(LEASE + timedelta(seconds=1))
        finish.reap_expired(clock=clock)
    row = Occurrence.objects.get(pk=occ.pk)
    assert row.state == S.DEAD
    assert "attempts exhausted" in row.last_error


def test_skip_if_running(tenant: Any, clock: FrozenClock) -> None:
    schedule = make_schedule(tenant, overlap_policy=OverlapPolicy.SKIP_IF_RUNNING.value)
    first = make_occurrence(schedule, clock.now())
    second = make_occurrence(schedule, clock.now() + timedelta(minutes=1))
    assert claim_as(first, clock).claimed
    assert claim_as(second, clock).outcome is ClaimOutcome.SKIPPED_OVERLAP
    assert state_of(second) == S.SKIPPED_OVERLAP
    # A crashed run (lease expired) no longer counts as running.
    clock.advance(LEASE + timedelta(seconds=1))
    third = make_occurrence(schedule, clock.now())
    assert claim_as(third, clock).claimed


@pytest.mark.parametrize("policy", [OverlapPolicy.SKIP_IF_RUNNING, OverlapPolicy.QUEUE_ONE])
@pytest.mark.parametrize("how", ["lease expired and reaped", "transient failure"])
def test_a_started_run_coming_back_waits_for_the_running_one_instead_of_being_skipped(
    tenant: Any, clock: FrozenClock, policy: OverlapPolicy, how: str
) -> None:
    """A run whose worker died (or that failed transiently) coming back while the next
    trigger runs: the claim tried RETRY_WAIT -> SKIPPED_OVERLAP, an illegal transition, and
    raised StaleWrite, leaving the run stranded (seen in the chaos soak as a stalled run's
    occurrence ending SKIPPED_OVERLAP). Overlap policies decide about *new* triggers; a run
    that already started waits for the running one."""
    schedule = make_schedule(tenant, overlap_policy=policy.value)
    first = make_occurrence(schedule, clock.now())
    token = claim_as(first, clock).fencing_token
    assert token is not None
    if how == "transient failure":
        finish.fail(first.id, token, "ConnectionError", retry_at=clock.now(), clock=clock)
    else:
        clock.advance(LEASE + timedelta(seconds=1))
        assert finish.reap_expired(clock=clock) == 1
    assert state_of(first) == S.RETRY_WAIT
    second = make_occurrence(schedule, first.scheduled_for + timedelta(minutes=1))
    second_token = claim_as(second, clock, "w2").fencing_token  # the next trigger runs
    assert second_token is not None
    if policy is OverlapPolicy.QUEUE_ONE:  # the one waiting place is taken
        third = make_occurrence(schedule, first.scheduled_for + timedelta(minutes=2))
        assert claim_as(third, clock, "w4").outcome is ClaimOutcome.DEFERRED
    back = claim_as(first, clock, "w3")
    assert back.outcome is ClaimOutcome.DEFERRED, back
    assert state_of(first) in (S.ENQUEUED, S.RETRY_WAIT)
    finish.complete(second.id, second_token, None, clock=clock)
    assert claim_as(first, clock, "w3").claimed


def test_queue_one_holds_one_and_skips_the_rest(tenant: Any, clock: FrozenClock) -> None:
    schedule = make_schedule(tenant, overlap_policy=OverlapPolicy.QUEUE_ONE.value)
    occs = [make_occurrence(schedule, clock.now() + timedelta(minutes=i)) for i in range(3)]
    token = claim_as(occs[0], clock).fencing_token
    held = claim_as(occs[1], clock)
    assert held.outcome is ClaimOutcome.DEFERRED
    assert held.retry_at == clock.now() + claim.DEFER
    assert claim_as(occs[2], clock).outcome is ClaimOutcome.SKIPPED_OVERLAP
    assert OutboxEntry.objects.get(occurrence=occs[1]).sent_at is None
    # The held one comes back while the first still runs: it keeps waiting.
    assert claim_as(occs[1], clock).outcome is ClaimOutcome.DEFERRED
    assert Attempt.objects.filter(occurrence=occs[1]).count() == 0  # waiting is not a try
    assert token is not None
    finish.complete(occs[0].id, token, None, clock=clock)
    assert claim_as(occs[1], clock).claimed
    assert [state_of(o) for o in occs] == [S.SUCCEEDED, S.RUNNING, S.SKIPPED_OVERLAP]


def test_allow_runs_overlapping_occurrences(tenant: Any, clock: FrozenClock) -> None:
    schedule = make_schedule(tenant)
    occs = [make_occurrence(schedule, clock.now() + timedelta(minutes=i)) for i in range(3)]
    assert all(claim_as(o, clock).claimed for o in occs)


def test_concurrency_cap_shared_by_a_group_and_released_only_by_the_holder(
    tenant: Any, clock: FrozenClock
) -> None:
    occ_a, occ_b = two_in_one_group(tenant, clock)
    held = claim_as(occ_a, clock)
    assert held.slot is not None
    assert held.slot.key == "invoices"
    waiting = claim_as(occ_b, clock)
    assert waiting.outcome is ClaimOutcome.DEFERRED
    assert "concurrency slot" in waiting.reason
    assert state_of(occ_b) == S.ENQUEUED
    assert Attempt.objects.filter(occurrence=occ_b).count() == 0
    # The holder's lease expires and b takes the slot; a's late completion must not free it.
    clock.advance(LEASE + timedelta(seconds=1))
    taken = claim_as(occ_b, clock)
    assert taken.claimed
    assert taken.slot is not None
    assert taken.slot.fencing_token == held.slot.fencing_token + 1
    assert held.fencing_token is not None
    finish.complete(occ_a.id, held.fencing_token, None, clock=clock)  # token still current
    slot = ConcurrencySlot.objects.get(key="invoices")
    assert slot.occurrence_id == occ_b.id
    assert taken.fencing_token is not None
    finish.complete(occ_b.id, taken.fencing_token, None, clock=clock)
    assert ConcurrencySlot.objects.get(key="invoices").owner == ""


def test_a_lapsed_lease_is_not_renewed_once_its_slot_was_taken(
    tenant: Any, clock: FrozenClock
) -> None:
    # A worker stalled between its claim and its body (or between two heartbeats) past its
    # lease: another run took the cap's only slot. Renewing the occurrence's lease then
    # would let the stalled body start, or its fenced commit land, beside the new holder.
    occ_a, occ_b = two_in_one_group(tenant, clock)
    stalled = claim_as(occ_a, clock)
    assert stalled.fencing_token is not None
    clock.advance(LEASE + timedelta(seconds=1))
    assert claim_as(occ_b, clock).claimed
    assert not finish.renew(
        occ_a.id, stalled.fencing_token, clock=clock, lease=LEASE, holds_slot=True
    )
    assert not tasks.lease_still_held(stalled, LEASE, clock)
    assert ConcurrencySlot.objects.get(key="invoices").occurrence_id == occ_b.id


def test_a_renewal_that_finds_its_slot_taken_renews_nothing(
    tenant: Any, clock: FrozenClock
) -> None:
    # Two hosts' clocks a little apart, or a heartbeat at its lease's last moment: the
    # claimer's clock says the slot lapsed and takes it, the holder's still says its lease
    # is live. The holder must not keep its occurrence alive without its slot.
    occ_a, occ_b = two_in_one_group(tenant, clock)
    holder = claim_as(occ_a, clock)
    assert holder.fencing_token is not None
    assert holder.slot is not None
    holders_clock = FrozenClock(clock.now() + LEASE - timedelta(seconds=1))
    clock.advance(LEASE + timedelta(seconds=1))
    assert claim_as(occ_b, clock).claimed
    lease_before = Occurrence.objects.get(pk=occ_a.pk).lease_expires_at
    assert not finish.renew(
        occ_a.id, holder.fencing_token, clock=holders_clock, lease=LEASE, holds_slot=True
    )
    assert not tasks.lease_still_held(holder, LEASE, holders_clock)
    assert Occurrence.objects.get(pk=occ_a.pk).lease_expires_at == lease_before
    assert ConcurrencySlot.objects.get(key="invoices").occurrence_id == occ_b.id


def test_a_lapsed_lease_is_not_renewed_once_the_next_run_started(
    tenant: Any, clock: FrozenClock
) -> None:
    schedule = make_schedule(tenant, overlap_policy=OverlapPolicy.SKIP_IF_RUNNING)
    first = make_occurrence(schedule, clock.now())
    stalled = claim_as(first, clock)
    assert stalled.fencing_token is not None
    clock.advance(LEASE + timedelta(seconds=1))
    # The lapsed run no longer counts as running: the next one starts...
    assert claim_as(make_occurrence(schedule, clock.now()), clock).claimed
    # ...so the lapsed one must not come back to life beside it.
    assert not finish.renew(
        first.id, stalled.fencing_token, clock=clock, lease=LEASE, holds_slot=False
    )


def test_cap_of_two_per_schedule(tenant: Any, clock: FrozenClock) -> None:
    schedule = make_schedule(tenant, concurrency_limit=2)
    occs = [make_occurrence(schedule, clock.now() + timedelta(minutes=i)) for i in range(3)]
    outcomes = [claim_as(o, clock).outcome for o in occs]
    assert outcomes == [ClaimOutcome.CLAIMED, ClaimOutcome.CLAIMED, ClaimOutcome.DEFERRED]
    assert ConcurrencySlot.objects.filter(key=f"schedule:{schedule.pk}").count() == 2


def test_claim_of_unknown_occurrence(clock: FrozenClock) -> None:
    result = claim.claim("00000000-0000-0000-0000-000000000001", worker="w", clock=clock)
    assert result.outcome is ClaimOutcome.NOT_FOUND
