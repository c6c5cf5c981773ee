"""Row factories for the worker-side tests (until then, the lifecycle API is not needed)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db import connection

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


def _history_scans() -> dict[str, int]:
    """Scans so far in this transaction, per history partition (``pg_stat_xact_user_tables``)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT relname, seq_scan + coalesce(idx_scan, 0) FROM pg_stat_xact_user_tables "
            "WHERE relname ~ '^django_app_(occurrence|attempt|outboxentry)_'"
        )
        return dict(cur.fetchall())


def partitions_scanned(call: Callable[[], Any]) -> dict[str, set[str]]:
    """PostgreSQL: {history table: its partitions scanned} while ``call()`` ran, in the
    test's transaction: what a lookup by partition key (or by id alone) reads."""
    before = _history_scans()
    call()
    touched: dict[str, set[str]] = {}
    for name, n in _history_scans().items():
        if n > before.get(name, 0):
            touched.setdefault(name.rsplit("_", 1)[0], set()).add(name)
    return touched
