"""PostgreSQL: the completion of a run as one statement (one round trip, one commit).

:func:`django_app.worker.finish.complete` takes this path on PostgreSQL. The statement
writes exactly what the portable path's transaction writes (the occurrence RUNNING ->
SUCCEEDED under the fencing token, the attempt's outcome and result, the release of the
attempt's concurrency slot), each write gated on the fenced occurrence update, so a stale
token changes no row at all. A schedule that sets ``pause_after_failures`` is not touched
here: its success resets the failure count under the schedule lock, which the portable
path takes before the occurrence (the claim's lock order); the statement then reports it
and the caller runs the portable path instead.

Issued outside ``transaction.atomic()`` (autocommit), the statement is its own
transaction: the portable path's BEGIN, four statements and COMMIT become one round trip.
It is a call of ``django_app_complete()`` (migrations 0022, 0025), whose statements the
server plans once per kept session (:func:`django_app.worker.claim_pg.generic_plans`).

Its commit is asynchronous: the statement sets ``synchronous_commit = off`` for its own
transaction only (``set_config(..., true)``, the ``SET LOCAL`` of a one-statement
transaction), so it returns without waiting for the write-ahead log to reach the disk. The
claim's commit stays synchronous. What a database crash can take back is a completion of
the last fraction of a second, leaving the occurrence RUNNING under a lease that expires;
the reaper then runs it again under the same id, as after a worker that died before its
completion, and ``@idempotent_task``'s key, committed synchronously with the effect, returns
the stored result instead of a second effect. docs/explanation/workers-and-retries.md
("Durable claim, asynchronous completion") has the argument.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

from django.db import connection

from celery_scheduler.core.enums import AttemptOutcome
from celery_scheduler.core.enums import OccurrenceState as S
from django_app.worker import claim_pg, queries


def complete(
    occurrence_id: uuid.UUID,
    token: int,
    result: Any,
    *,
    now: datetime,
    slot_owner: str,
    scheduled_for: datetime | None = None,
) -> tuple[bool, bool, list[tuple[int, str]]]:
    """(moved, counts_failures, released): whether the fenced write happened, whether it was
    left to the portable path because the schedule counts failures, and the (tenant, key)
    of each concurrency slot it released (their oldest waiters are woken by the caller).
    ``scheduled_for`` (None: read by id first) keeps the statement to one partition."""
    params: dict[str, Any] = {
        "id": occurrence_id,
        "scheduled_for": scheduled_for,
        "token": token,
        "now": now,
        # JSON null stays SQL NULL, as the JSONField writes None.
        "result": None if result is None else json.dumps(result),
        "state": S.SUCCEEDED.value,
        "running": S.RUNNING.value,
        "outcome": AttemptOutcome.SUCCEEDED.value,
        "owner": slot_owner,
    }
    with connection.cursor() as cursor:
        params["generic"] = claim_pg.generic_plans("complete")
        cursor.execute(queries.COMPLETE, params)
        row = cursor.fetchone()
    if not row:
        return False, False, []
    released = row[2] if isinstance(row[2], list) else json.loads(row[2] or "[]")
    return int(row[0]) == 1, bool(row[1]), [(int(t), str(k)) for t, k in released]
