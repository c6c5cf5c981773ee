"""A claim that committed but whose reply the worker never read (the connection dropped
after the commit) is taken back by the copy of the message the wrapper re-sends: the body
runs once, on the same token and attempt, and no attempt of the run's budget is spent.

The lost reply is made by letting the real claim commit and then raising the driver's
error in its place, as a connection lost before the reply would.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from celery import Celery
from django.db import OperationalError

from celery_scheduler import api, errors
from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.core.enums import AttemptOutcome
from celery_scheduler.core.enums import OccurrenceState as S
from django_app.models import Attempt, ConcurrencySlot, Occurrence
from django_app.tasks import HEADER_CLAIMED_AS, execute, names_to_resend
from django_app.worker import claim
from tests.integration.worker_support import make_occurrence, make_schedule

pytestmark = pytest.mark.django_db
app = Celery("reply-lost-tests", set_as_current=False)
runs: list[str] = []
LEASE = timedelta(seconds=30)


@app.task(name="t.counted")
def counted(label: str) -> str:
    runs.append(label)
    return label


@pytest.fixture(autouse=True)
def _no_runs() -> None:
    runs.clear()


def lose_the_next_reply(monkeypatch: pytest.MonkeyPatch) -> None:
    real = claim._claim
    lost: list[object] = []

    def committed_then_lost(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        if not lost:
            lost.append(result)
            raise OperationalError("server closed the connection unexpectedly")
        return result

    monkeypatch.setattr(claim, "_claim", committed_then_lost)


def deliver(
    occ: Occurrence, clock: FrozenClock, worker: str, claimed_as: str | None = None
) -> dict[str, Any]:
    message = {HEADER_CLAIMED_AS: [[claimed_as, 0.0]]} if claimed_as else None
    return execute(
        app, str(occ.id), "t.counted", ["x"], {}, worker_name=worker, clock=clock,
        lease=LEASE, message=message,
    )  # fmt: skip


def lost_claim(
    tenant: Any, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch, **fields: Any
) -> Occurrence:
    schedule = make_schedule(tenant, task="t.counted", max_attempts=1, **fields)
    occ = make_occurrence(schedule, clock.now())
    lose_the_next_reply(monkeypatch)
    with pytest.raises(errors.CoordinationUnavailable):
        deliver(occ, clock, "w/1#first")
    row = Occurrence.objects.get(pk=occ.pk)
    assert (row.state, row.lease_owner, runs) == (S.RUNNING, "w/1#first", [])
    return occ


def test_the_copy_resent_takes_back_the_claim_and_runs_the_body_once(
    tenant: Any, frozen_clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    occ = lost_claim(tenant, frozen_clock, monkeypatch)
    frozen_clock.advance(timedelta(seconds=1))  # the wrapper's countdown
    outcome = deliver(occ, frozen_clock, "w/2#second", claimed_as="w/1#first")
    assert outcome["outcome"] == "SUCCEEDED"
    assert runs == ["x"]
    row = Occurrence.objects.get(pk=occ.pk)
    assert (row.state, row.attempt_count, row.fencing_token) == (S.SUCCEEDED, 1, 1)
    attempts = list(Attempt.objects.filter(occurrence_id=occ.pk).values_list(
        "number", "worker", "outcome"
    ))  # fmt: skip
    assert attempts == [(1, "w/2#second", AttemptOutcome.SUCCEEDED)]


def test_a_claim_is_taken_back_once_and_only_under_the_name_it_was_made(
    tenant: Any, frozen_clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    occ = lost_claim(tenant, frozen_clock, monkeypatch)
    # Another delivery (a broker redelivery of the original, a plain duplicate) is not it.
    assert deliver(occ, frozen_clock, "w/3#other", claimed_as="w/9#else")["outcome"] == (
        "DUPLICATE"
    )
    assert deliver(occ, frozen_clock, "w/3#other")["outcome"] == "DUPLICATE"
    # Taken back, the claim has a new name: a second copy of the re-sent message is a
    # duplicate, not a second run beside the first.
    won = claim.claim(
        occ.id, worker="w/2#second", clock=frozen_clock, lease=LEASE, taking_back=["w/1#first"]
    )
    assert (won.outcome, won.fencing_token, won.attempt_number) == ("CLAIMED", 1, 1)
    again = claim.claim(
        occ.id, worker="w/4#third", clock=frozen_clock, lease=LEASE, taking_back=["w/1#first"]
    )
    assert again.outcome == "DUPLICATE"
    assert runs == []


def test_a_later_try_that_failed_before_its_claim_keeps_the_earlier_name(
    tenant: Any, frozen_clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    occ = lost_claim(tenant, frozen_clock, monkeypatch)
    # The first copy's claim never reached the database; it sends a copy in turn.
    first = [["w/1#first", 1000.0]]
    names = names_to_resend({HEADER_CLAIMED_AS: first}, "w/2#second", now=1001.0, lease_seconds=30)
    assert names == [["w/1#first", 1000.0], ["w/2#second", 1001.0]]
    outcome = execute(
        app, str(occ.id), "t.counted", ["x"], {}, worker_name="w/3#third", clock=frozen_clock,
        lease=LEASE, message={HEADER_CLAIMED_AS: names},
    )  # fmt: skip
    assert (outcome["outcome"], runs) == ("SUCCEEDED", ["x"])


def test_a_copy_names_the_tries_whose_claims_may_still_be_live() -> None:
    """However many tries failed (a long outage), each is named while its claim could be
    live (younger than a lease), and none after."""
    header: list[Any] = []
    for second in range(0, 600, 60):
        header = names_to_resend(
            {HEADER_CLAIMED_AS: header}, f"w#{second}", now=float(second), lease_seconds=300
        )
    assert [name for name, _ in header] == [f"w#{s}" for s in range(300, 600, 60)]
    assert names_to_resend({HEADER_CLAIMED_AS: "garbage"}, "w#x", now=1.0, lease_seconds=9) == [
        ["w#x", 1.0]
    ]


def test_a_claim_taken_back_after_its_schedule_was_canceled_is_stale(
    tenant: Any, frozen_clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    occ = lost_claim(tenant, frozen_clock, monkeypatch, concurrency_limit=1)
    api.cancel_schedule(occ.schedule_id)  # leaves the RUNNING occurrence to its worker
    outcome = deliver(occ, frozen_clock, "w/2#second", claimed_as="w/1#first")
    assert (outcome["outcome"], runs) == ("STALE", [])
    assert Occurrence.objects.get(pk=occ.pk).state == S.CANCELED
    assert ConcurrencySlot.objects.get().owner == ""  # its slot is free again


@pytest.mark.parametrize("since", ["taken", "lapsed"])
def test_a_slot_taken_or_lapsed_since_is_not_taken_back(
    tenant: Any, frozen_clock: FrozenClock, monkeypatch: pytest.MonkeyPatch, since: str
) -> None:
    """A claimer whose clock is ahead saw the slot lapse (and took it, or may take it at
    any moment): the copy does not run beside that run (the reaper settles the lost claim)."""
    occ = lost_claim(tenant, frozen_clock, monkeypatch, concurrency_limit=1)
    if since == "taken":
        ConcurrencySlot.objects.update(owner="someone else", occurrence_id=None)
    else:
        ConcurrencySlot.objects.update(expires_at=frozen_clock.now() - timedelta(seconds=1))
    outcome = deliver(occ, frozen_clock, "w/2#second", claimed_as="w/1#first")
    assert (outcome["outcome"], runs) == ("DUPLICATE", [])


def test_a_claim_is_not_taken_back_once_its_lease_lapsed(
    tenant: Any, frozen_clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    occ = lost_claim(tenant, frozen_clock, monkeypatch)
    frozen_clock.advance(LEASE + timedelta(seconds=1))
    # From its expiry on the run is not counted as running (slots, overlap, quotas): a
    # late copy claims anew, as any delivery of a lapsed run does.
    late = claim.claim(
        occ.id, worker="w/2#late", clock=frozen_clock, lease=LEASE, taking_back=["w/1#first"]
    )
    assert (late.outcome, late.fencing_token, late.attempt_number) == ("CLAIMED", 2, 2)


def test_the_slot_the_lost_claim_took_goes_with_it(
    tenant: Any, frozen_clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    occ = lost_claim(tenant, frozen_clock, monkeypatch, concurrency_limit=1)
    frozen_clock.advance(timedelta(seconds=5))
    won = claim.claim(
        occ.id, worker="w/2#second", clock=frozen_clock, lease=LEASE, taking_back=["w/1#first"]
    )
    assert won.claimed
    assert won.slot is not None
    slot = ConcurrencySlot.objects.get(occurrence_id=occ.pk)
    assert (slot.slot, slot.fencing_token) == (won.slot.slot, won.slot.fencing_token)
    assert slot.expires_at == frozen_clock.now() + LEASE  # renewed with the lease
