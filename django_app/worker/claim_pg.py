"""PostgreSQL: the common claim as one statement (one round trip, one durable commit).

:func:`django_app.worker.claim.claim` tries this first on PostgreSQL. It calls
``django_app_claim()`` (migrations 0021, 0025), which locks the schedule row and then the
occurrence row, as the portable claim does, and makes the portable claim's writes (the
occurrence ``-> RUNNING`` under ``fencing_token + 1``, the new Attempt) when the claim is
the common one: an unclaimed occurrence, still current, with no ``max_runs`` to count, no
overlap, no tenant ``max_running`` and no ``concurrency_limit``. Otherwise it writes
nothing and returns None, and the caller runs the portable claim, which decides every
other case (duplicates, stale occurrences, overlap, waiting lines, slots, ``max_runs``).

Issued outside ``transaction.atomic()`` (autocommit), the call is its own transaction,
committed durably (``synchronous_commit`` as the server sets it): the claim hands out the
fencing token, so a crash must not take it back (docs/explanation/workers-and-retries.md).
"""

from __future__ import annotations

import uuid
import weakref
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection

from django_app.worker import queries

#: PostgreSQL claims in one call of ``django_app_claim()`` when the claim is the common
#: one (tests turn it off to run the portable path on PostgreSQL too).
ONE_STATEMENT_CLAIM = True


@dataclass(frozen=True, kw_only=True)
class Claimed:
    """What the call wrote and read: the new token and attempt number, the number of the
    last FAILED attempt (None on a first attempt or when none failed) and the facts the
    claim's result carries (the occurrence's state, ``enqueued_at`` and ``retry_at`` as
    they were before the claim)."""

    token: int
    number: int
    last_dead: int | None
    tenant_id: int
    tenant: str
    max_attempts: int | None
    deadline_seconds: int | None
    timezone: str
    scheduled_for: datetime
    state: str
    enqueued_at: datetime | None
    retry_at: datetime | None


#: Per function, the database sessions that already called it (held weakly: a closed
#: connection drops out).
_WARM_SESSIONS: dict[str, weakref.WeakSet[Any]] = {
    "claim": weakref.WeakSet(),
    "complete": weakref.WeakSet(),
}


def generic_plans(function: str) -> bool:
    """Whether ``function`` runs on generic plans in this database session: not on its
    first call there, yes on every later one (migration 0025 has why).

    A worker that closes its connection after each task (Celery's default without
    ``CELERY_DB_REUSE_MAX``) makes only first calls, and a plan for the one partition the
    key names is the cheaper there; a kept connection builds the generic plans once and
    reuses them. Call it with the connection open.
    """
    session = connection.connection
    warm = _WARM_SESSIONS[function]
    if session is None or session in warm:
        return session is not None
    warm.add(session)
    return False


def applies() -> bool:
    return ONE_STATEMENT_CLAIM and connection.vendor == "postgresql"


def claim(
    occurrence_id: uuid.UUID,
    scheduled_for: datetime | None,
    worker: str,
    now: datetime,
    lease: timedelta,
) -> Claimed | None:
    """Claim ``occurrence_id`` for ``worker`` at ``now`` if the claim is the common one;
    None (nothing written) when the portable claim must decide. ``scheduled_for``, the
    occurrence's time as its message gives it, keeps the lookups to one history partition
    (None: the function reads it by id first)."""
    params: dict[str, Any] = {
        "id": occurrence_id, "scheduled_for": scheduled_for, "worker": worker, "now": now,
        "lease": lease,
    }  # fmt: skip
    with connection.cursor() as cursor:
        params["generic"] = generic_plans("claim")
        cursor.execute(queries.CLAIM, params)
        row = cursor.fetchone()
    if row is None or row[0] != "claimed":
        return None
    return Claimed(
        token=int(row[1]), number=int(row[2]), last_dead=row[3], tenant_id=int(row[4]),
        tenant=row[5], max_attempts=row[6], deadline_seconds=row[7], timezone=row[8],
        scheduled_for=row[9], state=row[10], enqueued_at=row[11], retry_at=row[12],
    )  # fmt: skip
