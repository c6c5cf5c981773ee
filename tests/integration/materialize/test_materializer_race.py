"""Several nodes materializing the same schedules at once (PostgreSQL: real concurrency).

Threads with their own connections stand in for nodes; the database unique constraint and
the conditional cursor UPDATE, not Python, must leave exactly one occurrence per key.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection

from celery_scheduler.core.clock import FrozenClock
from django_app.materialize import per_schedule
from django_app.materialize.per_schedule import MaterializeReport
from django_app.models import Occurrence, OutboxEntry, Schedule, Tenant
from django_app.wiring import materialize_due
from tests.integration.materialize.test_materializer import (
    MINUTE,
    NOW,
    make_schedule,
    per_schedule_path,
)

pytestmark = [pytest.mark.concurrent_db, pytest.mark.django_db(transaction=True)]


def run_nodes(count: int, work: Callable[[], MaterializeReport]) -> list[MaterializeReport]:
    reports: list[MaterializeReport] = []
    errors: list[BaseException] = []
    start = threading.Barrier(count, timeout=30)

    def node() -> None:
        try:
            start.wait()
            reports.append(work())
        except BaseException as exc:  # re-raised in the main thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=node) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a node hung"
    if errors:
        raise errors[0]
    return reports


def assert_one_per_key(
    expected_per_schedule: int, schedules: list[Schedule], *, cursor: Any
) -> None:
    keys = Counter(
        Occurrence.objects.values_list("schedule_id", "schedule_version", "scheduled_for")
    )
    assert len(keys) == expected_per_schedule * len(schedules)
    assert set(keys.values()) == {1}
    assert OutboxEntry.objects.count() == Occurrence.objects.count()
    for s in schedules:
        s.refresh_from_db()
        assert s.next_run_at == cursor


@per_schedule_path  # the bulk path skips locked rows: no lockstep
def test_lockstep_nodes_conflict_on_the_unique_key_and_one_cursor_wins(
    tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both nodes read every schedule before either writes it: a guaranteed collision."""
    schedules = [make_schedule(tenant) for _ in range(20)]
    in_step = threading.Barrier(2, timeout=30)
    real_plan = per_schedule.plan_pass

    def plan_in_step(*args: Any, **kwargs: Any) -> Any:
        in_step.wait()  # both nodes hold the same cursor for this schedule now
        return real_plan(*args, **kwargs)

    monkeypatch.setattr(per_schedule, "plan_pass", plan_in_step)
    clock = FrozenClock(NOW)
    reports = run_nodes(2, lambda: materialize_due(clock=clock, horizon=2 * MINUTE))
    total = sum(reports, MaterializeReport())
    assert total.occurrences_created == 3 * len(schedules)
    # Each schedule: one node inserted 3 rows and moved the cursor; the other hit the
    # unique key 3 times (ON CONFLICT DO NOTHING) and then found the cursor moved.
    assert total.conflicts == 3 * len(schedules)
    assert total.stale_cursor == len(schedules)
    assert_one_per_key(3, schedules, cursor=NOW + 3 * MINUTE)


def test_free_running_nodes_leave_exactly_one_occurrence_per_key(tenant: Tenant) -> None:
    schedules = [make_schedule(tenant, next_run_at=NOW - 2 * MINUTE) for _ in range(150)]
    clock = FrozenClock(NOW)
    reports = run_nodes(
        4, lambda: materialize_due(clock=clock, horizon=timedelta(minutes=2), batch_size=25)
    )
    total = sum(reports, MaterializeReport())
    assert total.occurrences_created == 5 * len(schedules)
    assert_one_per_key(5, schedules, cursor=NOW + 3 * MINUTE)
