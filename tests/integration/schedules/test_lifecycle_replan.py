"""What a lifecycle call re-plans: invalidated times yes, claimed or finished times never.

Issue 9, holes 1 and 9. A (schedule, scheduled_for) that was claimed or finished under any
version must not be materialized again by an update, a pause/resume or a beat_schedule sync;
the times whose occurrences the call invalidated before anyone claimed them are planned
again under the new version, whether or not they were due yet. Each scenario runs with a
frozen clock through the real materializer (per-schedule path everywhere, set-based path
on PostgreSQL) and the real worker claim/complete/fail, and ends with the reconciler.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import override_settings

from celery_scheduler import api
from celery_scheduler.core.clock import FrozenClock
from django_app.models import Occurrence, Schedule
from django_app.operations import reconcile
from django_app.schedules import beat_schedule
from django_app.wiring import materialize_due
from django_app.worker import claim, finish

pytestmark = pytest.mark.django_db(transaction=True)

MINUTE = timedelta(minutes=1)


def at(hour: int, minute: int, second: int = 0) -> datetime:
    return datetime(2026, 3, 1, hour, minute, second, tzinfo=UTC)


def _single(clock: FrozenClock) -> None:
    from django.conf import settings

    overrides = {**getattr(settings, "CELERY_SCHEDULER", {}), "bulk_materialize": False}
    with override_settings(CELERY_SCHEDULER=overrides):
        materialize_due(clock=clock)


def _bulk(clock: FrozenClock) -> None:
    from django_app.materialize.set_based import materialize_due_bulk

    materialize_due_bulk(clock=clock)


@pytest.fixture(
    params=[
        pytest.param(_single, id="per-schedule"),
        pytest.param(_bulk, id="set-based", marks=pytest.mark.postgres),
    ]
)
def materialize(request: pytest.FixtureRequest) -> Callable[[FrozenClock], None]:
    fn: Callable[[FrozenClock], None] = request.param
    return fn


def occurrence(schedule: Schedule, when: datetime, version: int | None = None) -> Occurrence:
    return Occurrence.objects.get(
        schedule=schedule, scheduled_for=when, schedule_version=version or schedule.version
    )


def run(occ: Occurrence, clock: FrozenClock, outcome: str = "SUCCEEDED") -> None:
    """What a worker does with a delivered occurrence: claim, then succeed or retry later."""
    claimed = claim.claim(occ.id, worker="w1", clock=clock)
    assert claimed.claimed, claimed
    assert claimed.fencing_token is not None
    if outcome == "SUCCEEDED":
        finish.complete(occ.id, claimed.fencing_token, clock=clock)
    else:
        finish.fail(
            occ.id, claimed.fencing_token, "timeout", retry_at=clock.now() + 10 * MINUTE,
            clock=clock,
        )  # fmt: skip


def runs_by_time(schedule: Schedule) -> dict[datetime, list[tuple[int, str]]]:
    """Every occurrence that may run or has run, per time: (version, state), CANCELED left out."""
    rows: dict[datetime, list[tuple[int, str]]] = {}
    for occ in Occurrence.objects.filter(schedule=schedule).order_by("scheduled_for", "id"):
        if occ.state != "CANCELED":
            rows.setdefault(occ.scheduled_for, []).append((occ.schedule_version, occ.state))
    return rows


def assert_reconciles(schedule: Schedule, start: datetime, end: datetime, now: datetime) -> None:
    report = reconcile.reconcile(start=start, end=end, now=now, schedule_ids=[schedule.id])
    assert [(i.version, i.scheduled_for) for i in report.absent] == []


def issue_scenario(
    clock: FrozenClock, materialize: Callable[[FrozenClock], None], **values: Any
) -> Schedule:
    """The issue's state at 12:02:30: 12:00 RETRY_WAIT, 12:01 and 12:02 SUCCEEDED, 12:03
    materialized (60 s horizon) and not yet due."""
    clock.set(at(11, 59, 30))
    schedule = api.create_schedule(
        name="report", task="billing.ping", cron="* * * * *", clock=clock, **values
    )
    materialize(clock)
    clock.set(at(12, 0))
    materialize(clock)
    run(occurrence(schedule, at(12, 0)), clock, "RETRY_WAIT")
    for minute in (1, 2):
        clock.set(at(12, minute))
        materialize(clock)
        run(occurrence(schedule, at(12, minute)), clock)
    clock.set(at(12, 2, 30))
    materialize(clock)
    assert occurrence(schedule, at(12, 3)).state == "SCHEDULED"
    return schedule


def advance_to(
    clock: FrozenClock, materialize: Callable[[FrozenClock], None], end: datetime
) -> None:
    while clock.now() < end:
        clock.advance(MINUTE)
        materialize(clock)


def test_update_does_not_rerun_what_ran_under_the_old_version(
    materialize: Callable[[FrozenClock], None],
) -> None:
    clock = FrozenClock(at(11, 59))
    schedule = issue_scenario(clock, materialize)

    result = api.update_schedule(schedule.id, clock=clock, name="renamed report")
    materialize(clock)
    advance_to(clock, materialize, at(12, 5, 30))

    assert result.version == 2
    rows = runs_by_time(schedule)
    # 12:00 was claimed (its retry is canceled by the update, not re-run under v2);
    # 12:01 and 12:02 succeeded under v1 and must stay the only run of their time.
    assert rows.get(at(12, 0)) is None
    assert rows[at(12, 1)] == [(1, "SUCCEEDED")]
    assert rows[at(12, 2)] == [(1, "SUCCEEDED")]
    # 12:03 was invalidated before anyone claimed it: it is planned again under v2.
    assert rows[at(12, 3)] == [(2, "SCHEDULED")]
    assert [v for v, _ in rows[at(12, 4)]] == [2]
    assert_reconciles(schedule, at(11, 59), at(12, 6), now=clock.now())


def test_update_replans_invalidated_times_between_ones_that_ran(
    materialize: Callable[[FrozenClock], None],
) -> None:
    """12:00 was never claimed (its message is late), 12:01 ran: only 12:00 is re-planned."""
    clock = FrozenClock(at(11, 59, 30))
    schedule = api.create_schedule(name="r", task="billing.ping", cron="* * * * *", clock=clock)
    materialize(clock)
    clock.set(at(12, 1))
    materialize(clock)
    run(occurrence(schedule, at(12, 1)), clock)
    clock.set(at(12, 1, 30))
    materialize(clock)

    api.update_schedule(schedule.id, clock=clock, args=[7])
    materialize(clock)
    advance_to(clock, materialize, at(12, 3, 30))

    rows = runs_by_time(schedule)
    assert rows[at(12, 0)] == [(2, "SCHEDULED")]
    assert rows[at(12, 1)] == [(1, "SUCCEEDED")]
    assert rows[at(12, 2)] == [(2, "SCHEDULED")]
    assert_reconciles(schedule, at(11, 59), at(12, 4), now=clock.now())


def test_an_update_keeps_a_due_run_that_waits_for_a_worker(
    materialize: Callable[[FrozenClock], None],
) -> None:
    """12:10 was planned and is due, its message waits behind busy workers (never claimed);
    an update at 12:16, past its max_lateness (300 s), must not make it MISSED: the run was
    decided, it only waited, and it fires under the new version as it would have under the
    old one."""
    clock = FrozenClock(at(12, 9, 30))
    schedule = api.create_schedule(name="r", task="billing.ping", cron="*/10 * * * *", clock=clock)
    materialize(clock)
    clock.set(at(12, 16))
    materialize(clock)
    assert occurrence(schedule, at(12, 10)).state == "SCHEDULED"

    api.update_schedule(schedule.id, clock=clock, priority=5)
    materialize(clock)

    assert runs_by_time(schedule)[at(12, 10)] == [(2, "SCHEDULED")]
    run(occurrence(schedule, at(12, 10), version=2), clock)
    advance_to(clock, materialize, at(12, 20, 30))
    assert [v for v, _ in runs_by_time(schedule)[at(12, 20)]] == [2]
    assert_reconciles(schedule, at(12, 0), at(12, 21), now=clock.now())


def test_pause_resume_does_not_rerun_what_ran(
    materialize: Callable[[FrozenClock], None],
) -> None:
    clock = FrozenClock(at(11, 59))
    schedule = issue_scenario(clock, materialize)

    api.pause_schedule(schedule.id, clock=clock)
    resumed = api.resume_schedule(schedule.id, clock=clock)
    materialize(clock)
    advance_to(clock, materialize, at(12, 5, 30))

    assert resumed.version == 3
    rows = runs_by_time(schedule)
    assert rows.get(at(12, 0)) is None
    assert rows[at(12, 1)] == [(1, "SUCCEEDED")]
    assert rows[at(12, 2)] == [(1, "SUCCEEDED")]
    assert rows[at(12, 3)] == [(3, "SCHEDULED")]
    assert_reconciles(schedule, at(11, 59), at(12, 6), now=clock.now())


def test_pause_resume_with_fire_once_skips_a_latest_time_that_already_ran(
    materialize: Callable[[FrozenClock], None],
) -> None:
    """The misfire policy's pick may have run already: it is not run a second time."""
    clock = FrozenClock(at(11, 59, 30))
    schedule = api.create_schedule(
        name="r", task="billing.ping", cron="* * * * *", misfire_policy="FIRE_ONCE", clock=clock
    )
    materialize(clock)
    clock.set(at(12, 1))
    materialize(clock)
    run(occurrence(schedule, at(12, 1)), clock)  # 12:00 still undelivered
    clock.set(at(12, 1, 30))
    materialize(clock)

    api.pause_schedule(schedule.id, clock=clock)
    clock.set(at(12, 1, 40))
    api.resume_schedule(schedule.id, clock=clock)
    materialize(clock)
    advance_to(clock, materialize, at(12, 3, 40))

    rows = runs_by_time(schedule)
    assert rows[at(12, 1)] == [(1, "SUCCEEDED")]
    assert all(len(v) == 1 for v in rows.values()), rows
    assert [v for v, _ in rows[at(12, 2)]] == [3]
    assert_reconciles(schedule, at(11, 59), at(12, 4), now=clock.now())


