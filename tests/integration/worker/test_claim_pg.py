"""The common claim as one statement on PostgreSQL (``django_app.worker.claim_pg``).

It must write what the portable claim writes and return what it returns, and leave every
case it does not decide (duplicates, stale occurrences, overlap, quotas, slots, ``max_runs``)
to the portable path, having written nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.core.enums import AttemptOutcome, OverlapPolicy
from celery_scheduler.core.enums import OccurrenceState as S
from django_app.models import Attempt, Occurrence, Schedule, Tenant
from django_app.worker import claim, claim_pg, finish
from tests.integration.worker_support import make_occurrence, make_schedule

LEASE = timedelta(seconds=30)
pytestmark = [pytest.mark.django_db, pytest.mark.postgres]


@pytest.fixture
def portable() -> Iterator[None]:
    claim_pg.ONE_STATEMENT_CLAIM = False
    try:
        yield
    finally:
        claim_pg.ONE_STATEMENT_CLAIM = True


def _statements(captured: CaptureQueriesContext) -> list[str]:
    skip = ("SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK TO SAVEPOINT")
    return [q["sql"] for q in captured.captured_queries if not q["sql"].startswith(skip)]


def test_the_common_claim_is_one_statement(tenant: Any, frozen_clock: FrozenClock) -> None:
    occ = make_occurrence(make_schedule(tenant), frozen_clock.now())
    with CaptureQueriesContext(connection) as captured:
        result = claim.claim(occ.id, worker="w", clock=frozen_clock, lease=LEASE)
    assert result.claimed
    assert len(_statements(captured)) == 1, _statements(captured)


def _occurrence_row(occ_id: Any) -> dict[str, Any]:
    row = Occurrence.objects.filter(pk=occ_id).values().get()
    return {k: v for k, v in row.items() if k not in ("id", "schedule_id", "created_at")}


def _attempt_rows(occ_id: Any) -> list[dict[str, Any]]:
    rows = Attempt.objects.filter(occurrence_id=occ_id).order_by("number").values()
    return [{k: v for k, v in r.items() if k not in ("id", "occurrence_id")} for r in rows]


def _result(result: claim.ClaimResult) -> dict[str, Any]:
    fields = dict(result.__dict__)
    fields.pop("occurrence_id")
    if result.slot is not None:  # its key names the schedule: twin schedules differ there
        fields["slot"] = (result.slot.slot, result.slot.fencing_token)
    return fields


def _retry_after_a_failure(occ: Occurrence, clock: FrozenClock) -> None:
    first = claim.claim(occ.id, worker="w", clock=clock, lease=LEASE)
    assert first.fencing_token is not None
    finish.fail(occ.id, first.fencing_token, "boom", retry_at=clock.now(), clock=clock)


def _retry_after_a_dead_letter(occ: Occurrence, clock: FrozenClock) -> None:
    first = claim.claim(occ.id, worker="w", clock=clock, lease=LEASE)
    assert first.fencing_token is not None
    finish.fail(occ.id, first.fencing_token, "boom", clock=clock)  # DEAD
    finish.replay_occurrence(occ.id, clock=clock)


def _nothing(occ: Occurrence, clock: FrozenClock) -> None:
    pass


# (schedule fields, occurrence set-up, what the claim is): each claimed by both paths, on
# twin schedules, must leave the same rows and return the same result.
CASES: list[tuple[dict[str, Any], Callable[[Occurrence, FrozenClock], None], bool]] = [
    ({}, _nothing, True),
    ({"deadline_seconds": 90, "max_attempts": 4, "timezone": "Europe/Paris"}, _nothing, True),
    ({"overlap_policy": OverlapPolicy.SKIP_IF_RUNNING.value}, _nothing, True),
    ({}, _retry_after_a_failure, True),
    ({}, _retry_after_a_dead_letter, True),
    ({"max_runs": 5}, _retry_after_a_failure, True),  # a retry is not a new run
    ({"max_runs": 5}, _nothing, False),  # counts a run: the portable path's
    ({"concurrency_limit": 2}, _nothing, False),
]


@pytest.mark.parametrize(("fields", "setup", "one_statement"), CASES)
def test_both_paths_write_and_return_the_same(
    tenant: Tenant,
    frozen_clock: FrozenClock,
    fields: dict[str, Any],
    setup: Callable[[Occurrence, FrozenClock], None],
    one_statement: bool,
) -> None:
    seen = []
    for one in (True, False):
        claim_pg.ONE_STATEMENT_CLAIM = one
        try:
            occ = make_occurrence(make_schedule(tenant, **fields), frozen_clock.now())
            setup(occ, frozen_clock)
            with CaptureQueriesContext(connection) as captured:
                result = claim.claim(occ.id, worker="w2", clock=frozen_clock, lease=LEASE)
            seen.append((_result(result), _occurrence_row(occ.id), _attempt_rows(occ.id)))
            if one:
                assert (len(_statements(captured)) == 1) is one_statement, _statements(captured)
        finally:
            claim_pg.ONE_STATEMENT_CLAIM = True
    assert seen[0][0]["outcome"] == claim.ClaimOutcome.CLAIMED
    assert seen[0] == seen[1]


def _running_elsewhere(schedule: Schedule, at: datetime, clock: FrozenClock) -> None:
    other = make_occurrence(schedule, at - timedelta(minutes=1))
    assert claim.claim(other.id, worker="other", clock=clock, lease=LEASE).claimed


@pytest.mark.parametrize(
    "make",
    [
        "duplicate",
        "canceled",
        "superseded",
        "overlap",
        "quota",
        "live_lease",
        "expired_lease",
    ],
)
def test_what_it_does_not_decide_goes_to_the_portable_path(
    tenant: Tenant, frozen_clock: FrozenClock, make: str
) -> None:
    now = frozen_clock.now()
    schedule = make_schedule(tenant, overlap_policy=OverlapPolicy.SKIP_IF_RUNNING.value)
    occ = make_occurrence(schedule, now)
    expected = {
        "duplicate": claim.ClaimOutcome.DUPLICATE,
        "canceled": claim.ClaimOutcome.STALE,
        "superseded": claim.ClaimOutcome.STALE,
        "overlap": claim.ClaimOutcome.SKIPPED_OVERLAP,
        "quota": claim.ClaimOutcome.DEFERRED,
        "live_lease": claim.ClaimOutcome.DUPLICATE,
        "expired_lease": claim.ClaimOutcome.CLAIMED,
    }[make]
    if make == "duplicate":
        Occurrence.objects.filter(pk=occ.pk).update(state=S.SUCCEEDED.value)
    elif make == "canceled":
        Schedule.objects.filter(pk=schedule.pk).update(state="CANCELED")
    elif make == "superseded":
        Schedule.objects.filter(pk=schedule.pk).update(version=schedule.version + 1)
    elif make == "overlap":
        _running_elsewhere(schedule, now, frozen_clock)
    elif make == "quota":
        Tenant.objects.filter(pk=tenant.pk).update(max_running=1)
        _running_elsewhere(make_schedule(tenant), now, frozen_clock)
    elif make in ("live_lease", "expired_lease"):
        assert claim.claim(occ.id, worker="w1", clock=frozen_clock, lease=LEASE).claimed
        if make == "expired_lease":
            frozen_clock.advance(LEASE + timedelta(seconds=1))
    before = (_occurrence_row(occ.id), _attempt_rows(occ.id))
    claimed = claim_pg.claim(occ.id, occ.scheduled_for, "w2", frozen_clock.now(), LEASE)
    assert claimed is None
    assert (_occurrence_row(occ.id), _attempt_rows(occ.id)) == before  # wrote nothing
    assert claim.claim(occ.id, worker="w2", clock=frozen_clock, lease=LEASE).outcome == expected
    if make == "expired_lease":  # the portable path's: the old attempt lost its lease
        outcomes = [a["outcome"] for a in _attempt_rows(occ.id)]
        assert outcomes == [AttemptOutcome.LOST, AttemptOutcome.RUNNING]


def test_the_portable_path_still_claims_on_postgresql(
    tenant: Any, frozen_clock: FrozenClock, portable: None
) -> None:
    occ = make_occurrence(make_schedule(tenant), frozen_clock.now())
    with CaptureQueriesContext(connection) as captured:
        assert claim.claim(occ.id, worker="w", clock=frozen_clock, lease=LEASE).claimed
    assert len(_statements(captured)) == 4, _statements(captured)
