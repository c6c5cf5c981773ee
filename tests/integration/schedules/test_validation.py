"""Bad input gets a specific error naming the field, and nothing is written."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from celery_scheduler import api, errors
from celery_scheduler.core.clock import FrozenClock
from django_app.models import Schedule, ScheduleVersion, Tenant

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
BASE: dict[str, Any] = {"name": "n", "task": "billing.ping", "cron": "* * * * *"}


@pytest.mark.parametrize(
    ("overrides", "error", "field", "message"),
    [
        ({"cron": "61 * * * *"}, errors.InvalidCronExpression, "cron", "minute"),
        ({"cron": "* * * *"}, errors.InvalidCronExpression, "cron", "expected five"),
        ({"cron": "0 0 30 2 *"}, errors.CronNeverFires, "cron", "never fires"),
        ({"timezone": "Europe/Berln"}, errors.UnknownTimeZone, "timezone", "Europe/Berlin"),
        ({"task": "billing.pong"}, errors.UnknownTask, "task", "billing.ping"),
        ({"task": ""}, errors.ValidationError, "task", "required"),
        ({"args": "[1]"}, errors.InvalidArguments, "args", "list"),
        ({"args": [{1, 2}]}, errors.InvalidArguments, "args", "JSON"),
        ({"kwargs": [1]}, errors.InvalidArguments, "kwargs", "object"),
        ({"kwargs": {"x": float("nan")}}, errors.InvalidArguments, "kwargs", "JSON"),
        # JSON keys are text: a nested 1 beside "a" made the content hash raise TypeError.
        ({"kwargs": {"x": {1: 2, "a": 3}}}, errors.InvalidArguments, "kwargs", "must be text"),
        ({"args": [{1: "a", "1": "b"}]}, errors.InvalidArguments, "args", "must be text"),
        # An int past 4,300 digits cannot be printed whole in the message.
        ({"priority": 10**5000}, errors.InvalidPolicy, "priority", "too large to print"),
        ({"misfire_policy": "SOMETIMES"}, errors.InvalidPolicy, "misfire_policy", "CATCH_UP"),
        ({"overlap_policy": "REPLACE"}, errors.InvalidPolicy, "overlap_policy", "QUEUE_ONE"),
        ({"flexible_window": -5}, errors.InvalidPolicy, "flexible_window", "between"),
        ({"flexible_window": 10**9}, errors.InvalidPolicy, "flexible_window", "between"),
        ({"catchup_cap": -1}, errors.InvalidPolicy, "catchup_cap", "between"),
        ({"catchup_cap": 10**7}, errors.InvalidPolicy, "catchup_cap", "between"),
        (
            {"misfire_policy": "CATCH_UP", "catchup_cap": 0},
            errors.InvalidPolicy,
            "catchup_cap",
            ">= 1",
        ),
        ({"max_lateness": -1}, errors.InvalidPolicy, "max_lateness", "between"),
        ({"concurrency_limit": 0}, errors.InvalidPolicy, "concurrency_limit", "between"),
        # A schedule without a group takes slots under "schedule:<its id>".
        (
            {"concurrency_group": "schedule:8e0f5a1c-0000-4000-8000-000000000000"},
            errors.InvalidPolicy,
            "concurrency_group",
            "own slots",
        ),
        ({"max_attempts": 0}, errors.InvalidPolicy, "max_attempts", "between"),
        ({"interval": 30}, errors.InvalidTiming, "interval", "exactly one"),
        ({"cron": None}, errors.InvalidTiming, "cron", "exactly one"),
        (
            {"cron": None, "run_at": NOW - timedelta(hours=2)},
            errors.InvalidTiming,
            "run_at",
            "past",
        ),
        (
            {"cron": None, "run_at": datetime(2026, 3, 2, 12, 0)},
            errors.InvalidTiming,
            "run_at",
            "time zone",
        ),
        (
            {"start_at": NOW + timedelta(days=2), "end_at": NOW + timedelta(days=1)},
            errors.InvalidTiming,
            "end_at",
            "after start_at",
        ),
        (
            {"cron": "0 0 1 1 *", "end_at": NOW + timedelta(days=2)},
            errors.InvalidTiming,
            "end_at",
            "never fires",
        ),
        ({"tenant": "nobody"}, errors.ValidationError, "tenant", "Unknown tenant"),
    ],
)
def test_rejected_with_precise_error_and_nothing_written(
    overrides: dict[str, Any], error: type[Exception], field: str, message: str
) -> None:
    values = {**BASE, **overrides}
    with pytest.raises(error, match=message) as info:
        api.create_schedule(clock=FrozenClock(NOW), **values)
    assert getattr(info.value, "field", None) == field
    assert Schedule.objects.count() == 0
    assert ScheduleVersion.objects.count() == 0
    assert not Tenant.objects.exclude(slug="default").exists()


def test_every_validation_error_is_a_scheduler_error() -> None:
    assert issubclass(errors.InvalidCronExpression, errors.SchedulerError)
    assert issubclass(errors.UnknownTimeZone, ValueError)


def test_a_tenant_slug_that_cannot_be_stored_is_a_validation_error() -> None:
    """A lone surrogate reached the lookup, which raised UnicodeEncodeError (the CLI's
    `schedules list --tenant $'\\xff'` printed a traceback)."""
    with pytest.raises(errors.ValidationError) as refused:
        api.list_schedules(tenant="\udcff")
    assert refused.value.field == "tenant"
