"""The public lifecycle API.

Every function here but :func:`preview` is one database transaction and needs Django set
up. They are implemented by :mod:`django_app.api`, imported on the first call (the one place
this package reaches into ``django_app``), so importing this module stays cheap and
Django-free and ``from celery_scheduler.api import create_schedule`` works before Django is
set up. Validation errors are ``celery_scheduler.errors.ValidationError`` subclasses
whose ``field`` attribute names the bad argument; nothing is written when one is raised.

Example::

    from celery_scheduler import api

    schedule = api.create_schedule(
        name="nightly invoices", task="billing.create_invoices",
        cron="0 2 * * *", timezone="Europe/Berlin",
        misfire_policy="FIRE_ONCE", overlap_policy="SKIP_IF_RUNNING",
        idempotency_key="nightly-invoices",
    )
    api.pause_schedule(schedule.id).describe()
    # 'nightly invoices: paused (version 2), 1 pending occurrence invalidated'
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import datetime, timedelta
from types import ModuleType
from typing import TYPE_CHECKING, Any

from celery_scheduler import errors
from celery_scheduler.api_types import Seconds
from celery_scheduler.core import timemath
from celery_scheduler.core.clock import SYSTEM_CLOCK, Clock
from celery_scheduler.core.enums import ScheduleKind

if TYPE_CHECKING:
    from django_app.api import (
        backfill,
        bulk_cancel,
        bulk_pause,
        bulk_resume,
        cancel_schedule,
        create_schedule,
        create_schedules,
        create_tenant,
        describe_schedule,
        get_tenant,
        list_schedules,
        list_tenants,
        pause_schedule,
        replay_occurrence,
        resume_schedule,
        run_now,
        skip_occurrence,
        sync_schedules,
        update_schedule,
        update_tenant,
    )

__all__ = [
    "backfill",
    "bulk_cancel",
    "bulk_pause",
    "bulk_resume",
    "cancel_schedule",
    "create_schedule",
    "create_schedules",
    "create_tenant",
    "describe_schedule",
    "get_tenant",
    "list_schedules",
    "list_tenants",
    "pause_schedule",
    "preview",
    "replay_occurrence",
    "resume_schedule",
    "run_now",
    "skip_occurrence",
    "sync_schedules",
    "update_schedule",
    "update_tenant",
]


@functools.cache
def _implementation() -> ModuleType:
    # deferred (facade): the Django side loads on the first call, never at import
    import django_app.api

    return django_app.api


def _delegate(name: str) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(_implementation(), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__module__ = __name__
    call.__doc__ = f"See :func:`django_app.api.{name}` (its signature and errors)."
    return call


if not TYPE_CHECKING:  # mypy reads the real signatures from django_app.api above
    backfill = _delegate("backfill")
    bulk_cancel = _delegate("bulk_cancel")
    bulk_pause = _delegate("bulk_pause")
    bulk_resume = _delegate("bulk_resume")
    cancel_schedule = _delegate("cancel_schedule")
    create_schedule = _delegate("create_schedule")
    create_schedules = _delegate("create_schedules")
    create_tenant = _delegate("create_tenant")
    describe_schedule = _delegate("describe_schedule")
    get_tenant = _delegate("get_tenant")
    list_schedules = _delegate("list_schedules")
    list_tenants = _delegate("list_tenants")
    pause_schedule = _delegate("pause_schedule")
    replay_occurrence = _delegate("replay_occurrence")
    resume_schedule = _delegate("resume_schedule")
    run_now = _delegate("run_now")
    skip_occurrence = _delegate("skip_occurrence")
    sync_schedules = _delegate("sync_schedules")
    update_schedule = _delegate("update_schedule")
    update_tenant = _delegate("update_tenant")


def preview(
    *,
    cron: str | None = None,
    timezone: str = "UTC",
    dst_gap: str = "SKIP",
    dst_fold: str = "FIRST",
    interval: Seconds | None = None,
    run_at: datetime | None = None,
    start: datetime | None = None,
    count: int = 10,
    clock: Clock | None = None,
) -> list[timemath.PreviewRow]:
    """The next ``count`` fire times (UTC and local, DST notes) without creating anything.

    Pure: needs no database. Raises the same validation errors as ``create_schedule``;
    ``dst_gap`` and ``dst_fold`` are the cron's DST policy (the row of a shifted or doubled
    run says which policy made it).
    """
    start = timemath.check_instant(start or (clock or SYSTEM_CLOCK).now(), "start")
    trigger: timemath.Trigger
    # Present means "given" (not None, not ""): interval=0 is a bad interval, not a missing one.
    given = [
        n
        for n, v in (("cron", cron), ("interval", interval), ("run_at", run_at))
        if v is not None and v != ""
    ]
    if len(given) != 1:
        raise errors.InvalidTiming(
            "give exactly one of cron, interval or run_at",
            field=given[1] if len(given) > 1 else "cron",
        )
    gap, fold = timemath.dst_policy(dst_gap, dst_fold, cron=given == ["cron"])
    if given == ["cron"]:
        trigger = timemath.trigger_of(
            ScheduleKind.CRON, cron=cron, timezone=timezone, dst_gap=gap, dst_fold=fold
        )
    elif given == ["interval"]:
        every = timemath.parse_interval(interval)
        trigger = timemath.trigger_of(ScheduleKind.INTERVAL, every=every, anchor=start)
    else:
        assert run_at is not None
        instant = timemath.check_instant(run_at, "run_at")
        trigger = timemath.trigger_of(ScheduleKind.ONE_OFF, run_at=instant)
    # Include `start` itself so a preview that starts on a fire time shows it.
    return timemath.preview(trigger, start=start - timedelta(microseconds=1), count=count)
