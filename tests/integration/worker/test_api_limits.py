"""Limited runs (max_runs) and pause_after_failures."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import pytest

from celery_scheduler import api, errors
from celery_scheduler.core.clock import FrozenClock
from django_app.models import Occurrence, Schedule
from django_app.operations.reconcile import reconcile
from django_app.wiring import materialize_due
from django_app.worker import claim, finish
from django_app.worker.claim import ClaimOutcome
from tests.integration.worker_support import make_occurrence, make_schedule

NOW = datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(NOW)


def make(clock: FrozenClock, **overrides: Any) -> Schedule:
    values: dict[str, Any] = {"name": "report", "task": "billing.ping", "cron": "*/5 * * * *"}
    values.update(overrides)
    return api.create_schedule(clock=clock, **values)


def claim_as(occ_id: Any, clock: FrozenClock) -> claim.ClaimResult:
    return claim.claim(occ_id, worker="w", clock=clock, lease=timedelta(seconds=30))


def occurrences(schedule: Schedule) -> list[Occurrence]:
    return list(Occurrence.objects.filter(schedule=schedule).order_by("scheduled_for"))


@pytest.mark.django_db
def test_max_runs_completes_after_the_last_run_and_a_retry_is_not_a_run(
    clock: FrozenClock,
) -> None:
    s = make(clock, max_runs=2)
    materialize_due(clock=clock, horizon=timedelta(minutes=16))  # 12:05 .. 12:15
    first, second, third = occurrences(s)

    one = claim_as(first.id, clock)
    assert one.claimed
    assert api.describe_schedule(s.id, clock=clock).schedule.remaining_runs == 1
    finish.fail(first.id, one.fencing_token or 0, "flaky", retry_at=clock.now(), clock=clock)
    retry = claim_as(first.id, clock)
    assert retry.claimed  # the retry is the same run
    finish.complete(first.id, retry.fencing_token or 0, clock=clock)
    assert Schedule.objects.get(pk=s.id).runs_count == 1

    assert claim_as(second.id, clock).claimed
    s.refresh_from_db()
    assert (s.state, s.runs_count, s.next_run_at) == ("COMPLETED", 2, None)
    third.refresh_from_db()
    assert third.state == "CANCELED"
    assert "max_runs" in third.reason
    late = claim_as(third.id, clock)
    assert late.outcome is ClaimOutcome.DUPLICATE  # finished: its body never runs

    d = api.describe_schedule(s.id, clock=clock)
    assert d.schedule.remaining_runs == 0
    assert d.next_fire_times == []
    # Nothing expected after completion goes missing in the reconciler's eyes.
    clock.advance(timedelta(hours=1))
    report = reconcile(start=NOW, end=clock.now(), now=clock.now())
    assert report.ok, report.absent


@pytest.mark.django_db
def test_an_occurrence_beyond_max_runs_is_not_run(clock: FrozenClock, tenant: Any) -> None:
    s = make_schedule(tenant, max_runs=1, runs_count=1)
    occ = make_occurrence(s, clock.now())
    result = claim_as(occ.id, clock)
    assert result.outcome is ClaimOutcome.STALE
    assert "max_runs" in result.reason


@pytest.mark.django_db
def test_run_now_does_not_count(clock: FrozenClock) -> None:
    s = make(clock, max_runs=1)
    manual = api.run_now(s.id, clock=clock)
    assert claim_as(manual.id, clock).claimed
    s.refresh_from_db()
    assert (s.runs_count, s.state) == (0, "ACTIVE")


@pytest.mark.django_db
def test_update_max_runs(clock: FrozenClock) -> None:
    s = make(clock, max_runs=5)
    Schedule.objects.filter(pk=s.id).update(runs_count=3)
    with pytest.raises(errors.ValidationError) as info:
        api.update_schedule(s.id, max_runs=3, clock=clock)
    assert info.value.field == "max_runs"
    result = api.update_schedule(s.id, max_runs=4, clock=clock)
    assert result.version == 1  # not a timing change: no new version
    assert api.describe_schedule(s.id, clock=clock).schedule.remaining_runs == 1
    api.update_schedule(s.id, max_runs=None, clock=clock)
    assert api.describe_schedule(s.id, clock=clock).schedule.remaining_runs is None


@pytest.mark.django_db
@pytest.mark.parametrize("value", [0, -1, "3", 2.5, True])
def test_bad_max_runs_names_the_field(clock: FrozenClock, value: Any) -> None:
    with pytest.raises(errors.ValidationError) as info:
        make(clock, max_runs=value)
    assert info.value.field == "max_runs"
    assert not Schedule.objects.exists()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_racing_claims_run_exactly_max_runs(clock: FrozenClock, tenant: Any) -> None:
    from tests.integration.worker.test_worker_races import race

    s = make_schedule(tenant, max_runs=3)
    occs = [make_occurrence(s, NOW + timedelta(minutes=i)) for i in range(12)]
    results = race([partial(claim_as, o.id, clock) for o in occs])
    seen = Counter(getattr(r, "outcome", repr(r)) for r in results)
    assert seen[ClaimOutcome.CLAIMED] == 3
    # The rest were refused (STALE) or found canceled by the completion (DUPLICATE).
    assert seen[ClaimOutcome.STALE] + seen[ClaimOutcome.DUPLICATE] == 9
    assert Occurrence.objects.filter(schedule=s, state="RUNNING").count() == 3
    s.refresh_from_db()
    assert (s.runs_count, s.state) == (3, "COMPLETED")


# -- pause_after_failures -----------------------------------------------------------------


def run_and_fail(s: Schedule, at: datetime, clock: FrozenClock) -> None:
    occ = make_occurrence(s, at)
    result = claim_as(occ.id, clock)
    assert result.claimed
    finish.fail(occ.id, result.fencing_token or 0, "boom", clock=clock)


def run_and_succeed(s: Schedule, at: datetime, clock: FrozenClock) -> None:
    occ = make_occurrence(s, at)
    result = claim_as(occ.id, clock)
    assert result.claimed
    finish.complete(occ.id, result.fencing_token or 0, clock=clock)


@pytest.mark.django_db
def test_pauses_itself_after_n_consecutive_dead_and_a_success_resets(
    clock: FrozenClock,
) -> None:
    s = make(clock, pause_after_failures=2)
    run_and_fail(s, NOW, clock)
    run_and_succeed(s, NOW + timedelta(minutes=5), clock)
    run_and_fail(s, NOW + timedelta(minutes=10), clock)
    s.refresh_from_db()
    assert (s.state, s.consecutive_failures) == ("ACTIVE", 1)
    pending = make_occurrence(s, NOW + timedelta(minutes=20), sent=False)
    s.refresh_from_db()
    run_and_fail(s, NOW + timedelta(minutes=15), clock)
    d = api.describe_schedule(s.id, clock=clock)
    assert d.schedule.state == "PAUSED"
    assert d.schedule.state_reason.startswith("paused after 2 consecutive failed occurrences")
    pending.refresh_from_db()
    assert pending.state == "CANCELED"  # a pause invalidates what was planned
    api.resume_schedule(s.id, clock=clock)
    assert Schedule.objects.get(pk=s.id).consecutive_failures == 0


@pytest.mark.django_db
def test_a_lease_expiry_that_dead_letters_counts(clock: FrozenClock, tenant: Any) -> None:
    s = make_schedule(tenant, pause_after_failures=1, max_attempts=1)
    occ = make_occurrence(s, NOW)
    assert claim_as(occ.id, clock).claimed
    clock.advance(31)
    assert finish.reap_expired(clock=clock) == 1
    s.refresh_from_db()
    assert s.state == "PAUSED"
    assert "consecutive failed" in s.pause_reason


@pytest.mark.django_db
@pytest.mark.parametrize("value", [0, "2", 10_001])
def test_bad_pause_after_failures_names_the_field(clock: FrozenClock, value: Any) -> None:
    with pytest.raises(errors.ValidationError) as info:
        make(clock, pause_after_failures=value)
    assert info.value.field == "pause_after_failures"
