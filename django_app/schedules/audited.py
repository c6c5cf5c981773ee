"""A lifecycle verb and its audit entry as one call.

The public API's pause, resume, cancel and update (``django_app.api``) and the bulk verbs
(``bulk_actions``, ``bulk_create``) go through these, so every change writes one
AuditEntry with who and why, whichever entry point made it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from celery_scheduler.core.clock import Clock
from django_app.schedules import audit, lifecycle, validation
from django_app.schedules.lifecycle import LifecycleResult


def run(
    action: str,
    *,
    lifecycle_call: Callable[..., LifecycleResult],
    schedule_id: uuid.UUID | str,
    actor: str | None,
    reason: str | None,
    clock: Clock | None,
    **extra: Any,
) -> LifecycleResult:
    """Run one lifecycle verb, then write who/why to the audit trail."""
    who, why = audit.check(actor, reason)
    result = lifecycle_call(schedule_id, clock=clock, **extra)
    audit.record(
        action, schedule=schedule_id, actor=who, reason=why, clock=clock,
        detail={"version": result.version},
    )  # fmt: skip
    return result


def pause_schedule(
    schedule_id: uuid.UUID | str,
    *,
    note: str = "",
    actor: str | None = None,
    reason: str | None = None,
    clock: Clock | None = None,
) -> LifecycleResult:
    """Pause; without a ``reason`` the note is the audit reason."""
    # The note's own limits first: a bad note is an error on ``note``, not on the reason
    # it would become.
    note = validation.checked_text(note, "note", max_length=500)
    return run(
        "pause",
        lifecycle_call=lifecycle.pause_schedule,
        schedule_id=schedule_id,
        actor=actor,
        reason=reason if reason is not None else (note or None),
        clock=clock,
        note=note,
    )


def resume_schedule(
    schedule_id: uuid.UUID | str,
    *,
    actor: str | None = None,
    reason: str | None = None,
    clock: Clock | None = None,
) -> LifecycleResult:
    return run(
        "resume",
        lifecycle_call=lifecycle.resume_schedule,
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
    return run(
        "cancel",
        lifecycle_call=lifecycle.cancel_schedule,
        schedule_id=schedule_id,
        actor=actor,
        reason=reason,
        clock=clock,
    )


def update_schedule(
    schedule_id: uuid.UUID | str,
    *,
    expected_version: int | None = None,
    actor: str | None = None,
    reason: str | None = None,
    clock: Clock | None = None,
    **changes: Any,
) -> LifecycleResult:
    """A new version (or an in-place change); the audit entry names the changed fields."""
    who, why = audit.check(actor, reason)
    result = lifecycle.update_schedule(
        schedule_id, clock=clock, expected_version=expected_version, **changes
    )
    audit.record(
        "update", schedule=schedule_id, actor=who, reason=why, clock=clock,
        detail={"version": result.version, "fields": sorted(changes)},
    )  # fmt: skip
    return result
