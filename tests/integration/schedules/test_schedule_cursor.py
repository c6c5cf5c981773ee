"""Every schedule has one cursor row (ScheduleCursor), and it says what the schedule says.

The cursor row copies the schedule's shard, version and whether it is ACTIVE, and holds
``next_run_at``; the materializer reads and moves only that row. Whatever writes a schedule
(each lifecycle verb, the bulk paths, the materializer, the worker's run limit, a reshard)
keeps the copies in step: checked here after each of them, on a frozen clock.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from celery_scheduler import api
from celery_scheduler.core.clock import FrozenClock
from django_app.models import Schedule, ScheduleCursor
from django_app.wiring import materialize_due

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


def assert_cursors_mirror_schedules() -> None:
    schedules = {
        s.id: (s.shard, s.version, s.state == "ACTIVE") for s in Schedule.objects.order_by()
    }
    cursors = {c.schedule_id: (c.shard, c.version, c.active) for c in ScheduleCursor.objects.all()}
    assert cursors == schedules
    for schedule in Schedule.objects.select_related("cursor"):
        # An ended schedule has no cursor; a live one keeps it (a paused one too).
        if schedule.state in ("COMPLETED", "CANCELED"):
            assert schedule.next_run_at is None, schedule.state


def test_cursor_row_follows_every_writer() -> None:
    clock = FrozenClock(NOW)
    spec: dict[str, Any] = {"task": "billing.ping", "cron": "*/5 * * * *"}
    one = api.create_schedule(name="one", clock=clock, **spec)
    many = api.create_schedules(
        [{"name": f"m{i}", "max_runs": 1, **spec} for i in range(3)]
        + [{"name": "once", "task": "billing.ping", "run_at": NOW + MINUTE}],
        clock=clock,
    )
    assert_cursors_mirror_schedules()
    assert Schedule.objects.get(pk=one.id).next_run_at == datetime(2026, 3, 1, 12, 5, tzinfo=UTC)

    api.update_schedule(one.id, cron="*/10 * * * *", clock=clock)
    assert_cursors_mirror_schedules()
    assert ScheduleCursor.objects.get(pk=one.id).next_run_at == datetime(
        2026, 3, 1, 12, 10, tzinfo=UTC
    )
    api.update_schedule(one.id, queue="slow", clock=clock)  # not the timing: a new version
    assert_cursors_mirror_schedules()

    api.pause_schedule(one.id, clock=clock)
    assert_cursors_mirror_schedules()
    assert ScheduleCursor.objects.get(pk=one.id).next_run_at is not None  # kept while paused
    api.resume_schedule(one.id, clock=clock)
    assert_cursors_mirror_schedules()
    api.skip_occurrence(one.id, clock=clock)
    assert_cursors_mirror_schedules()

    api.bulk_pause(name_contains="m", clock=clock)
    assert_cursors_mirror_schedules()
    api.bulk_resume(name_contains="m", clock=clock)
    assert_cursors_mirror_schedules()

    # The one-off's only time is planned: the schedule COMPLETES and its cursor ends.
    clock.advance(2 * MINUTE)
    materialize_due(clock=clock, horizon=10 * MINUTE)
    assert_cursors_mirror_schedules()
    once = Schedule.objects.get(name="once")
    assert (once.state, once.next_run_at) == ("COMPLETED", None)

    api.cancel_schedule(many.schedule_ids[0], clock=clock)
    api.bulk_cancel(name_contains="m", clock=clock)
    assert_cursors_mirror_schedules()

    Schedule.objects.filter(pk=one.id).update(shard=7)  # what a reshard writes
    assert_cursors_mirror_schedules()


def test_list_filters_and_order_read_the_cursor_row() -> None:
    clock = FrozenClock(NOW)
    made = [
        api.create_schedule(name=f"s{i}", task="billing.ping", run_at=NOW + (i + 1) * MINUTE,
                            clock=clock)
        for i in range(4)
    ]  # fmt: skip
    page = api.list_schedules(next_run_before=NOW + 3 * MINUTE)
    assert {s.id for s in page.items} == {made[0].id, made[1].id}
    page = api.list_schedules(next_run_after=NOW + 3 * MINUTE)
    assert {s.id for s in page.items} == {made[2].id, made[3].id}
    assert [s.next_run_at for s in page.items] == [NOW + 3 * MINUTE, NOW + 4 * MINUTE] or [
        s.next_run_at for s in page.items
    ] == [NOW + 4 * MINUTE, NOW + 3 * MINUTE]
    ordered = Schedule.objects.order_by("-cursor__next_run_at").values_list("name", flat=True)
    assert list(ordered) == ["s3", "s2", "s1", "s0"]


def test_an_update_of_the_cursor_copies_may_filter_on_a_missing_cursor_time() -> None:
    """The update locks the rows it reads (the schedule's: a filter on ``next_run_at=None``
    joins the cursor outer, and PostgreSQL cannot lock the nullable side of that join)."""
    clock = FrozenClock(NOW)
    s = api.create_schedule(name="once", task="billing.ping", run_at=NOW + timedelta(minutes=1),
                            clock=clock)  # fmt: skip
    ScheduleCursor.objects.filter(pk=s.id).update(next_run_at=None)
    done = Schedule.objects.filter(pk=s.id, cursor__next_run_at__isnull=True).update(
        state="COMPLETED"
    )
    assert done == 1
    assert ScheduleCursor.objects.get(pk=s.id).active is False
