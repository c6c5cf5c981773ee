"""Issue 9, hole 11 (lifecycle parts): run_now idempotency key, update's expected version,
and replaying a dead occurrence that its schedule has moved past."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection

from celery_scheduler import api, errors
from celery_scheduler.core import ids
from celery_scheduler.core.clock import FrozenClock
from django_app.models import Occurrence, OutboxEntry, Schedule
from django_app.worker import claim, finish

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(NOW)


def make(clock: FrozenClock, **overrides: Any) -> Schedule:
    values: dict[str, Any] = {"name": "report", "task": "billing.ping", "cron": "*/5 * * * *"}
    values.update(overrides)
    return api.create_schedule(clock=clock, **values)


def dead(schedule: Schedule, clock: FrozenClock, *, manual: bool = False) -> Occurrence:
    """A run of ``schedule``'s current version that failed for good."""
    if manual:
        occ = api.run_now(schedule.id, clock=clock)
    else:
        at = NOW - timedelta(seconds=30)
        occ = Occurrence.objects.create(
            id=ids.occurrence_id(schedule.id, schedule.version, at), schedule=schedule,
            schedule_version=schedule.version, tenant_id=schedule.tenant_id,
            scheduled_for=at, available_at=at,
        )  # fmt: skip
        OutboxEntry.objects.create(
            occurrence=occ, tenant_id=schedule.tenant_id, shard=schedule.shard, available_at=at
        )
    claimed = claim.claim(occ.id, worker="w1", clock=clock)
    assert claimed.fencing_token is not None
    finish.fail(occ.id, claimed.fencing_token, "ValueError: bad input", clock=clock)
    occ.refresh_from_db()
    assert occ.state == "DEAD"
    return occ


# --- run_now ------------------------------------------------------------------------------


def test_run_now_with_the_same_key_runs_once(clock: FrozenClock) -> None:
    schedule = make(clock)
    first = api.run_now(schedule.id, clock=clock, idempotency_key="click-1")
    clock.advance(1)  # the second click lands a moment later
    again = api.run_now(schedule.id, clock=clock, idempotency_key="click-1")

    assert again.id == first.id == ids.manual_occurrence_id(schedule.id, "click-1")
    assert Occurrence.objects.filter(schedule=schedule, manual=True).count() == 1
    assert OutboxEntry.objects.filter(occurrence__schedule=schedule).count() == 1
    other = api.run_now(schedule.id, clock=clock, idempotency_key="click-2")
    assert other.id != first.id
    assert Occurrence.objects.filter(schedule=schedule, manual=True).count() == 2


def test_run_now_key_survives_a_version_bump_and_is_per_schedule(clock: FrozenClock) -> None:
    schedule, other = make(clock), make(clock, name="other")
    first = api.run_now(schedule.id, clock=clock, idempotency_key="k")
    api.update_schedule(schedule.id, clock=clock, name="renamed")
    assert api.run_now(schedule.id, clock=clock, idempotency_key="k").id == first.id
    assert api.run_now(other.id, clock=clock, idempotency_key="k").id != first.id


def test_run_now_without_a_key_still_runs_each_time(clock: FrozenClock) -> None:
    schedule = make(clock)
    api.run_now(schedule.id, clock=clock)
    clock.advance(1)
    api.run_now(schedule.id, clock=clock)
    assert Occurrence.objects.filter(schedule=schedule, manual=True).count() == 2


def test_run_now_rejects_an_empty_key(clock: FrozenClock) -> None:
    schedule = make(clock)
    with pytest.raises(errors.ValidationError):
        api.run_now(schedule.id, clock=clock, idempotency_key="  ")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_run_now_with_one_key_creates_one_occurrence(clock: FrozenClock) -> None:
    schedule = make(clock)
    barrier = threading.Barrier(4)
    results: list[Any] = []

    def click() -> None:
        try:
            barrier.wait()
            results.append(api.run_now(schedule.id, clock=clock, idempotency_key="dbl").id)
        except Exception as exc:  # pragma: no cover - reported below
            results.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=click) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [ids.manual_occurrence_id(schedule.id, "dbl")] * 4
    assert Occurrence.objects.filter(schedule=schedule, manual=True).count() == 1


# --- expected_version ---------------------------------------------------------------------


def test_update_with_a_stale_expected_version_conflicts_and_writes_nothing(
    clock: FrozenClock,
) -> None:
    schedule = make(clock)
    api.update_schedule(schedule.id, clock=clock, name="by alice", expected_version=1)

    with pytest.raises(errors.VersionConflict, match=r"version 1.*version 2") as raised:
        api.update_schedule(schedule.id, clock=clock, name="by bob", expected_version=1)

    assert isinstance(raised.value, errors.SchedulerError)
    assert (raised.value.expected, raised.value.actual) == (1, 2)
    schedule.refresh_from_db()
    assert (schedule.name, schedule.version) == ("by alice", 2)
    assert api.update_schedule(schedule.id, clock=clock, name="bob", expected_version=2).version


@pytest.mark.parametrize("expected", ["abc", [1], True, 2.7])
def test_an_expected_version_that_is_not_a_version_number_is_refused(
    clock: FrozenClock, expected: Any
) -> None:
    """It raised ValueError or TypeError, or took True for version 1 and 2.7 for 2."""
    schedule = make(clock)
    with pytest.raises(errors.ValidationError, match="expected_version") as refused:
        api.update_schedule(schedule.id, clock=clock, name="x", expected_version=expected)
    assert refused.value.field == "expected_version"
    schedule.refresh_from_db()
    assert schedule.version == 1
    assert api.update_schedule(schedule.id, clock=clock, name="x", expected_version=1).changed


def test_a_pause_notes_error_names_the_note(clock: FrozenClock) -> None:
    """The note becomes the audit reason when none is given: its own check comes first."""
    schedule = make(clock)
    for note in ("n" * 3000, "a\x00b"):  # past the reason's 2,000 characters; a NUL
        with pytest.raises(errors.ValidationError) as refused:
            api.pause_schedule(schedule.id, note=note, clock=clock)
        assert refused.value.field == "note"


# --- replay -------------------------------------------------------------------------------


def test_replay_of_a_dead_occurrence_of_an_old_version_is_refused(clock: FrozenClock) -> None:
    schedule = make(clock)
    occ = dead(schedule, clock)
    api.update_schedule(schedule.id, clock=clock, args=[1])

    with pytest.raises(errors.InvalidStateTransition, match=r"version 1.*version 2"):
        api.replay_occurrence(occ.id, clock=clock)

    occ.refresh_from_db()
    assert (occ.state, occ.reason) == ("DEAD", "")


def test_replay_of_a_dead_occurrence_of_a_canceled_schedule_is_refused(
    clock: FrozenClock,
) -> None:
    schedule = make(clock)
    occ = dead(schedule, clock, manual=True)
    api.cancel_schedule(schedule.id, clock=clock)
    with pytest.raises(errors.InvalidStateTransition, match="canceled"):
        api.replay_occurrence(occ.id, clock=clock)
    occ.refresh_from_db()
    assert occ.state == "DEAD"


def test_replay_of_a_manual_run_survives_a_version_bump(clock: FrozenClock) -> None:
    schedule = make(clock)
    occ = dead(schedule, clock, manual=True)
    api.update_schedule(schedule.id, clock=clock, args=[1])
    assert api.replay_occurrence(occ.id, clock=clock).state == "ENQUEUED"
    claimed = claim.claim(occ.id, worker="w2", clock=clock)
    assert claimed.claimed
