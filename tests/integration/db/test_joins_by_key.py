"""Reads that join attempts or outbox rows to their occurrences join on the whole key.

On the partitioned history an occurrence is unique only with its time: a join on the id
alone looks each row up in the index of every slot the retention window keeps (about 35
probes per row with 30 days kept), where the whole key reads one. The schedule's describe
(HTTP ``GET /schedules/{id}``, the CLI), the admin schedule list's row summaries and the
tenants list each had such a join.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from celery_scheduler.core.clock import FrozenClock
from django_app import tenants
from django_app.admin import schedule_summary
from django_app.models import Attempt, Occurrence, OutboxEntry
from django_app.schedules import reads
from tests.integration.worker_support import make_occurrence, make_schedule

pytestmark = [pytest.mark.django_db, pytest.mark.postgres]
OCCURRENCE = Occurrence._meta.db_table


def joins(call: Callable[[], Any], child: type[Any]) -> list[str]:
    """The statements ``call`` sends that join ``child``'s table to the occurrences."""
    with CaptureQueriesContext(connection) as captured:
        call()
    table = child._meta.db_table
    return [
        q["sql"]
        for q in captured.captured_queries
        if f'"{table}"' in q["sql"] and f'JOIN "{OCCURRENCE}"' in q["sql"]
    ]


def on_whole_key(sql: str, child: type[Any]) -> bool:
    same_time = (
        rf'"{child._meta.db_table}"\."scheduled_for" = \(?"{OCCURRENCE}"\."scheduled_for"\)?'
    )
    return re.search(same_time, sql) is not None


@pytest.mark.parametrize("read", ["describe", "admin summary", "tenants list"])
def test_the_join_names_the_occurrence_time(
    tenant: Any, frozen_clock: FrozenClock, read: str
) -> None:
    schedule = make_schedule(tenant)
    make_occurrence(schedule, frozen_clock.now())
    calls: dict[str, tuple[Callable[[], Any], type[Any]]] = {
        "describe": (lambda: reads.counters(schedule), Attempt),
        "admin summary": (lambda: schedule_summary.summarize([schedule]), Attempt),
        "tenants list": (lambda: tenants.list_tenants(now=frozen_clock.now()), OutboxEntry),
    }
    call, child = calls[read]
    statements = joins(call, child)
    assert statements, "no joined read captured"
    for sql in statements:
        assert on_whole_key(sql, child), sql
