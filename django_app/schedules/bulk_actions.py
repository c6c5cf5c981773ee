"""Bulk pause / resume / cancel of the schedules matching a filter.

The filter is the one of ``list_schedules`` (validated first: a bad filter writes
nothing). The matching ids are read once, in ``(created_at, id)`` order, then each
schedule gets its own lifecycle call (its own transaction, its own row lock), so one
schedule in the wrong state neither blocks nor hides the others: the report says, per
schedule, ``changed``, ``unchanged`` (already in that state) or ``refused`` with the reason.
A schedule changed concurrently between the read and its call is judged by its state at
the call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from celery_scheduler import errors
from celery_scheduler.api_types import BulkItem, BulkOutcome, BulkReport
from celery_scheduler.core.clock import Clock
from django_app.models import Schedule
from django_app.schedules import audit, audited, lifecycle, validation
from django_app.schedules.reads import check_filter_keywords, filtered

#: One call changes at most this many schedules; narrow the filter for more.
MAX_BULK = 10_000

Verb = Callable[..., lifecycle.LifecycleResult]


def bulk(
    action: str,
    filters: Mapping[str, Any],
    *,
    note: str = "",
    actor: str | None = None,
    reason: str | None = None,
    clock: Clock | None = None,
) -> BulkReport:
    """Apply ``action`` (pause, resume, cancel) to every schedule matching ``filters``
    (the keywords of :class:`~celery_scheduler.api_types.ScheduleFilter`; another one is a
    ``TypeError``, as it is for the API verb that passed it).

    Each schedule goes through the audited lifecycle call (``audited``, as the API's own
    verbs do), so the audit trail gets one entry per schedule with ``actor`` and ``reason``.
    """
    verbs: dict[str, Verb] = {
        "pause": audited.pause_schedule,
        "resume": audited.resume_schedule,
        "cancel": audited.cancel_schedule,
    }
    verb = verbs[action]
    check_filter_keywords(filters, f"bulk_{action}")
    note = validation.checked_text(note, "note", max_length=500)
    audit.check(actor, reason)  # before anything is changed
    blank = [name for name, value in filters.items() if _blank(value)]
    if blank:
        raise errors.ValidationError(
            f"{blank[0]} is empty: as a filter it would match every schedule; give a value "
            "or leave it out",
            field=blank[0],
        )
    if all(v is None for v in filters.values()):
        raise errors.ValidationError(
            "give at least one filter (tenant, state, task, tag, name_contains, next_run_*); "
            "a bulk change of every schedule is refused",
            field="tenant",
        )
    matching = filtered(**filters).order_by("created_at", "id")
    rows = list(matching.values_list("id", "name")[: MAX_BULK + 1])
    if len(rows) > MAX_BULK:
        raise errors.ValidationError(
            f"more than {MAX_BULK} schedules match; narrow the filter", field="tenant"
        )
    extra = {"note": note} if action == "pause" and note else {}
    items = []
    for schedule_id, name in rows:
        try:
            result = verb(schedule_id, actor=actor, reason=reason, clock=clock, **extra)
        except (errors.InvalidStateTransition, errors.ValidationError) as exc:
            items.append(_item(schedule_id, name, BulkOutcome.REFUSED, str(exc)))
            continue
        except errors.ScheduleNotFound as exc:  # gone since the read (cannot happen today)
            items.append(_item(schedule_id, name, BulkOutcome.REFUSED, str(exc)))
            continue
        outcome = BulkOutcome.CHANGED if result.changed else BulkOutcome.UNCHANGED
        items.append(_item(schedule_id, name, outcome, result.describe(), state=str(result.state)))
    return BulkReport(action=action, items=items)


def _blank(value: Any) -> bool:
    """A filter value given but empty (``""``, blanks, ``[]``, ``{}``): it narrows nothing."""
    if isinstance(value, str):
        return not value.strip()
    return isinstance(value, list | tuple | dict | set) and not value


def _item(
    schedule_id: Any, name: str, outcome: BulkOutcome, reason: str, *, state: str = ""
) -> BulkItem:
    if not state:
        found = Schedule.objects.filter(pk=schedule_id).values_list("state", flat=True).first()
        state = found or ""
    return BulkItem(schedule_id=schedule_id, name=name, outcome=outcome, state=state, reason=reason)
