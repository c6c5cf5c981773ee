"""The public lifecycle API's implementation: ``celery_scheduler.api`` is its public face.

Every function here is one database transaction (bulk calls: one per batch) and needs
Django set up; ``celery_scheduler.api`` defers the import of this module to the first call,
so importing the public module stays cheap and Django-free. Validation errors are
``celery_scheduler.errors.ValidationError`` subclasses whose ``field`` attribute names the
bad argument; nothing is written when one is raised.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Unpack

from celery_scheduler.api_types import (
    BackfillReport,
    BulkCreateReport,
    BulkReport,
    ScheduleDescription,
    ScheduleFilter,
    SchedulePage,
    ScheduleSyncReport,
    Seconds,
    SkipResult,
    TenantInfo,
    TenantUsage,
)
from celery_scheduler.core.clock import SYSTEM_CLOCK, Clock
from django_app import conf, tenants
from django_app.models import Occurrence, Schedule, Tenant
from django_app.schedules import audit, audited, bulk_create, lifecycle, reads, skips
from django_app.schedules import backfill as backfill_module
from django_app.schedules.bulk_actions import bulk
from django_app.schedules.lifecycle import LifecycleResult
from django_app.worker.finish import replay_occurrence as replay

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
    "replay_occurrence",
    "resume_schedule",
    "run_now",
    "skip_occurrence",
    "sync_schedules",
    "update_schedule",
    "update_tenant",
]


def create_schedule(
    *,
    name: str,
    task: str,
    tenant: Tenant | str | None = None,
    cron: str | None = None,
    timezone: str = "UTC",
    dst_gap: str = "SKIP",
    dst_fold: str = "FIRST",
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
    max_runs: int | None = None,
    pause_after_failures: int | None = None,
    tags: Mapping[str, str] | None = None,
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
        dst_gap: A cron wall time the spring-forward gap removes: ``SKIP`` it (default) or
            ``SHIFT`` it to the first instant after the gap (see docs/explanation/dst.md).
        dst_fold: A cron wall time the fall-back repeats: run it at the ``FIRST`` instant
            (default), the ``SECOND``, or ``BOTH``. Cron only: an interval or one-off
            refuses anything but the defaults.
        interval: Fixed rate (seconds or timedelta) from ``start_at`` (default: now).
        run_at: One-off instant (aware datetime).
        misfire_policy: ``SKIP``, ``FIRE_ONCE`` or ``CATCH_UP`` (docs: "The contracts", "Misfire").
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
        max_runs: Run at most this many scheduled occurrences, then COMPLETE (retries of
            one occurrence are one run; run-now and backfill occurrences do not count).
        pause_after_failures: Pause by itself after this many consecutive DEAD
            occurrences (the reason is recorded); a success resets the count.
        tags: Free-form ``{key: value}`` labels, filterable in ``list_schedules``.
        actor, reason: Who makes the call and why, for the audit trail (every lifecycle
            call here takes them; see docs: "The contracts", "Audit trail").

    Raises:
        celery_scheduler.errors.ValidationError: a subclass naming the bad field.
        celery_scheduler.errors.IdempotencyConflict: key reused with other content.
        celery_scheduler.errors.QuotaExceeded: the tenant's schedule quota is used up.
    """
    # The entry is written in the create's transaction: it commits with the schedule (one
    # commit, one WAL flush per create; no schedule without its entry).
    return lifecycle.create_schedule(
        tenant=tenant, idempotency_key=idempotency_key, clock=clock,
        audited_by=audit.check(actor, reason),
        name=name, task=task, cron=cron, timezone=timezone, dst_gap=dst_gap,
        dst_fold=dst_fold, interval=interval, run_at=run_at,
        args=args, kwargs=kwargs, queue=queue, priority=priority,
        misfire_policy=misfire_policy, max_lateness=max_lateness, catchup_cap=catchup_cap,
        overlap_policy=overlap_policy, flexible_window=flexible_window,
        concurrency_limit=concurrency_limit, concurrency_group=concurrency_group,
        max_attempts=max_attempts, deadline=deadline, start_at=start_at, end_at=end_at,
        max_runs=max_runs, pause_after_failures=pause_after_failures,
        tags=tags,
    )  # fmt: skip