def test_beat_schedule_sync_does_not_rerun_what_ran(
    materialize: Callable[[FrozenClock], None],
) -> None:
    from celery.schedules import crontab

    clock = FrozenClock(at(11, 59, 30))
    entry: dict[str, Any] = {"task": "billing.ping", "schedule": crontab()}
    beat_schedule.sync_beat_schedule({"ping": entry}, clock=clock)
    schedule = Schedule.objects.get(idempotency_key="beat:ping")
    materialize(clock)
    clock.set(at(12, 0))
    materialize(clock)
    run(occurrence(schedule, at(12, 0)), clock, "RETRY_WAIT")
    for minute in (1, 2):
        clock.set(at(12, minute))
        materialize(clock)
        run(occurrence(schedule, at(12, minute)), clock)
    clock.set(at(12, 2, 30))
    materialize(clock)

    report = beat_schedule.sync_beat_schedule({"ping": {**entry, "args": [1]}}, clock=clock)
    materialize(clock)
    advance_to(clock, materialize, at(12, 5, 30))

    assert report.updated == ["ping"]
    rows = runs_by_time(schedule)
    assert rows.get(at(12, 0)) is None
    assert rows[at(12, 1)] == [(1, "SUCCEEDED")]
    assert rows[at(12, 2)] == [(1, "SUCCEEDED")]
    assert rows[at(12, 3)] == [(2, "SCHEDULED")]
    assert_reconciles(schedule, at(11, 59), at(12, 6), now=clock.now())


