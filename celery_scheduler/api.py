"""The public lifecycle API.

Every function here is one database transaction and needs Django set up (it delegates to
``django_app.lifecycle``, imported lazily so that importing this module stays cheap and
Django-free). Validation errors are ``celery_scheduler.errors.ValidationError`` subclasses
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

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from celery_scheduler import errors
from celery_scheduler.core import timemath
from celery_scheduler.core.clock import SYSTEM_CLOCK, Clock

if TYPE_CHECKING:
    from django_app.lifecycle import LifecycleResult
    from django_app.models import Occurrence, Schedule, Tenant

__all__ = [
    "cancel_schedule",
    "create_schedule",
    "pause_schedule",
    "preview",
    "replay_occurrence",
    "resume_schedule",
    "run_now",
    "update_schedule",
]

Seconds = int | timedelta


def create_schedule(
    *,
    name: str,
    task: str,
    tenant: Tenant | str | None = None,
    cron: str | None = None,
    timezone: str = "UTC",
    interval: Seconds | None = None,
    run_at: datetime | None = None,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    queue: str = "",
    priority: int = 0,
    misfire_policy: str = "SKIP",
    max_lateness: Seconds | None = None,
    catchup_cap: int | None = None,
    overlap_policy: str = "ALLOW",
    flexible_window: Seconds = 0,
    concurrency_limit: int | None = None,
    concurrency_group: str = "",
    max_attempts: int | None = None,
    deadline: Seconds | None = None,
    start_at: datetime | None = None,
    end_at: datetime | None = None,
    idempotency_key: str | None = None,
    actor: str | None = None,
    reason: str | None = None,
    clock: Clock | None = None,
) -> Schedule:
    """Create a schedule. Give exactly one of ``cron`` (+ ``timezone``), ``interval``, ``run_at``.

    Args:
        name: Label shown in the admin.
        task: A task name registered in the Celery app.
        tenant: Tenant or its slug; default: the ``default_tenant`` setting.
        cron: Five-field cron or a macro (``@hourly``...), read in ``timezone``.
        interval: Fixed rate (seconds or timedelta) from ``start_at`` (default: now).
        run_at: One-off instant (aware datetime).
        misfire_policy: ``SKIP``, ``FIRE_ONCE`` or ``CATCH_UP`` (see README, "Misfire").
        max_lateness: How late (seconds) a fire time may still run; later ones misfire.
        catchup_cap: How many late fire times ``CATCH_UP`` runs at most.
        overlap_policy: ``ALLOW``, ``SKIP_IF_RUNNING`` or ``QUEUE_ONE``.
        flexible_window: Spread each run over this many seconds (deterministic jitter).
        concurrency_limit: At most this many RUNNING at once across all workers.
        concurrency_group: Share the limit with the tenant's other schedules under this name
            (names are per tenant: another tenant's group of the same name is separate).
        max_attempts: Attempts before an occurrence goes DEAD (default: setting).
        deadline: Seconds after scheduled_for after which no retry is made.
        idempotency_key: The same key returns the same schedule; different content with
            the same key raises ``IdempotencyConflict``.
        actor, reason: Who makes the call and why, for the audit trail (every lifecycle
            call here takes them; see README, "Audit trail").

    Raises:
        celery_scheduler.errors.ValidationError: a subclass naming the bad field.
        celery_scheduler.errors.IdempotencyConflict: key reused with other content.
        celery_scheduler.errors.QuotaExceeded: the tenant's schedule quota is used up.
    """
    from django_app import audit, lifecycle

    who, why = audit.check(actor, reason)
    schedule = lifecycle.create_schedule(
        tenant=tenant, idempotency_key=idempotency_key, clock=clock,
        name=name, task=task, cron=cron, timezone=timezone, interval=interval, run_at=run_at,
        args=args, kwargs=kwargs, queue=queue, priority=priority,
        misfire_policy=misfire_policy, max_lateness=max_lateness, catchup_cap=catchup_cap,
        overlap_policy=overlap_policy, flexible_window=flexible_window,
        concurrency_limit=concurrency_limit, concurrency_group=concurrency_group,
        max_attempts=max_attempts, deadline=deadline, start_at=start_at, end_at=end_at,
    )  # fmt: skip
    audit.record("create", schedule=schedule, actor=who, reason=why, clock=clock)
    return schedule


def update_schedule(
    schedule_id: uuid.UUID | str,
    *,
    expected_version: int | None = None,
    actor: str | None = None,
    reason: str | None = None,
    clock: Clock | None = None,
    **changes: Any,
) -> LifecycleResult:
    """Change any create field as a new version.

    Unclaimed occurrences of older versions become CANCELED (never deleted); the result
    says how many, and which occurrences are still running under an older version. Their
    times are planned again under the new version unless an older version already claimed
    or finished them (those never run twice; see README, "Lifecycle").

    Args:
        expected_version: The version the change was made against (e.g. the one an edit
            form loaded). If the schedule has moved on, nothing is written.

    Raises:
        celery_scheduler.errors.VersionConflict: ``expected_version`` is not the current one.
        celery_scheduler.errors.ValidationError: a subclass naming the bad field.
    """
    from django_app import audit, lifecycle

    who, why = audit.check(actor, reason)
    result = lifecycle.update_schedule(
        schedule_id, clock=clock, expected_version=expected_version, **changes
    )
    audit.record(
        "update", schedule=schedule_id, actor=who, reason=why, clock=clock,
        detail={"version": result.version, "fields": sorted(changes)},
    )  # fmt: skip
    return result


def pause_schedule(
    schedule_id: uuid.UUID | str,
    *,
    actor: str | None = None,
    reason: str | None = None,
    clock: Clock | None = None,
) -> LifecycleResult:
    """Stop materializing and invalidate unclaimed occurrences (new version).

    ``actor`` and ``reason`` (who and why) go to the audit trail.
    """
    return _audited(
        "pause",
        lifecycle_call="pause_schedule",
        schedule_id=schedule_id,
        actor=actor,
        reason=reason,
        clock=clock,
    )


def resume_schedule(
    schedule_id: uuid.UUID | str,
    *,
    actor: str | None = None,
    reason: str | None = None,
    clock: Clock | None = None,
) -> LifecycleResult:
    """Resume from now; fire times missed while paused follow the misfire policy.

    ``actor`` and ``reason`` (who and why) go to the audit trail.
    """
    return _audited(
        "resume",
        lifecycle_call="resume_schedule",
        schedule_id=schedule_id,
        actor=actor,
        reason=reason,
        clock=clock,
    )


def cancel_schedule(
    schedule_id: uuid.UUID | str,
    *,
    actor: str | None = None,
    reason: str | None = None,
    clock: Clock | None = None,
) -> LifecycleResult:
    """Cancel for good; history stays, running occurrences are reported.

    ``actor`` and ``reason`` (who and why) go to the audit trail.
    """
    return _audited(
        "cancel",
        lifecycle_call="cancel_schedule",
        schedule_id=schedule_id,
        actor=actor,
        reason=reason,
        clock=clock,
    )


def run_now(
    schedule_id: uuid.UUID | str,
    *,
    idempotency_key: str | None = None,
    actor: str | None = None,
    reason: str | None = None,
    clock: Clock | None = None,
) -> Occurrence:
    """Create a manual occurrence (its own id) that the relay publishes right away.

    Args:
        idempotency_key: The same key for the same schedule returns the occurrence the
            first call created instead of running again (a double click, a retried
            request). Without it every call is a new run.
    """
    from django_app import audit, lifecycle

    who, why = audit.check(actor, reason)
    occurrence = lifecycle.run_now(schedule_id, idempotency_key=idempotency_key, clock=clock)
    audit.record("run_now", occurrence=occurrence, actor=who, reason=why, clock=clock)
    return occurrence


def replay_occurrence(
    occurrence_id: uuid.UUID | str,
    *,
    actor: str | None = None,
    reason: str | None = None,
    clock: Clock | None = None,
) -> Occurrence:
    """Re-enqueue a DEAD occurrence under the same occurrence id (attempts are kept).

    Refused (``InvalidStateTransition``, nothing changed) when a worker would not run it:
    its schedule is canceled, or it belongs to an older version than the schedule's
    (a manual run survives version bumps); use ``run_now`` to run the current version.
    """
    from django_app import audit
    from django_app.worker import replay_occurrence as replay

    who, why = audit.check(actor, reason)
    occurrence = replay(occurrence_id, clock=clock)
    audit.record("replay", occurrence=occurrence, actor=who, reason=why, clock=clock)
    return occurrence


def _audited(
    action: str,
    *,
    lifecycle_call: str,
    schedule_id: uuid.UUID | str,
    actor: str | None,
    reason: str | None,
    clock: Clock | None,
) -> LifecycleResult:
    """Run one lifecycle verb, then write who/why to the audit trail."""
    from django_app import audit, lifecycle

    who, why = audit.check(actor, reason)
    result: LifecycleResult = getattr(lifecycle, lifecycle_call)(schedule_id, clock=clock)
    audit.record(
        action, schedule=schedule_id, actor=who, reason=why, clock=clock,
        detail={"version": result.version},
    )  # fmt: skip
    return result


def preview(
    *,
    cron: str | None = None,
    timezone: str = "UTC",
    interval: Seconds | None = None,
    run_at: datetime | None = None,
    start: datetime | None = None,
    count: int = 10,
    clock: Clock | None = None,
) -> list[timemath.PreviewRow]:
    """The next ``count`` fire times (UTC and local, DST notes) without creating anything.

    Pure: needs no database. Raises the same validation errors as ``create_schedule``.
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
    if given == ["cron"]:
        assert cron is not None
        trigger = timemath.CronTrigger(expression=cron, timezone=timezone)
    elif given == ["interval"]:
        trigger = timemath.IntervalTrigger(every=timemath.parse_interval(interval), anchor=start)
    else:
        assert run_at is not None
        trigger = timemath.OneOffTrigger(run_at=timemath.check_instant(run_at, "run_at"))
    # Include `start` itself so a preview that starts on a fire time shows it.
    return timemath.preview(trigger, start=start - timedelta(microseconds=1), count=count)