def create_schedules(
    items: Iterable[Mapping[str, Any]],
    *,
    tenant: Tenant | str | None = None,
    actor: str | None = None,
    reason: str | None = None,
    clock: Clock | None = None,
) -> BulkCreateReport:
    """Create many schedules in one transaction: all of them, or none.

    Each item is a mapping of :func:`create_schedule`'s keyword arguments (``name``,
    ``task``, ``cron``..., ``tags``, ``max_runs``, ``idempotency_key``); ``tenant``,
    ``actor``, ``reason`` and ``clock`` are given once for the call. Every item is
    validated as ``create_schedule`` validates it, and the schedule, its first version,
    its tags and its audit entry are exactly what ``create_schedule`` would write; the
    writes are set-based (one insert per table per 5,000 rows, ``COPY`` on PostgreSQL).

    Idempotency keys work as in ``create_schedule``: an item whose key names an existing
    schedule with the same content returns that schedule's id (so does a repeated key
    within the call); the same key with other content raises ``IdempotencyConflict``.

    Returns:
        A :class:`~celery_scheduler.api_types.BulkCreateReport`: one schedule id per item,
        in order, and how many were created or already there.

    Raises:
        celery_scheduler.errors.ValidationError: the first bad item, as the subclass
            ``create_schedule`` raises; the message starts with ``items[<index>]:`` and
            ``field`` is ``items[<index>].<field>``. Nothing is written.
        celery_scheduler.errors.IdempotencyConflict: a key reused with other content.
        celery_scheduler.errors.QuotaExceeded: the batch would exceed the tenant's quota.
    """
    who, why = audit.check(actor, reason)
    return bulk_create.create_schedules(
        items, tenant=tenant, actor=who, reason=why, clock=clock, settings=conf.get()
    )


def sync_schedules(
    items: Iterable[Mapping[str, Any]],
    *,
    tenant: Tenant | str | None = None,
    prune: bool = False,
    actor: str | None = None,
    reason: str | None = None,
    clock: Clock | None = None,
) -> ScheduleSyncReport:
    """Make the tenant's schedules match ``items``, keyed by ``idempotency_key``.

    Declarative upsert (like BullMQ's ``upsertJobScheduler``, for many at once). Every
    item is a :func:`create_schedules` item and must have an ``idempotency_key``, unique
    within the call. A key with no schedule is created (through ``create_schedules``,
    with ``source="sync"``); a schedule whose fields differ from its item is updated
    through :func:`update_schedule` with just the fields that differ (a new version when
    a versioned field changed, in place for ``max_runs``/``pause_after_failures``/
    ``tags``); an equal one is left alone. A field an item leaves out means its default,
    as in a create (so removing ``queue`` from an item resets the queue), except an
    interval's anchor: without ``start_at`` the stored anchor is kept. A canceled or
    completed schedule with the key is left alone (``stopped``). Paused schedules stay
    paused.

    ``prune=True`` also cancels the tenant's live schedules that sync created
    (``source="sync"``) whose key is not in ``items``; schedules made any other way are
    never pruned. ``prune`` must be a bool (``None``: ``False``): a string such as
    ``"false"`` is refused, not read by its truth.

    One transaction: every item is validated first, and a refused item or a failing
    update leaves everything as it was.

    Raises:
        celery_scheduler.errors.ValidationError: as :func:`create_schedules`; also a
            missing or repeated ``idempotency_key`` (``items[<index>].idempotency_key``),
            or a ``prune`` that is not a bool (``prune``).
        celery_scheduler.errors.QuotaExceeded: the new schedules exceed the quota.
    """
    who, why = audit.check(actor, reason)
    return bulk_create.sync_schedules(
        items, tenant=tenant, prune=prune, actor=who, reason=why, clock=clock,
        settings=conf.get(),
    )  # fmt: skip


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
    or finished them (those never run twice; see docs: "The contracts", "Lifecycle").
    ``max_runs``, ``pause_after_failures`` and ``tags`` (which replaces every tag) change
    in place: alone they make no new version. ``max_runs`` must be above the runs
    already made (``ValidationError`` otherwise); ``None`` removes the limit.

    Args:
        expected_version: The version the change was made against (e.g. the one an edit
            form loaded). If the schedule has moved on, nothing is written.

    Raises:
        celery_scheduler.errors.VersionConflict: ``expected_version`` is not the current one.
        celery_scheduler.errors.ValidationError: a subclass naming the bad field.
    """
    return audited.update_schedule(
        schedule_id, expected_version=expected_version, actor=actor, reason=reason, clock=clock,
        **changes,
    )  # fmt: skip


def pause_schedule(
    schedule_id: uuid.UUID | str,
    *,
    note: str = "",
    actor: str | None = None,
    reason: str | None = None,
    clock: Clock | None = None,
) -> LifecycleResult:
    """Stop materializing and invalidate unclaimed occurrences (new version).

    ``note`` (at most 500 characters) is kept as the pause reason until resume and shown
    by :func:`describe_schedule` and the admin. ``actor`` and ``reason`` (who and why) go
    to the audit trail; without a ``reason`` the note is the audit reason.
    """
    return audited.pause_schedule(schedule_id, note=note, actor=actor, reason=reason, clock=clock)


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
    return audited.resume_schedule(schedule_id, actor=actor, reason=reason, clock=clock)


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
    return audited.cancel_schedule(schedule_id, actor=actor, reason=reason, clock=clock)


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
            request), at any age: once retention has pruned that occurrence, it is rebuilt
            (unsaved) from the key's record with its final state. Without it every call
            is a new run.
    """
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
    who, why = audit.check(actor, reason)
    occurrence = replay(occurrence_id, clock=clock)
    audit.record("replay", occurrence=occurrence, actor=who, reason=why, clock=clock)
    return occurrence


