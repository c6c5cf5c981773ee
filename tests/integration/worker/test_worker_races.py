"""Claims racing on PostgreSQL: threads with their own connections, released together."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction

from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.core.enums import OverlapPolicy
from django_app.models import ConcurrencySlot, Occurrence
from django_app.worker import claim, finish
from django_app.worker.claim import ClaimOutcome
from tests.integration.threads import holding, run_threads, wait_for_a_lock_waiter
from tests.integration.worker_support import make_occurrence, make_schedule

pytestmark = [pytest.mark.concurrent_db, pytest.mark.django_db(transaction=True)]


def race(calls: list[Callable[[], Any]]) -> list[Any]:
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[i] = calls[i]()
        except BaseException as exc:
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results


def outcomes(results: list[Any]) -> Counter[str]:
    return Counter(r.outcome.value if hasattr(r, "outcome") else repr(r) for r in results)


def claimer(occ: Any, clock: FrozenClock, who: str) -> Callable[[], Any]:
    return lambda: claim.claim(occ.id, worker=who, clock=clock, lease=timedelta(seconds=30))


def test_twenty_workers_claim_one_occurrence_exactly_one_wins(
    tenant: Any, frozen_clock: FrozenClock
) -> None:
    occ = make_occurrence(make_schedule(tenant), frozen_clock.now())
    results = race([claimer(occ, frozen_clock, f"w{i}") for i in range(20)])
    assert outcomes(results) == {"CLAIMED": 1, "DUPLICATE": 19}


def test_skip_if_running_two_racers_cannot_both_see_none_running(
    tenant: Any, frozen_clock: FrozenClock
) -> None:
    schedule = make_schedule(tenant, overlap_policy=OverlapPolicy.SKIP_IF_RUNNING.value)
    occs = [make_occurrence(schedule, frozen_clock.now() + timedelta(minutes=i)) for i in range(10)]
    results = race([claimer(o, frozen_clock, f"w{i}") for i, o in enumerate(occs)])
    assert outcomes(results) == {"CLAIMED": 1, "SKIPPED_OVERLAP": 9}


def test_queue_one_racers_hold_exactly_one(tenant: Any, frozen_clock: FrozenClock) -> None:
    schedule = make_schedule(tenant, overlap_policy=OverlapPolicy.QUEUE_ONE.value)
    occs = [make_occurrence(schedule, frozen_clock.now() + timedelta(minutes=i)) for i in range(10)]
    results = race([claimer(o, frozen_clock, f"w{i}") for i, o in enumerate(occs)])
    assert outcomes(results) == {"CLAIMED": 1, "DEFERRED": 1, "SKIPPED_OVERLAP": 8}


def test_group_cap_of_two_holds_under_a_race(tenant: Any, frozen_clock: FrozenClock) -> None:
    schedules = [
        make_schedule(tenant, concurrency_limit=2, concurrency_group="reports") for _ in range(3)
    ]
    occs = [
        make_occurrence(s, frozen_clock.now() + timedelta(minutes=i))
        for s in schedules
        for i in range(4)
    ]
    results = race([claimer(o, frozen_clock, f"w{i}") for i, o in enumerate(occs)])
    assert outcomes(results) == {"CLAIMED": 2, "DEFERRED": 10}
    slots = {r.slot.slot for r in results if r.outcome is ClaimOutcome.CLAIMED}
    assert slots == {0, 1}


def test_the_reaper_frees_an_expired_slot_only_while_the_lost_run_still_holds_it(
    tenant: Any, frozen_clock: FrozenClock
) -> None:
    """A slot whose run lost its lease is free to take; the reaper, recovering that run,
    must not free it again once a claim took it (its read of the slot came before).

    The claim takes the expired slot and holds its transaction open; the reaper reads the
    slot (the lost run's, as committed), and its release waits for the claim's row lock;
    the claim commits. Seen in CI as two bodies of a cap-1 group running at once."""
    group = [make_schedule(tenant, concurrency_limit=1, concurrency_group="g") for _ in range(3)]
    lost, taker, third = (make_occurrence(s, frozen_clock.now()) for s in group)
    lease = timedelta(seconds=30)
    first = claim.claim(lost.id, worker="lost", clock=frozen_clock, lease=lease)
    assert first.outcome is ClaimOutcome.CLAIMED
    frozen_clock.advance(lease + timedelta(seconds=1))  # the lost run's lease and slot expire
    taken, reaper_waits = threading.Event(), threading.Event()
    won: list[Any] = []

    def take() -> None:
        with transaction.atomic():
            won.append(claim.claim(taker.id, worker="taker", clock=frozen_clock, lease=lease))
            taken.set()
            assert reaper_waits.wait(timeout=20), "the reaper never waited for the slot"

    def reap() -> None:
        assert taken.wait(timeout=20)
        assert finish.reap_expired(clock=frozen_clock) == 1

    assert run_threads(take, reap, lambda: wait_for_a_lock_waiter(taken, reaper_waits)) == []
    assert won[0].outcome is ClaimOutcome.CLAIMED
    slot = ConcurrencySlot.objects.get(tenant=tenant, key="g")
    assert slot.owner == finish.slot_owner(taker.id, won[0].fencing_token)
    # Still the taker's: the group's cap of one turns the next claimer away.
    later = claim.claim(third.id, worker="third", clock=frozen_clock, lease=lease)
    assert later.outcome is ClaimOutcome.DEFERRED


def test_a_renewal_that_waited_for_its_row_past_the_lease_renews_nothing(
    tenant: Any, frozen_clock: FrozenClock
) -> None:
    """The renewal asks for its row at T - 1 s and gets it after T, when the next run of
    its SKIP_IF_RUNNING schedule has started: the lapsed run must not come back to life.

    One thread holds the row (as a fence's lock or a duplicate delivery's claim would), the
    renewal waits for it; meanwhile the clock passes the lease and the next run is claimed."""
    schedule = make_schedule(tenant, overlap_policy=OverlapPolicy.SKIP_IF_RUNNING.value)
    first, second = (
        make_occurrence(schedule, frozen_clock.now() + timedelta(minutes=i)) for i in range(2)
    )
    lease = timedelta(seconds=30)
    token = claim.claim(first.id, worker="stalled", clock=frozen_clock, lease=lease).fencing_token
    lease_before = Occurrence.objects.get(pk=first.pk).lease_expires_at
    frozen_clock.advance(lease - timedelta(seconds=1))
    locked, renewal_waits, released = threading.Event(), threading.Event(), threading.Event()
    renewed: list[bool] = []
    nxt: list[Any] = []

    hold_the_row = holding(
        Occurrence.objects.filter(pk=first.pk), locked, released, "the next run was never claimed"
    )

    def renew() -> None:
        assert locked.wait(timeout=20)
        assert token is not None
        renewed.append(
            finish.renew(first.id, token, clock=frozen_clock, lease=lease, holds_slot=False)
        )

    def lapse_and_start_the_next_run() -> None:
        wait_for_a_lock_waiter(locked, renewal_waits)
        assert renewal_waits.is_set(), "the renewal never waited for the row"
        frozen_clock.advance(timedelta(seconds=2))  # the stalled run's lease has lapsed
        nxt.append(claim.claim(second.id, worker="next", clock=frozen_clock, lease=lease))
        released.set()

    assert run_threads(hold_the_row, renew, lapse_and_start_the_next_run) == []
    assert nxt[0].outcome is ClaimOutcome.CLAIMED
    assert renewed == [False]
    assert Occurrence.objects.get(pk=first.pk).lease_expires_at == lease_before
