"""Sync Celery's static ``beat_schedule`` into Schedules, so existing projects keep their config.

Each entry becomes one schedule in the default tenant with idempotency key
``beat:<entry name>`` and ``source="beat"``: creating it is idempotent, so any number of beat
processes may sync at start. A changed entry is applied with ``update_schedule`` (a new
version) under the schedule's row lock, so two beats syncing the same change bump the
version once. An entry removed from the config is reported (``orphaned``), not canceled:
stop it from the admin, where the decision is visible.

Conversions: ``crontab`` -> cron string read in the app's timezone, firing where Celery
runs it (:func:`crontab_expression`; both day fields restricted is refused); ``timedelta``,
a number of seconds or ``schedule(run_every=...)`` -> interval. ``solar`` and custom
schedule classes raise :class:`celery_scheduler.errors.UnsupportedSchedule`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from celery.schedules import crontab, solar
from celery.schedules import schedule as every_schedule
from django.db import transaction

from celery_scheduler import errors
from celery_scheduler.core import timemath
from celery_scheduler.core.clock import Clock
from celery_scheduler.core.enums import ScheduleKind, ScheduleState
from django_app.models import Schedule
from django_app.schedules import audited, lifecycle

logger = logging.getLogger(__name__)

KEY_PREFIX = "beat:"
SOURCE = "beat"
#: The fields a beat entry defines; anything else (policies set in the admin) is left alone.
_ENTRY_FIELDS = ("task", "args", "kwargs", "queue", "priority", "kind", "cron", "timezone",
                 "interval_seconds")  # fmt: skip


@dataclass(kw_only=True)
class SyncReport:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    #: Entry name -> why it was not synced (unsupported schedule, unknown task...).
    failed: dict[str, str] = field(default_factory=dict)
    #: Names of beat-sourced schedules no longer in the config (left as they are).
    orphaned: list[str] = field(default_factory=list)


def _cron_field(value: Any) -> str:
    if isinstance(value, str | int):
        return str(value)
    if isinstance(value, Iterable):  # crontab also accepts sets/ranges of ints
        return ",".join(str(v) for v in sorted(value))
    return str(value)


def _interval_seconds(every: timedelta | float, name: str) -> int:
    seconds = every.total_seconds() if isinstance(every, timedelta) else float(every)
    if seconds < 1 or seconds != int(seconds):
        raise errors.UnsupportedSchedule(
            f"beat entry {name!r}: interval {seconds} s is not a whole number of seconds >= 1",
            field="schedule",
        )
    return int(seconds)


_CRONTAB_PARTS = ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")
#: Every value of each field, as the cron parser reads "*" (Celery's full sets are the same).
_EVERY = timemath.cron_fields("* * * * *")


def crontab_expression(label: str, schedule: crontab) -> str:
    """The cron expression that fires when Celery's ``crontab`` does, or raise (``label``
    names what has it in the message).

    Each field as the user wrote it ("*/15", "mon-fri") where cron reads it alike, else
    (a range that wraps, "22-2") the values Celery parsed, listed; an unrestricted one "*".
    Celery runs on the days that match both day fields; cron does too when one of them
    starts with "*" (Vixie's rule), and on the days that match either otherwise.
    """
    parsed = [frozenset(getattr(schedule, part)) for part in _CRONTAB_PARTS]
    tokens = [
        _field_token(index, _cron_field(getattr(schedule, f"_orig_{part}")), parsed[index])
        for index, part in enumerate(_CRONTAB_PARTS)
    ]
    days_both = parsed[2] != _EVERY[2] and parsed[4] != _EVERY[4]
    if days_both and not (tokens[2].startswith("*") or tokens[4].startswith("*")):
        raise errors.UnsupportedSchedule(
            f"{label}: its crontab restricts both day_of_month and day_of_week; "
            "Celery runs it only on days that match both, cron (and celery-scheduler) on "
            "days that match either, so it would run on other days than it does now. "
            "Restrict one of the two fields (and check the other in the task), or create "
            "the schedule with the cron you mean",
            field="schedule",
        )
    return " ".join(tokens)


def _field_token(index: int, written: str, values: frozenset[int]) -> str:
    """Field ``index`` of the expression: "*" when it allows every value (a day field
    written "1-31" would count as restricted to Vixie's day rule), ``written`` if cron reads
    it as ``values``, else the values listed."""
    if values == _EVERY[index]:
        return "*"
    probe = ["*"] * len(_CRONTAB_PARTS)
    probe[index] = written
    try:
        if timemath.cron_fields(" ".join(probe))[index] == values:
            return written
    except errors.ValidationError:
        pass
    return ",".join(str(v) for v in sorted(values))


def _plain(value: Any) -> Any:
    """``value`` as it reads back from JSON: tuples become lists, at every level."""
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def schedule_fields(name: str, schedule: Any, *, timezone: str) -> dict[str, Any]:
    """``create_schedule`` timing arguments for a Celery schedule object, or raise."""
    if isinstance(schedule, solar):
        raise errors.UnsupportedSchedule(
            f"beat entry {name!r} uses a solar schedule ({schedule.event} at "
            f"{schedule.lat}, {schedule.lon}), which celery-scheduler does not support; "
            "replace it with a crontab in the local time zone",
            field="schedule",
        )
    if isinstance(schedule, crontab):
        return {"cron": crontab_expression(f"beat entry {name!r}", schedule), "timezone": timezone}
    if isinstance(schedule, every_schedule):
        return {"interval": _interval_seconds(getattr(schedule, "run_every"), name)}  # noqa: B009
    if isinstance(schedule, timedelta | int | float) and not isinstance(schedule, bool):
        return {"interval": _interval_seconds(schedule, name)}
    raise errors.UnsupportedSchedule(
        f"beat entry {name!r}: schedule type {type(schedule).__name__} is not supported; "
        "use crontab, timedelta or a number of seconds",
        field="schedule",
    )


#: Entry options a schedule carries; the others are named in a warning at each sync.
CARRIED_OPTIONS = frozenset({"queue", "priority"})


def entry_values(name: str, entry: Mapping[str, Any], *, timezone: str) -> dict[str, Any]:
    """``create_schedule`` keyword arguments for one ``beat_schedule`` entry."""
    options = dict(entry.get("options") or {})
    dropped = sorted(set(options) - CARRIED_OPTIONS)
    if dropped:
        logger.warning(
            "beat_schedule entry %r: options %s are not carried over (a schedule takes queue "
            "and priority; bound a late run with the schedule's deadline_seconds instead of "
            "expires, route with the task's own options or task_routes)",
            name,
            ", ".join(dropped),
        )
    queue = options.get("queue") or ""
    return {
        "name": name,
        "task": entry["task"],
        # As stored (JSON): an inner tuple kept as such would differ from its stored list
        # at every sync, and each sync would make a new version.
        "args": _plain(list(entry.get("args") or ())),
        "kwargs": _plain(dict(entry.get("kwargs") or {})),
        "queue": getattr(queue, "name", queue),
        "priority": int(options.get("priority") or 0),
        **schedule_fields(name, entry["schedule"], timezone=timezone),
    }


def _desired_columns(values: Mapping[str, Any]) -> dict[str, Any]:
    if "cron" in values:
        timing = {"kind": ScheduleKind.CRON.value, "cron": values["cron"],
                  "timezone": values["timezone"], "interval_seconds": None}  # fmt: skip
    else:
        timing = {"kind": ScheduleKind.INTERVAL.value, "cron": "",
                  "interval_seconds": values["interval"]}  # fmt: skip
    return {
        **{k: values[k] for k in ("task", "args", "kwargs", "queue", "priority")},
        **timing,
    }


def _changes(schedule: Schedule, values: Mapping[str, Any]) -> dict[str, Any]:
    """The update_schedule arguments that would bring ``schedule`` to ``values``."""
    desired = _desired_columns(values)
    differs = [k for k in _ENTRY_FIELDS if k in desired and getattr(schedule, k) != desired[k]]
    if not differs:
        return {}
    changes = {k: values[k] for k in ("task", "args", "kwargs", "queue", "priority")}
    timing = {"kind", "cron", "timezone", "interval_seconds"}
    if timing & set(differs):
        changes.update({k: values[k] for k in ("cron", "timezone", "interval") if k in values})
    return changes


#: Who the audit trail names for what the sync of Celery's beat_schedule writes.
ACTOR = "beat_schedule"


def sync_entry(
    name: str, entry: Mapping[str, Any], *, timezone: str, clock: Clock | None = None
) -> str:
    """Create or update one entry's schedule; returns ``created``/``updated``/``unchanged``."""
    values = entry_values(name, entry, timezone=timezone)
    tenant = lifecycle.resolve_tenant(None)
    key = KEY_PREFIX + name
    with transaction.atomic():
        existing = Schedule.objects.select_for_update().filter(tenant=tenant, idempotency_key=key)
        schedule = existing.first()
        if schedule is None:
            lifecycle.create_schedule(
                tenant=tenant, idempotency_key=key, clock=clock, source=SOURCE,
                audited_by=(ACTOR, ""), **values,
            )  # fmt: skip
            return "created"
        if schedule.state in (ScheduleState.CANCELED, ScheduleState.COMPLETED):
            return "unchanged"  # stopped on purpose (admin); the config does not resurrect it
        changes = _changes(schedule, values)
        if not changes:
            return "unchanged"
        audited.update_schedule(schedule.id, actor=ACTOR, clock=clock, **changes)
        return "updated"


def sync_beat_schedule(
    beat_schedule: Mapping[str, Mapping[str, Any]],
    *,
    timezone: str = "UTC",
    clock: Clock | None = None,
) -> SyncReport:
    """Sync every entry; one failing entry is reported and does not stop the others.

    Database errors propagate (the caller retries the whole sync later).
    """
    report = SyncReport()
    for name, entry in beat_schedule.items():
        try:
            outcome = sync_entry(name, entry, timezone=timezone, clock=clock)
        except (errors.ValidationError, errors.IdempotencyConflict, KeyError) as exc:
            message = f"missing {exc}" if isinstance(exc, KeyError) else str(exc)
            report.failed[name] = message
            logger.error("beat_schedule entry %r not synced: %s", name, message)
            continue
        getattr(report, outcome).append(name)
    known = {KEY_PREFIX + name for name in beat_schedule}
    report.orphaned = sorted(
        Schedule.objects.live()
        .filter(source=SOURCE, idempotency_key__startswith=KEY_PREFIX)
        .exclude(idempotency_key__in=known)
        .values_list("name", flat=True)
    )
    if report.orphaned:
        logger.warning(
            "schedules from beat_schedule entries no longer configured (still active; stop "
            "them in the admin if intended): %s",
            ", ".join(report.orphaned),
        )
    return report


def sync_app(app: Any, *, clock: Clock | None = None) -> SyncReport:
    """Sync ``app.conf.beat_schedule`` read in the app's timezone."""
    timezone = str(app.conf.timezone or "UTC")
    return sync_beat_schedule(app.conf.beat_schedule or {}, timezone=timezone, clock=clock)