def describe_schedule(
    schedule_id: uuid.UUID | str,
    *,
    tenant: str | None = None,
    next_count: int = 5,
    last_count: int = 10,
    clock: Clock | None = None,
) -> ScheduleDescription:
    """Everything about one schedule (see :class:`~celery_scheduler.api_types.ScheduleDescription`).

    The schedule and its settings, the current version, the state with its reason
    (pause note, automatic pause, park), the next ``next_count`` (1-100) fire times in
    UTC and local time, the last ``last_count`` (0-1000) occurrences with state, lag and
    attempts, and counters over its history. ``tenant`` (a slug) scopes the lookup: a
    schedule of another tenant raises ``ScheduleNotFound`` like a missing one.

    Raises:
        celery_scheduler.errors.ScheduleNotFound: no such schedule (in that tenant).
        celery_scheduler.errors.ValidationError: a bad count, naming the field.
    """
    now = (clock or SYSTEM_CLOCK).now()
    return reads.describe_schedule(
        schedule_id, tenant=tenant, next_count=next_count, last_count=last_count, now=now
    )


def list_schedules(
    *, limit: int = 50, after: str | None = None, **filters: Unpack[ScheduleFilter]
) -> SchedulePage:
    """One page of schedules matching every filter given, oldest first.

    Args:
        tenant: A tenant slug (unknown: ``ValidationError`` on ``tenant``).
        state: ``ACTIVE``, ``PAUSED``, ``PARKED``, ``COMPLETED`` or ``CANCELED``.
        task: Exact task name.
        tag: ``"key=value"``, ``"key"`` (any value) or ``{key: value, ...}`` (all must
            match).
        name_contains: Case-insensitive substring of the name.
        next_run_before: Cursor (``next_run_at``) strictly before this aware datetime.
        next_run_after: Cursor at or after this aware datetime.
        limit: Page size, 1 to 1000.
        after: The ``next_cursor`` of the previous page (opaque).

    Pages are keyset-paginated on ``(created_at, id)``: stable while schedules are added,
    and as fast on the last page of a million schedules as on the first.
    """
    reads.check_filter_keywords(filters, "list_schedules")
    return reads.list_schedules(limit=limit, after=after, **filters)


