"""The API's audit trail: one AuditEntry per lifecycle call, with who and why when given."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from celery_scheduler import errors
from celery_scheduler.core.clock import SYSTEM_CLOCK, Clock
from django_app.models import AuditEntry, Occurrence, Schedule
from django_app.schedules import validation

#: Longest reason kept (a note, not a document).
MAX_REASON = 2000


def check(actor: str | None, reason: str | None) -> tuple[str, str]:
    """Validate what the caller passed, before anything is changed."""
    who, why = actor or "", reason or ""
    for field, value, limit in (("actor", who, 200), ("reason", why, MAX_REASON)):
        if not isinstance(value, str):
            raise errors.ValidationError(f"{field} must be text", field=field)
        # NUL and lone surrogates: the entry is written after the change, in its transaction
        # or not (a bulk call's next schedule), so what it cannot store is refused first.
        validation.check_storable(value, field, errors.ValidationError)
        if len(value) > limit:
            raise errors.ValidationError(
                f"{field} is {len(value)} characters long; at most {limit}", field=field
            )
    return who, why


def record(
    action: str,
    *,
    schedule: Schedule | uuid.UUID | str | None = None,
    occurrence: Occurrence | None = None,
    actor: str = "",
    reason: str = "",
    detail: dict[str, Any] | None = None,
    clock: Clock | None = None,
) -> AuditEntry:
    """Write one entry: after the change it describes, or in its transaction (a create)."""
    if occurrence is not None and schedule is None:
        schedule = occurrence.schedule_id
    if schedule is None:
        raise ValueError("an audit entry names a schedule or an occurrence")
    if not isinstance(schedule, Schedule):
        schedule = Schedule.objects.only("id", "tenant_id").get(pk=schedule)
    written = entry(
        action, schedule, occurrence=occurrence, actor=actor, reason=reason, detail=detail,
        at=(clock or SYSTEM_CLOCK).now(),
    )  # fmt: skip
    written.save(force_insert=True)
    return written


def entry(
    action: str,
    schedule: Schedule,
    *,
    at: datetime,
    occurrence: Occurrence | None = None,
    actor: str = "",
    reason: str = "",
    detail: dict[str, Any] | None = None,
) -> AuditEntry:
    """The unsaved entry :func:`record` writes (a create inserts it with its schedule)."""
    return AuditEntry(
        at=at,
        tenant_id=schedule.tenant_id,
        schedule=schedule,
        occurrence_id=occurrence.pk if occurrence is not None else None,
        action=action,
        actor=actor,
        reason=reason,
        detail=detail or {},
    )