def test_resume_in_the_same_second_plans_the_next_run_again(
    materialize: Callable[[FrozenClock], None],
) -> None:
    """Hole 9: paused at 15:45:31 and resumed in the same second, 15:46 must still run."""
    clock = FrozenClock(datetime(2026, 3, 1, 15, 44, 10, tzinfo=UTC))
    schedule = api.create_schedule(name="r", task="billing.ping", cron="* * * * *", clock=clock)
    materialize(clock)
    clock.set(datetime(2026, 3, 1, 15, 45, 31, tzinfo=UTC))
    materialize(clock)  # 15:46 is inside the horizon: materialized under v1
    assert occurrence(schedule, at(15, 46)).state == "SCHEDULED"

    api.pause_schedule(schedule.id, clock=clock)
    resumed = api.resume_schedule(schedule.id, clock=clock)

    assert resumed.schedule.next_run_at == at(15, 46)
    materialize(clock)
    advance_to(clock, materialize, at(15, 48, 31))
    rows = runs_by_time(schedule)
    assert rows[at(15, 46)] == [(3, "SCHEDULED")]
    assert_reconciles(schedule, at(15, 44), at(15, 49), now=clock.now())


def test_replanned_late_catch_up_time_takes_the_tenants_catch_up_budget(
    materialize: Callable[[FrozenClock], None], tenant_factory: Callable[..., Any]
) -> None:
    """The re-planned span is written by the lifecycle call itself: its late CATCH_UP times
    are paced by the tenant's shared catch-up budget like the materializer's."""
    tenant = tenant_factory("paced", catchup_rate=1)
    clock = FrozenClock(at(11, 59, 30))
    schedule = api.create_schedule(
        name="r", task="billing.ping", cron="* * * * *", tenant=tenant, clock=clock,
        misfire_policy="CATCH_UP", catchup_cap=5, max_lateness=30,
    )  # fmt: skip
    materialize(clock)
    clock.set(at(12, 1))
    materialize(clock)
    run(occurrence(schedule, at(12, 1)), clock)  # 12:00 still undelivered
    clock.set(at(12, 1, 30))
    materialize(clock)

    api.update_schedule(schedule.id, clock=clock, args=[7])

    replanned = occurrence(schedule, at(12, 0), version=2)  # 90 s late: paced
    assert (replanned.schedule_version, replanned.state) == (2, "SCHEDULED")
    assert replanned.available_at == clock.now()
    # ... and its slot is the tenant's: the next late release waits a minute (rate 1/min).
    from django_app.models import TenantBudget

    slot = TenantBudget.objects.get(tenant=tenant, kind=TenantBudget.CATCHUP)
    assert slot.at == clock.now() + MINUTE
    materialize(clock)
    advance_to(clock, materialize, at(12, 3, 30))
    rows = runs_by_time(schedule)
    assert rows[at(12, 1)] == [(1, "SUCCEEDED")]
    assert all(len(v) == 1 for v in rows.values()), rows
    assert_reconciles(schedule, at(11, 59), at(12, 4), now=clock.now())