def create_tenant(
    slug: str,
    *,
    name: str = "",
    max_schedules: int | None = None,
    max_trigger_rate: int | None = None,
    max_running: int | None = None,
    catchup_rate: int | None = None,
    relay_weight: int = 1,
) -> TenantInfo:
    """Create a tenant. Quotas: None (or 0) means no limit.

    Args:
        slug: 1-64 letters, digits, ``-`` or ``_``; unique.
        name: Display name (default: the slug).
        max_schedules: Live (active, paused, parked) schedules at most.
        max_trigger_rate: Messages per second the relay publishes at most.
        max_running: Occurrences RUNNING at once across all workers.
        catchup_rate: Late (catch-up and backfill) occurrences released per minute.
        relay_weight: Share of relay capacity under contention (1-1000).

    Raises:
        celery_scheduler.errors.ValidationError: a bad value or an existing slug
            (``field`` names it); nothing is written.
    """
    return tenants.create_tenant(
        slug, name=name, max_schedules=max_schedules, max_trigger_rate=max_trigger_rate,
        max_running=max_running, catchup_rate=catchup_rate, relay_weight=relay_weight,
    )  # fmt: skip


def update_tenant(slug: str, **changes: Any) -> TenantInfo:
    """Change a tenant's name, quotas or relay weight (only the fields given).

    Takes the keyword arguments of :func:`create_tenant` (``None`` clears a quota). The
    change applies at once: the next create, claim, relay batch and materializer pass
    read the new value. Unknown fields and bad values raise ``ValidationError`` naming
    the field, and nothing is written; an unknown slug names ``tenant``.
    """
    return tenants.update_tenant(slug, **changes)


def get_tenant(slug: str) -> TenantInfo:
    """One tenant's quotas (``ValidationError`` on ``tenant`` if unknown)."""
    return tenants.get_tenant(slug)


def list_tenants(*, tenant: str | None = None, clock: Clock | None = None) -> list[TenantUsage]:
    """Every tenant with its usage against each quota (see :class:`TenantUsage`).

    ``tenant``: that tenant's row alone, counted from its own rows only
    (``ValidationError`` on ``tenant`` if unknown).
    """
    return tenants.list_tenants(now=(clock or SYSTEM_CLOCK).now(), slug=tenant)


def skip_occurrence(
    schedule_id: uuid.UUID | str,
    scheduled_for: datetime | None = None,
    *,
    note: str = "",
    tenant: str | None = None,
    actor: str | None = None,
    reason: str | None = None,
    clock: Clock | None = None,
) -> SkipResult:
    """Skip one fire time without pausing the schedule: that time never runs.

    ``scheduled_for`` None skips the next time not yet claimed (a pending occurrence, else
    the next fire time); otherwise it must be a fire time of the schedule that has not
    passed unplanned. The skipped time shows as a CANCELED occurrence with the reason
    ``skipped by operator[: note]`` (so the reconciler does not report it absent), and
    survives pause/resume and updates. Skipping the same time twice is harmless. ``actor``
    and ``reason`` (who and why; without a ``reason`` the note is the audit reason) go to the
    audit trail, written with the skip.

    Raises:
        celery_scheduler.errors.ValidationError: ``scheduled_for`` (or ``note``) is bad.
        celery_scheduler.errors.InvalidStateTransition: the occurrence is already running
            or finished, or the schedule is canceled/completed.
        celery_scheduler.errors.ScheduleNotFound: no such schedule (in that tenant).
    """
    audited_by = audit.check(actor, reason)
    now = (clock or SYSTEM_CLOCK).now()
    return skips.skip_occurrence(
        schedule_id, scheduled_for, note=note, tenant=tenant, audited_by=audited_by, now=now
    )


