"""A single create is cheap: the task modules are imported once per process, not per call,
and a create makes a fixed, small number of queries (pinned here)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from celery._state import get_current_app
from django.db import connection
from django.test.utils import CaptureQueriesContext

from celery_scheduler import api, errors
from celery_scheduler.core.clock import FrozenClock
from django_app.schedules import validation

pytestmark = pytest.mark.django_db

CLOCK = FrozenClock(datetime(2026, 3, 1, 12, 0, tzinfo=UTC))
BASE: dict[str, Any] = {"name": "n", "task": "billing.ping", "cron": "*/5 * * * *"}


@pytest.fixture
def import_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Count Celery's import_default_modules (it runs Django's system checks: ~25 ms)."""
    app = get_current_app()  # the app itself, as validation takes it (not the proxy)
    real = app.loader.import_default_modules
    calls: list[int] = []

    def counted() -> Any:
        calls.append(1)
        return real()

    monkeypatch.setattr(app.loader, "import_default_modules", counted)
    validation._imported_apps.discard(app)  # as in a fresh process
    yield calls
    validation._imported_apps.discard(app)


def test_task_modules_are_imported_once_per_process(tenant: Any, import_calls: list[int]) -> None:
    for i in range(5):
        api.create_schedule(**{**BASE, "name": f"s{i}"}, tenant="acme", clock=CLOCK)
    assert len(import_calls) == 1


def test_a_miss_imports_once_more_then_names_the_unknown_task(
    tenant: Any, import_calls: list[int]
) -> None:
    api.create_schedule(**BASE, tenant="acme", clock=CLOCK)
    with pytest.raises(errors.UnknownTask) as caught:
        api.create_schedule(**{**BASE, "task": "billing.pong"}, tenant="acme", clock=CLOCK)
    assert str(caught.value) == (
        "Task 'billing.pong' is not registered in the Celery app. Did you mean 'billing.ping'?"
    )
    assert caught.value.field == "task"
    assert len(import_calls) == 2


def test_a_task_module_imported_after_the_first_create_is_found(
    tenant: Any, import_calls: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second import (on the miss) is the one that registers the task: found."""
    app = get_current_app()  # the app itself, as validation takes it (not the proxy)
    api.create_schedule(**BASE, tenant="acme", clock=CLOCK)
    counted = app.loader.import_default_modules

    def late_task() -> None:
        pass

    def late_module() -> Any:
        app.task(name="late.module.task", shared=False)(late_task)
        return counted()

    monkeypatch.setattr(app.loader, "import_default_modules", late_module)
    try:
        created = api.create_schedule(
            **{**BASE, "task": "late.module.task"}, tenant="acme", clock=CLOCK
        )
        assert created.task == "late.module.task"
        assert len(import_calls) == 2
    finally:
        app.tasks.pop("late.module.task", None)


def _data_queries(captured: CaptureQueriesContext) -> list[str]:
    """Statements that read or write rows (transaction control is not a round trip we cut)."""
    control = ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK")
    return [q["sql"] for q in captured.captured_queries if not q["sql"].startswith(control)]


def test_a_plain_create_makes_five_queries(tenant: Any) -> None:
    """Tenant (locked), schedule, its cursor row, first version, audit entry (on PostgreSQL
    one call does all five: tests/integration/schedules/test_create_pg.py)."""
    api.create_schedule(**BASE, tenant="acme", clock=CLOCK)  # imports, default tenant etc.
    with CaptureQueriesContext(connection) as captured:
        api.create_schedule(**BASE, tenant="acme", clock=CLOCK)
    assert len(_data_queries(captured)) <= 5, _data_queries(captured)


def test_a_create_with_key_and_tags_makes_seven_queries(tenant: Any) -> None:
    """Plus the key's lookup and one insert of every tag."""
    api.create_schedule(**BASE, tenant="acme", clock=CLOCK)
    with CaptureQueriesContext(connection) as captured:
        api.create_schedule(
            **BASE, tenant="acme", clock=CLOCK, idempotency_key="k", tags={"a": "1", "b": "2"}
        )
    assert len(_data_queries(captured)) <= 7, _data_queries(captured)
    with CaptureQueriesContext(connection) as replay:
        api.create_schedule(
            **BASE, tenant="acme", clock=CLOCK, idempotency_key="k", tags={"a": "1", "b": "2"}
        )
    assert len(_data_queries(replay)) <= 3, _data_queries(replay)  # tenant, key, audit
