"""A single create's writes in one call, on PostgreSQL.

``create_schedule`` on the ORM writes a schedule in nine round trips (tenant lock, key
lookup, savepoint, insert, release, version, tags, audit, commit), compiling each statement
in Python: most of a create's cost (bench/README.md, "Create throughput"). On
PostgreSQL the same steps run on the server in ``django_app_create_schedule()`` (migration
0016), called once with the rows that the ORM path would save, built from the same model
instances (tests/integration/schedules/test_create_pg.py compares the rows of both paths).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, models

from django_app.models import AuditEntry, Schedule, ScheduleVersion, cursor_values
from django_app.schedules import queries


@dataclass(frozen=True)
class Outcome:
    """What the call did: ``created``, ``replayed`` (the key's schedule, same content),
    ``conflict`` (the key's schedule, other content), ``quota`` (``live`` schedules
    already) or ``no_tenant``."""

    kind: str
    schedule_id: uuid.UUID | None
    tenant_id: int | None
    live: int | None
    max_schedules: int | None


def _row(obj: models.Model) -> dict[str, Any]:
    """The row ``obj.save()`` would insert (``pre_save`` fills auto_now) by column name,
    as JSON values ``jsonb_populate_record`` reads back into the columns' types. Keys the
    function sets itself (auto-increment ids, the tenant, the schedule) are left out."""
    row: dict[str, Any] = {}
    for f in obj._meta.concrete_fields:
        if f.primary_key and isinstance(f, models.AutoField | models.BigAutoField):
            continue
        value = f.pre_save(obj, True)
        if isinstance(value, datetime):
            value = value.isoformat()  # aware: the offset travels with it
        row[str(f.column)] = value
    return row


def create(
    tenant_slug: str,
    schedule: Schedule,
    version: ScheduleVersion,
    tags: Sequence[tuple[str, str]],
    audit: AuditEntry | None,
) -> Outcome:
    """Create ``schedule`` (its ``version``, ``tags`` and ``audit`` entry) for the tenant
    named ``tenant_slug``, unless its key names an existing schedule or the tenant's quota
    is used up; one statement, in the caller's transaction if there is one."""
    cursor_row = {k: v.isoformat() if isinstance(v, datetime) else v
                  for k, v in cursor_values(schedule).items()}  # fmt: skip
    rows = {"schedule": _row(schedule), "version": _row(version), "cursor": cursor_row}
    if audit is not None:
        rows["audit"] = _row(audit)
    with connection.cursor() as cursor:
        cursor.execute(
            queries.CREATE_SCHEDULE,
            {
                "tenant": tenant_slug,
                "key": schedule.idempotency_key,
                "hash": schedule.content_hash,
                "rows": json.dumps(rows, cls=DjangoJSONEncoder),
                "tag_keys": [key for key, _ in tags],
                "tag_values": [value for _, value in tags],
            },
        )
        row = cursor.fetchone()
    return Outcome(*row)