_BULK_DOC = """{verb} every schedule matching the filter; report what happened to each.

    Filters are those of :func:`list_schedules` (at least one is required; a bad one
    raises ``ValidationError`` naming it and nothing is written); at most 10,000
    schedules per call. Each schedule gets its own transaction, so one in the wrong state
    does not stop the others. The :class:`~celery_scheduler.api_types.BulkReport` lists
    every matching schedule as ``changed``, ``unchanged`` (already {past}) or ``refused``
    (its state does not allow it; ``reason`` says why). ``actor`` and ``reason`` go to
    the audit trail, one entry per schedule.
    """


def bulk_pause(
    *,
    note: str = "",
    actor: str | None = None,
    reason: str | None = None,
    clock: Clock | None = None,
    **filters: Unpack[ScheduleFilter],
) -> BulkReport:
    return bulk("pause", filters, note=note, actor=actor, reason=reason, clock=clock)


def bulk_resume(
    *,
    actor: str | None = None,
    reason: str | None = None,
    clock: Clock | None = None,
    **filters: Unpack[ScheduleFilter],
) -> BulkReport:
    return bulk("resume", filters, actor=actor, reason=reason, clock=clock)


def bulk_cancel(
    *,
    actor: str | None = None,
    reason: str | None = None,
    clock: Clock | None = None,
    **filters: Unpack[ScheduleFilter],
) -> BulkReport:
    return bulk("cancel", filters, actor=actor, reason=reason, clock=clock)


bulk_pause.__doc__ = _BULK_DOC.format(verb="Pause", past="paused") + (
    "\n    ``note`` is stored as each paused schedule's pause reason.\n"
)
bulk_resume.__doc__ = _BULK_DOC.format(verb="Resume", past="active")
bulk_cancel.__doc__ = _BULK_DOC.format(verb="Cancel", past="canceled")


def backfill(
    schedule_id: uuid.UUID | str,
    start: datetime,
    end: datetime,
    *,
    overlap_policy: str | None = None,
    tenant: str | None = None,
    actor: str | None = None,
    reason: str | None = None,
    clock: Clock | None = None,
) -> BackfillReport:
    """Run the schedule's fire times in the past range ``[start, end)`` as occurrences.

    Each time becomes one occurrence with a deterministic id (``occurrence_id(schedule,
    0, t)``), so backfilling the same or an overlapping range again never runs a time
    twice; times that already ran under the schedule (pending, running, succeeded or
    dead in any version) are left out, missed/canceled/skipped ones are run. The new
    occurrences are released one per ``60 / catchup_rate`` seconds of the tenant (after
    the tenant's backfills still waiting), all at once without a rate. Backfill runs
    even while the schedule is paused (like run now; cancel the schedule to stop it),
    does not count against ``max_runs`` and is not expected by the reconciler; a resume
    or update never plans a backfilled time again (the reconciler finds the backfill
    there). On an active schedule the range must end at its cursor (``ValidationError``
    on ``end`` past it: the beats plan those times by the misfire policy). Over pruned
    history it decides as if the rows were there (retention kept which pruned times ran or
    were backfilled). ``HistoryPruned`` (a ``ValidationError`` on ``start``, nothing
    created) only when it would have to run a time inside a span pruned before migration
    0024, where that is not known.

    Args:
        start, end: Aware datetimes, ``start < end <= now``; at most 10,000 fire times.
        overlap_policy: ``ALLOW``, ``SKIP_IF_RUNNING`` or ``QUEUE_ONE`` for these
            occurrences (default: the schedule's policy at claim time).
        tenant: A tenant slug: another tenant's schedule is ``ScheduleNotFound``.
        actor, reason: Who makes the call and why, for the audit trail (its entry, written
            with the backfill, holds the range and how many runs it created).

    Raises:
        celery_scheduler.errors.ValidationError: a bad range or policy (``field`` names
            it); nothing is written.
        celery_scheduler.errors.InvalidStateTransition: the schedule is canceled.
    """
    audited_by = audit.check(actor, reason)
    now = (clock or SYSTEM_CLOCK).now()
    return backfill_module.backfill(
        schedule_id, start, end, overlap_policy=overlap_policy, tenant=tenant,
        audited_by=audited_by, now=now,
    )  # fmt: skip
