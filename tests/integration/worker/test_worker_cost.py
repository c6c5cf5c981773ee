"""What one scheduled run costs the database, and that the cheaper paths stay fenced.

The completion is one statement on PostgreSQL (``django_app.worker.complete_pg``) unless
the schedule counts failures; a first attempt's claim does not read earlier attempts. The
one-statement completion must write nothing under a stale token, release only its own
slot, and leave a schedule with ``pause_after_failures`` to the portable path.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from celery_scheduler import errors
from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.core.enums import AttemptOutcome
from celery_scheduler.core.enums import OccurrenceState as S
from django_app.models import Attempt, ConcurrencySlot, Occurrence, Schedule
from django_app.worker import claim, finish
from tests.integration.worker_support import make_occurrence, make_schedule

LEASE = timedelta(seconds=30)
pytestmark = pytest.mark.django_db
postgres_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the one-statement completion is PostgreSQL's"
)


def _statements(captured: CaptureQueriesContext) -> list[str]:
    skip = ("SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK TO SAVEPOINT")
    return [q["sql"] for q in captured.captured_queries if not q["sql"].startswith(skip)]


def test_a_first_attempts_claim_does_not_read_earlier_attempts(
    tenant: Any, frozen_clock: FrozenClock
) -> None:
    occ = make_occurrence(make_schedule(tenant), frozen_clock.now())
    with CaptureQueriesContext(connection) as captured:
        claim.claim(occ.id, worker="w", clock=frozen_clock, lease=LEASE)
    assert not [q for q in _statements(captured) if "MAX(" in q.upper()]


@postgres_only
def test_completion_is_one_statement_on_postgresql(tenant: Any, frozen_clock: FrozenClock) -> None:
    occ = make_occurrence(make_schedule(tenant), frozen_clock.now())
    token = claim.claim(occ.id, worker="w", clock=frozen_clock, lease=LEASE).fencing_token
    assert token is not None
    with CaptureQueriesContext(connection) as captured:
        finish.complete(occ.id, token, {"ok": 1}, clock=frozen_clock)
    assert len(_statements(captured)) == 1, _statements(captured)
    row = Occurrence.objects.get(pk=occ.pk)
    assert (row.state, row.result, row.lease_owner, row.lease_expires_at) == (
        S.SUCCEEDED, {"ok": 1}, "", None,
    )  # fmt: skip
    assert row.finished_at == frozen_clock.now()
    attempt = Attempt.objects.get(occurrence=occ)
    assert (attempt.outcome, attempt.result, attempt.finished_at) == (
        AttemptOutcome.SUCCEEDED, {"ok": 1}, frozen_clock.now(),
    )  # fmt: skip


def test_a_none_result_is_stored_as_null(tenant: Any, frozen_clock: FrozenClock) -> None:
    occ = make_occurrence(make_schedule(tenant), frozen_clock.now())
    token = claim.claim(occ.id, worker="w", clock=frozen_clock, lease=LEASE).fencing_token
    assert token is not None
    finish.complete(occ.id, token, None, clock=frozen_clock)
    assert Occurrence.objects.filter(pk=occ.pk, result__isnull=True).exists()
    assert Attempt.objects.filter(occurrence=occ, result__isnull=True).exists()


def test_a_stale_completion_writes_nothing_and_keeps_the_new_owners_slot(
    tenant: Any, frozen_clock: FrozenClock
) -> None:
    schedule = make_schedule(tenant, concurrency_limit=1)
    occ = make_occurrence(schedule, frozen_clock.now())
    old = claim.claim(occ.id, worker="slow", clock=frozen_clock, lease=LEASE)
    frozen_clock.advance(LEASE + timedelta(seconds=1))
    new = claim.claim(occ.id, worker="fast", clock=frozen_clock, lease=LEASE)
    assert old.fencing_token is not None
    assert new.fencing_token is not None
    with pytest.raises(errors.StaleWrite):
        finish.complete(occ.id, old.fencing_token, {"from": "slow"}, clock=frozen_clock)
    row = Occurrence.objects.get(pk=occ.pk)
    assert (row.state, row.fencing_token, row.result) == (S.RUNNING, new.fencing_token, None)
    slot = ConcurrencySlot.objects.get(tenant=tenant)
    assert slot.owner == finish.slot_owner(occ.id, new.fencing_token)
    newer = Attempt.objects.get(occurrence=occ, fencing_token=new.fencing_token)
    assert (newer.outcome, newer.result) == (AttemptOutcome.RUNNING, None)
    finish.complete(occ.id, new.fencing_token, {"from": "fast"}, clock=frozen_clock)
    assert ConcurrencySlot.objects.get(tenant=tenant).owner == ""
    assert Occurrence.objects.get(pk=occ.pk).result == {"from": "fast"}


def test_a_success_still_resets_the_failure_count(tenant: Any, frozen_clock: FrozenClock) -> None:
    schedule = make_schedule(tenant, pause_after_failures=3)
    Schedule.objects.filter(pk=schedule.pk).update(consecutive_failures=2)
    occ = make_occurrence(schedule, frozen_clock.now())
    token = claim.claim(occ.id, worker="w", clock=frozen_clock, lease=LEASE).fencing_token
    assert token is not None
    finish.complete(occ.id, token, {"ok": 1}, clock=frozen_clock)
    assert Schedule.objects.get(pk=schedule.pk).consecutive_failures == 0
    assert Occurrence.objects.get(pk=occ.pk).state == S.SUCCEEDED


@postgres_only
def test_an_idempotency_key_is_recorded_without_a_savepoint_on_postgresql() -> None:
    from django_app.worker import idempotency

    def run() -> Any:
        return idempotency.run_once(
            "cost-key", task_name="bench.cost", occurrence_id=None, body=lambda: {"n": 1}
        )

    with CaptureQueriesContext(connection) as captured:
        first = run()
    # One savepoint: the run's own transaction, nested in the test's. A savepoint around
    # the key's insert (to catch its IntegrityError) would be a second one.
    savepoints = [q for q in captured.captured_queries if q["sql"].startswith("SAVEPOINT")]
    assert len(savepoints) == 1, captured.captured_queries
    assert first == {"n": 1}
    assert run() == {"n": 1}  # a second delivery finds the key and returns the stored result


@postgres_only
def test_an_idempotent_runs_result_and_fence_are_one_statement_on_postgresql(
    tenant: Any, frozen_clock: FrozenClock
) -> None:
    from celery_scheduler.tasks import occurrence_context
    from django_app.models import IdempotencyRecord
    from django_app.worker import idempotency

    occ = make_occurrence(make_schedule(tenant), frozen_clock.now())
    token = claim.claim(occ.id, worker="w", clock=frozen_clock, lease=LEASE).fencing_token
    assert token is not None
    with CaptureQueriesContext(connection) as captured:
        with occurrence_context(
            str(occ.id), tenant_id=tenant.pk, fencing_token=token, clock=frozen_clock
        ):
            value = idempotency.run_once(
                "cost-fenced", task_name="bench.cost", occurrence_id=str(occ.id),
                body=lambda: {"n": 2}, tenant_id=tenant.pk,
            )  # fmt: skip
    # The key's insert, then the result's update and the fence's lock as one statement.
    assert len(_statements(captured)) == 2, _statements(captured)
    assert value == {"n": 2}
    record = IdempotencyRecord.objects.get(tenant=tenant, key="cost-fenced")
    assert record.result == {"n": 2}
