"""The completion commits asynchronously on PostgreSQL; a completion a crash took back is
recovered by the lease, and ``@idempotent_task`` does not repeat its effect.

The claim's commit stays synchronous (its fencing token must not be handed out twice), so
only the completion's own transaction runs with ``synchronous_commit = off``, never the
session's later transactions. A database crash within a fraction of a second of the
completion can take it back: nothing of it remains, as if the worker had died before
writing it. These tests play that loss (the completion's write never lands) and check the
path that recovers it: the lease expires, the reaper re-queues the run under the same id,
and the next claim runs it; an ``@idempotent_task`` finds its key, committed synchronously
with the effect, and returns the stored result instead of a second effect.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from celery import Celery
from django.db import connection, transaction

from celery_scheduler import idempotent_task
from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.core.enums import AttemptOutcome
from celery_scheduler.core.enums import OccurrenceState as S
from django_app.models import Attempt, Occurrence
from django_app.tasks import execute
from django_app.worker import claim, finish
from example_project.billing.models import Invoice
from tests.integration.worker_support import make_occurrence, make_schedule

LEASE = timedelta(seconds=30)
app = Celery("async-completion-tests", set_as_current=False)
app.conf.task_always_eager = True
effects: list[str] = []


@idempotent_task(app=app, name="tests.async_completion.invoice")
def invoice(customer: str) -> dict[str, Any]:
    Invoice.objects.create(customer=customer, period="async-completion")
    return {"customer": customer}


@app.task(name="tests.async_completion.plain")
def plain(customer: str) -> dict[str, Any]:
    effects.append(customer)
    return {"customer": customer}


def _synchronous_commit() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        row = cursor.fetchone()
    assert row is not None
    return str(row[0])


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a PostgreSQL setting")
@pytest.mark.django_db(transaction=True)
def test_only_the_completions_own_transaction_commits_asynchronously(
    tenant: Any, frozen_clock: FrozenClock
) -> None:
    first, second = (make_occurrence(make_schedule(tenant), frozen_clock.now()) for _ in "ab")
    tokens = [
        claim.claim(occ.id, worker="w", clock=frozen_clock, lease=LEASE).fencing_token or 0
        for occ in (first, second)
    ]
    assert 0 not in tokens
    assert _synchronous_commit() == "on"
    with transaction.atomic():  # to look inside the completion's transaction
        finish.complete(first.id, tokens[0], {"ok": 1}, clock=frozen_clock)
        assert _synchronous_commit() == "off"
    # In autocommit, as a worker runs it: the setting ends with the statement's transaction,
    # so the next claim on this connection commits synchronously again.
    finish.complete(second.id, tokens[1], {"ok": 2}, clock=frozen_clock)
    assert _synchronous_commit() == "on"
    assert Occurrence.objects.filter(state=S.SUCCEEDED).count() == 2


def _run(occ: Occurrence, clock: FrozenClock) -> dict[str, Any]:
    schedule = occ.schedule
    return execute(
        app, str(occ.id), schedule.task, schedule.args, schedule.kwargs,
        worker_name="w", clock=clock, lease=LEASE,
    )  # fmt: skip


def _lose_the_completion_then_recover(
    occ: Occurrence, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> dict[str, Any]:
    with monkeypatch.context() as patched:
        patched.setattr(finish, "complete", lambda *args, **kwargs: None)
        assert _run(occ, clock)["outcome"] == "SUCCEEDED"  # what Celery saw
    row = Occurrence.objects.get(pk=occ.pk)
    assert (row.state, row.result) == (S.RUNNING, None)  # the database after the crash
    clock.advance(LEASE + timedelta(seconds=1))
    assert finish.reap_expired(clock=clock) == 1
    assert Occurrence.objects.get(pk=occ.pk).state == S.RETRY_WAIT  # re-queued, same id
    return _run(occ, clock)


@pytest.mark.django_db
def test_a_lost_completion_of_an_idempotent_task_reruns_without_a_second_effect(
    tenant: Any, frozen_clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    schedule = make_schedule(tenant, task="tests.async_completion.invoice", args=["acme"])
    occ = make_occurrence(schedule, frozen_clock.now())
    outcome = _lose_the_completion_then_recover(occ, frozen_clock, monkeypatch)
    assert outcome["outcome"] == "SUCCEEDED"
    assert Invoice.objects.filter(customer="acme").count() == 1  # the stored result came back
    row = Occurrence.objects.get(pk=occ.pk)
    assert (row.state, row.result) == (S.SUCCEEDED, {"customer": "acme"})
    outcomes = Attempt.objects.filter(occurrence=occ).order_by("number")
    assert list(outcomes.values_list("outcome", flat=True)) == [
        AttemptOutcome.LOST, AttemptOutcome.SUCCEEDED,
    ]  # fmt: skip


@pytest.mark.django_db
def test_a_lost_completion_of_a_plain_task_runs_it_again_under_the_same_id(
    tenant: Any, frozen_clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    effects.clear()
    schedule = make_schedule(tenant, task="tests.async_completion.plain", args=["acme"])
    occ = make_occurrence(schedule, frozen_clock.now())
    outcome = _lose_the_completion_then_recover(occ, frozen_clock, monkeypatch)
    # At least once, as after a worker that died before its completion: the run is settled
    # and its attempts say what happened.
    assert outcome["outcome"] == "SUCCEEDED"
    assert effects == ["acme", "acme"]
    assert Occurrence.objects.get(pk=occ.pk).state == S.SUCCEEDED
    outcomes = Attempt.objects.filter(occurrence=occ).order_by("number")
    assert list(outcomes.values_list("outcome", flat=True)) == [
        AttemptOutcome.LOST, AttemptOutcome.SUCCEEDED,
    ]  # fmt: skip
