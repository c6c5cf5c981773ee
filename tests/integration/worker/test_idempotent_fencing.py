"""``@idempotent_task`` commits a scheduled run's effect only while its claim is still current.

A worker stalled past its occurrence lease (GC pause, SIGSTOP, a stalled VM) used to commit
its effect when it woke, although the reaper had re-queued the run and another worker had
taken it (and its concurrency slot) over: two runs' effects overlapped beyond the cap (seen
in the chaos soak). The effect transaction now re-checks the claim (fencing token, RUNNING,
live lease) under a row lock before it commits; a stale one rolls back with ``StaleWrite``.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery
from django.db import connection
from django.db.models import F

from celery_scheduler import errors, idempotent_task
from celery_scheduler.core.clock import SYSTEM_CLOCK, FrozenClock
from celery_scheduler.tasks import occurrence_context
from django_app.models import IdempotencyRecord, Occurrence
from django_app.worker import claim, finish
from example_project.billing.models import Invoice
from tests.integration.threads import holding, run_threads, wait_for_a_lock_waiter
from tests.integration.worker_support import make_occurrence, make_schedule

app = Celery("fencing-tests", set_as_current=False)
app.conf.task_always_eager = True
HOOK: dict[str, Any] = {}


@idempotent_task(app=app, name="tests.fenced_invoice")
def fenced_invoice(customer: str) -> dict[str, Any]:
    Invoice.objects.create(customer=customer, period="fenced")
    if "during" in HOOK:
        HOOK["during"]()
    return {"customer": customer}


def claimed(tenant: Any) -> tuple[Occurrence, int]:
    occ = make_occurrence(make_schedule(tenant), SYSTEM_CLOCK.now())
    token = claim.claim(occ.id, worker="w1", lease=timedelta(seconds=30)).fencing_token
    assert token is not None
    return occ, token


def run(occ: Occurrence, token: int, customer: str) -> Any:
    with occurrence_context(str(occ.id), tenant_id=occ.tenant_id, fencing_token=token):
        return fenced_invoice(customer)


@pytest.fixture(autouse=True)
def _clear_hook() -> Any:
    yield
    HOOK.clear()


@pytest.mark.django_db
@pytest.mark.parametrize("lost", ["token taken over", "lease expired", "reaped"])
def test_a_run_that_lost_its_claim_commits_no_effect(tenant: Any, lost: str) -> None:
    occ, token = claimed(tenant)
    rows = Occurrence.objects.filter(pk=occ.pk)
    HOOK["during"] = {
        "token taken over": lambda: rows.update(fencing_token=F("fencing_token") + 1),
        "lease expired": lambda: rows.update(lease_expires_at=SYSTEM_CLOCK.now()),
        "reaped": lambda: rows.update(state="RETRY_WAIT", lease_expires_at=None),
    }[lost]
    with pytest.raises(errors.StaleWrite, match="rolled back"):
        run(occ, token, "stale")
    assert not Invoice.objects.filter(customer="stale").exists()
    assert not IdempotencyRecord.objects.filter(occurrence_id=occ.id).exists()


@pytest.mark.django_db
def test_a_current_claim_commits_and_a_run_outside_the_scheduler_is_not_fenced(
    tenant: Any,
) -> None:
    occ, token = claimed(tenant)
    assert run(occ, token, "fresh") == {"customer": "fresh"}
    assert Invoice.objects.filter(customer="fresh").count() == 1
    assert fenced_invoice.delay("plain").get() == {"customer": "plain"}


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_stalled_worker_woken_after_a_takeover_rolls_its_effect_back(tenant: Any) -> None:
    """Real concurrency: another connection takes the run over while this body is stalled."""
    occ, token = claimed(tenant)
    stalled, resumed = threading.Event(), threading.Event()

    def takeover() -> None:
        stalled.wait(10)
        try:  # the reaper and a second worker, each in its own transaction
            Occurrence.objects.filter(pk=occ.pk).update(lease_expires_at=SYSTEM_CLOCK.now())
            finish.reap_expired()
            claim.claim(occ.id, worker="w2", lease=timedelta(seconds=30))
        finally:
            connection.close()
            resumed.set()

    def stall() -> None:
        stalled.set()
        resumed.wait(10)

    HOOK["during"] = stall
    other = threading.Thread(target=takeover)
    other.start()
    with pytest.raises(errors.StaleWrite):
        run(occ, token, "stalled")
    other.join(10)
    assert not Invoice.objects.filter(customer="stalled").exists()
    assert Occurrence.objects.get(pk=occ.pk).lease_owner == "w2"


@pytest.mark.concurrent_db
@pytest.mark.django_db(transaction=True)
def test_a_fence_that_waited_for_its_row_past_the_lease_rolls_the_effect_back(
    tenant: Any,
) -> None:
    """The body is done with a second of its lease left; its fence waits for the row (a
    duplicate delivery's claim holds it), and the lease lapses meanwhile (claims stop
    counting the run, its slot may be taken). The effect must roll back: the fence judges
    the lease once it holds the row, not when it asked for it."""
    clock = FrozenClock(SYSTEM_CLOCK.now())
    occ = make_occurrence(make_schedule(tenant), clock.now())
    token = claim.claim(occ.id, worker="w1", clock=clock, lease=timedelta(seconds=30)).fencing_token
    assert token is not None
    clock.advance(29)
    locked, fence_waits, released = threading.Event(), threading.Event(), threading.Event()
    outcome: list[str] = []

    hold_the_row = holding(
        Occurrence.objects.filter(pk=occ.pk), locked, released, "the lease never lapsed"
    )

    def body_then_fence() -> None:
        assert locked.wait(timeout=20)
        with occurrence_context(str(occ.id), tenant_id=occ.tenant_id, fencing_token=token,
                                clock=clock):  # fmt: skip
            try:
                fenced_invoice("late")
                outcome.append("committed")
            except errors.StaleWrite:
                outcome.append("rolled back")

    def lapse() -> None:
        wait_for_a_lock_waiter(locked, fence_waits)
        assert fence_waits.is_set(), "the fence never waited for the row"
        clock.advance(2)
        released.set()

    assert run_threads(hold_the_row, body_then_fence, lapse) == []
    assert outcome == ["rolled back"]
    assert not Invoice.objects.filter(customer="late").exists()
