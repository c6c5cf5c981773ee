"""Row factories for the worker-side tests (until then, the lifecycle API is not needed)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from celery_scheduler.core.enums import OccurrenceState
from celery_scheduler.core.ids import occurrence_id
from django_app.models import Occurrence, OutboxEntry, Schedule, Tenant


def make_schedule(tenant: Tenant, **fields: Any) -> Schedule:
    defaults: dict[str, Any] = {
        "name": f"s-{uuid.uuid4().hex[:6]}",
        "task": "billing.ping",
        "kind": "CRON",
        "cron": "* * * * *",
    }
    defaults.update(fields)
    return Schedule.objects.create(tenant=tenant, **defaults)


def make_occurrence(
    schedule: Schedule,
    scheduled_for: datetime,
    *,
    state: OccurrenceState = OccurrenceState.ENQUEUED,
    sent: bool = True,
) -> Occurrence:
    """An occurrence as the relay leaves it: ENQUEUED, outbox row marked sent."""
    occ = Occurrence.objects.create(
        id=occurrence_id(schedule.id, schedule.version, scheduled_for),
        schedule=schedule,
        schedule_version=schedule.version,
        tenant_id=schedule.tenant_id,
        scheduled_for=scheduled_for,
        available_at=scheduled_for,
        state=state.value,
        enqueued_at=scheduled_for if state is OccurrenceState.ENQUEUED else None,
    )
    OutboxEntry.objects.create(
        occurrence=occ,
        tenant_id=schedule.tenant_id,
        shard=schedule.shard,
        available_at=scheduled_for,
        sent_at=scheduled_for if sent else None,
        publish_count=int(sent),
    )
    return occ


def message_kwargs(occ: Occurrence) -> dict[str, Any]:
    """The kwargs the relay sends with ``celery_scheduler.run_occurrence``."""
    schedule = occ.schedule
    return {
        "occurrence_id": str(occ.id),
        "schedule_id": str(schedule.id),
        "schedule_version": occ.schedule_version,
        "scheduled_for": occ.scheduled_for.isoformat(),
        "task": schedule.task,
        "args": schedule.args,
        "kwargs": schedule.kwargs,
    }
