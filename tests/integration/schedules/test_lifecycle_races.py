"""Concurrency claims of the foundation, proven on PostgreSQL with real threads.

Each thread has its own database connection (Django gives every thread one), so these
races go through PostgreSQL's locking exactly as separate processes would.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction

from celery_scheduler import api
from celery_scheduler.core import ids
from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.core.states import UNCLAIMED
from django_app.models import Occurrence, Schedule, Tenant
from django_app.wiring import materialize_due
from tests.integration.threads import run_threads, wait_for_a_lock_waiter

pytestmark = [pytest.mark.concurrent_db, pytest.mark.django_db(transaction=True)]

NOW = datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC)


def _occurrence_row(schedule: Schedule, scheduled_for: datetime) -> dict[str, Any]:
    return {
        "schedule": schedule,
        "schedule_version": schedule.version,
        "tenant_id": schedule.tenant_id,
        "scheduled_for": scheduled_for,
        "available_at": scheduled_for,
    }


def test_unique_constraint_not_python_stops_a_second_occurrence() -> None:
    schedule = api.create_schedule(
        name="n", task="billing.ping", cron="* * * * *", clock=FrozenClock(NOW)
    )
    at = datetime(2026, 3, 1, 12, 1, tzinfo=UTC)
    Occurrence.objects.create(id=uuid.uuid4(), **_occurrence_row(schedule, at))
    # A different primary key: only UNIQUE(schedule, version, scheduled_for) can refuse it.
    with pytest.raises(IntegrityError, match="occurrence_schedule_version_time_uniq"):
        with transaction.atomic():
            Occurrence.objects.create(id=uuid.uuid4(), **_occurrence_row(schedule, at))
    assert Occurrence.objects.filter(schedule=schedule).count() == 1


def test_racing_inserts_of_one_key_leave_exactly_one_row() -> None:
    schedule = api.create_schedule(
        name="n", task="billing.ping", cron="* * * * *", clock=FrozenClock(NOW)
    )
    at = datetime(2026, 3, 1, 12, 2, tzinfo=UTC)
    outcomes: list[str] = []

    def insert() -> None:
        try:
            with transaction.atomic():
                Occurrence.objects.create(id=uuid.uuid4(), **_occurrence_row(schedule, at))
            outcomes.append("inserted")
        except IntegrityError:
            outcomes.append("conflict")

    assert run_threads(*[insert] * 8) == []
    assert sorted(outcomes) == ["conflict"] * 7 + ["inserted"]
    assert Occurrence.objects.filter(schedule=schedule).count() == 1


def _stale_claimable(schedule_id: uuid.UUID) -> list[Occurrence]:
    current = Schedule.objects.get(pk=schedule_id).version
    return list(
        Occurrence.objects.filter(
            schedule_id=schedule_id,
            schedule_version__lt=current,
            state__in=[s.value for s in UNCLAIMED],
        )
    )


@pytest.mark.parametrize("round_", range(3))
def test_update_and_cancel_racing_materializer_leave_nothing_claimable(round_: int) -> None:
    clock = FrozenClock(NOW)
    schedule = api.create_schedule(
        name=f"race-{round_}", task="billing.ping", cron="* * * * *", clock=clock
    )
    horizon = timedelta(minutes=30)
    stop = threading.Event()
    # Occurrences of version 1 exist before the race, so there is something to invalidate.
    assert materialize_due(clock=clock, horizon=horizon).occurrences_created == 30

    def materialize() -> None:
        while not stop.is_set():
            materialize_due(clock=clock, horizon=horizon, batch_size=50)

    def update() -> None:
        try:
            for i in range(15):
                api.update_schedule(schedule.id, clock=clock, args=[i])
        finally:
            stop.set()

    def update_timing() -> None:
        for minute in (5, 10, 15, 20, 25):
            api.update_schedule(schedule.id, clock=clock, cron=f"*/{minute} * * * *")

    assert run_threads(materialize, update, update_timing) == []
    assert _stale_claimable(schedule.id) == []

    # Cancel racing the materializer: afterwards nothing of any version is claimable.
    stop.clear()

    def cancel() -> None:
        try:
            api.cancel_schedule(schedule.id, clock=clock)
        finally:
            stop.set()

    assert run_threads(materialize, cancel) == []
    remaining = Occurrence.objects.filter(
        schedule_id=schedule.id, state__in=[s.value for s in UNCLAIMED]
    )
    assert list(remaining) == []
    # History is kept: invalidated occurrences are CANCELED, never deleted.
    assert Occurrence.objects.filter(schedule_id=schedule.id, state="CANCELED").count() >= 30


def _pause(schedule: Schedule, clock: FrozenClock) -> None:
    api.pause_schedule(schedule.id, clock=clock)
    assert Schedule.objects.get(pk=schedule.id).state == "PAUSED"


def _skip(schedule: Schedule, clock: FrozenClock) -> None:
    api.skip_occurrence(schedule.id, scheduled_for=NOW + timedelta(minutes=9.5), clock=clock)
    assert Occurrence.objects.filter(schedule=schedule, state="CANCELED").count() == 1


def _backfill(schedule: Schedule, clock: FrozenClock) -> None:
    start, end = NOW - timedelta(minutes=5.5), NOW - timedelta(seconds=30)
    assert api.backfill(schedule.id, start=start, end=end, clock=clock).created != []


#: Calls that lock the schedule row in a transaction of their own (each checks its effect).
LOCKING_CALLS: dict[str, Callable[[Schedule, FrozenClock], None]] = {
    "pause": _pause, "skip": _skip, "backfill": _backfill,
}  # fmt: skip


@pytest.mark.parametrize("call", list(LOCKING_CALLS))
def test_lifecycle_call_chosen_as_deadlock_victim_is_retried(call: str) -> None:
    """The materializer's lock order, replayed step by step: on InnoDB the lifecycle loses.

    The writer holds a shared lock on the schedule row (what InnoDB's foreign-key check of
    an occurrence insert takes, there implicitly), a pause (a skip, a backfill) asks for the
    row's exclusive lock and waits, then the writer updates the row
    itself (the materializer's COMPLETED update of a schedule with no further fire time; a
    plain plan moves only the cursor's own row). InnoDB calls that a deadlock and rolls
    back the transaction that wrote less, the call, which must run again once the writer
    commits. PostgreSQL lets a shared-lock holder update its row past a waiter, and the
    call just waits.
    """
    clock = FrozenClock(NOW)
    schedule = api.create_schedule(name="victim", task="billing.ping", cron="* * * * *",
                                   clock=clock)  # fmt: skip
    at = datetime(2026, 3, 1, 12, 5, tzinfo=UTC)
    inserted, pause_waits = threading.Event(), threading.Event()

    def writer() -> None:
        share = "LOCK IN SHARE MODE" if connection.vendor == "mysql" else "FOR SHARE"
        pk = Schedule._meta.pk.get_db_prep_value(schedule.id, connection)
        with transaction.atomic():
            with connection.cursor() as cur:
                cur.execute(f"SELECT id FROM {Schedule._meta.db_table} WHERE id = %s {share}", [pk])
            Occurrence.objects.create(id=uuid.uuid4(), **_occurrence_row(schedule, at))
            inserted.set()
            assert pause_waits.wait(timeout=20), "the pause never waited for the row lock"
            Schedule.objects.filter(pk=schedule.id).update(updated_at=NOW)

    def lifecycle_call() -> None:
        assert inserted.wait(timeout=20)
        LOCKING_CALLS[call](schedule, clock)

    def watch() -> None:
        # Releases the writer once the call (the only other transaction) waits for the lock.
        wait_for_a_lock_waiter(inserted, pause_waits)

    assert run_threads(writer, lifecycle_call, watch) == []
    if call == "pause":
        # The pause ran after the writer committed: it saw and canceled the writer's row.
        assert Occurrence.objects.get(schedule=schedule, scheduled_for=at).state == "CANCELED"


def test_a_sync_chosen_as_deadlock_victim_is_retried() -> None:
    """A sync locks its tenant, then each schedule it updates; a writer that holds a schedule
    row and then needs the tenant's (an occurrence insert's foreign-key check on InnoDB, a
    claim's tenant budget) closes the cycle. The sync, which has written nothing, is the
    victim on InnoDB, and on PostgreSQL too (it waited first, so its deadlock check runs
    first): its items are validated by then, so it runs again whole once the writer commits.
    """
    clock = FrozenClock(NOW)
    schedule = api.create_schedule(name="victim", task="billing.ping", cron="* * * * *",
                                   idempotency_key="victim", clock=clock)  # fmt: skip
    for n in range(5):  # rows the writer also writes: InnoDB rolls back the lighter one
        api.create_schedule(name=f"other {n}", task="billing.ping", cron="0 * * * *", clock=clock)
    holds, sync_waits = threading.Event(), threading.Event()
    tenant_table = Tenant._meta.db_table

    def writer() -> None:
        share = "LOCK IN SHARE MODE" if connection.vendor == "mysql" else "FOR SHARE"
        with transaction.atomic():
            assert Schedule.objects.update(updated_at=NOW) == 6
            holds.set()
            assert sync_waits.wait(timeout=20), "the sync never waited for the schedule row"
            with connection.cursor() as cur:
                cur.execute(
                    f"SELECT id FROM {tenant_table} WHERE id = %s {share}", [schedule.tenant_id]
                )

    def sync() -> None:
        assert holds.wait(timeout=20)
        item = {"idempotency_key": "victim", "name": "victim", "task": "billing.ping",
                "cron": "* * * * *", "priority": 7}  # fmt: skip
        assert api.sync_schedules([item], clock=clock).updated == ["victim"]

    assert run_threads(writer, sync, lambda: wait_for_a_lock_waiter(holds, sync_waits)) == []
    schedule.refresh_from_db()
    assert (schedule.priority, schedule.version) == (7, 2)


def test_occurrence_ids_are_deterministic_across_processes() -> None:
    schedule_id = uuid.UUID("12345678-1234-5678-1234-567812345678")
    at = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    assert ids.occurrence_id(schedule_id, 3, at) == ids.occurrence_id(str(schedule_id), 3, at)
    assert ids.occurrence_id(schedule_id, 3, at) != ids.occurrence_id(schedule_id, 4, at)