def test_a_paused_schedules_new_expression_applies_from_the_update_on() -> None:
    """Hourly at :00, paused at 10:30 (its cursor 11:00); at 12:20 the expression becomes
    :30; resumed at 12:40 with CATCH_UP. The new expression's times before the update
    (11:30) were never this schedule's: only 12:30 is caught up, then 13:30."""
    t = datetime(2026, 3, 1, 10, 0, 30, tzinfo=UTC)
    clock = FrozenClock(t)
    s = api.create_schedule(name="r", task="billing.ping", cron="0 * * * *",
                            misfire_policy="CATCH_UP", clock=clock)  # fmt: skip
    clock.set(t.replace(minute=30))
    api.pause_schedule(s.id, clock=clock)
    clock.set(t.replace(hour=12, minute=20))
    api.update_schedule(s.id, cron="30 * * * *", clock=clock)
    clock.set(t.replace(hour=12, minute=40))
    api.resume_schedule(s.id, clock=clock)
    for _ in range(60):
        materialize_due(clock=clock, horizon=timedelta(0))
        clock.advance(60)
    planned = Occurrence.objects.filter(schedule_id=s.id, state="SCHEDULED")
    assert sorted(planned.values_list("scheduled_for", flat=True)) == [
        datetime(2026, 3, 1, 12, 30, tzinfo=UTC),
        datetime(2026, 3, 1, 13, 30, tzinfo=UTC),
    ]
