"""Held-row types, statements and stage timings of :mod:`django_app.relay.burst` (PostgreSQL)."""

from __future__ import annotations

import json
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from celery_scheduler.core.enums import OccurrenceState as S
from celery_scheduler.core.states import PUBLISHABLE, sources_of, state_values
from django_app.models import Occurrence, OutboxEntry, Schedule, ShardLease, Tenant

#: Table names from the models, formatted into the statements once, here.
OUTBOX = OutboxEntry._meta.db_table
OCCURRENCE = Occurrence._meta.db_table
SCHEDULE = Schedule._meta.db_table
TENANT = Tenant._meta.db_table
SHARD_LEASE = ShardLease._meta.db_table
#: The states each set-based transition moves an occurrence from: the transition table's
#: sources, narrowed to what the relay may publish (never a DEAD row a replay re-enqueues).
ENQUEUE_FROM = state_values(sources_of(S.ENQUEUED, within=PUBLISHABLE))
CANCEL_FROM = state_values(sources_of(S.CANCELED, within=PUBLISHABLE))


@dataclass(slots=True)
class HeldRow:
    """One held row: ids for the lock and the mark, and what the push needs.

    A burst holds every row of its window, so nothing else is kept: the fast publisher's
    ``PreparedMessage`` is the payload bytes and a shared list key (the full message is
    dropped after preparing), and equal ``available_at`` values share one object.
    """

    outbox_id: int
    occurrence_id: uuid.UUID
    shard: int
    tenant_id: int
    available_at: datetime
    schedule_version: int  # the schedule's version the message was built from
    prepared: Any  # PreparedMessage (fast publisher) or OccurrenceMessage


@dataclass(slots=True)
class Wave:
    start: datetime
    rows: list[HeldRow] = field(default_factory=list)
    #: The tenants with rows in the wave (kept while adding rows, not scanned at the hold).
    tenants: set[int] = field(default_factory=set)


def due(row: HeldRow) -> datetime:
    return row.available_at


@dataclass(slots=True)
class BurstStats:
    """Rows and seconds per stage, accumulated over the relay's life (rows/s = ratio)."""

    rows: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def add(self, stage: str, rows: int, started: float) -> None:
        self.rows[stage] += rows
        self.seconds[stage] += time.perf_counter() - started

    def rates(self) -> dict[str, dict[str, float]]:
        return {
            k: {
                "rows": self.rows[k],
                "seconds": round(self.seconds[k], 3),
                "rows_per_s": round(self.rows[k] / self.seconds[k]) if self.seconds[k] else 0,
            }
            for k in self.rows
        }


def decode_json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str | bytes) else value


#: Every array parameter is cast to its column's type: psycopg sends a list of small ints
#: as int2[], and ``bigint = ANY(int2[])`` is not hashed, so on an unanalysed table (a fresh
#: burst) a 20,000-id check became a seq scan comparing each row with every id (~6 s).
SHARDS = "AND shard = ANY(%(shards)s::int[])"
#: A claim lasts until the row's own time (a row already late: the claim's time) plus
#: ``claim_grace_seconds`` (not the window's end): rows a dead or stalled relay held are
#: taken over that soon after they were due, however far ahead the window reached. Rows
#: already past due are claimed too (oldest first), so a backlog after an outage, a restart
#: or a late plan goes out at the burst rate, not one general-relay batch at a time. Late
#: rows of tenants with a trigger rate are left to the general relay, which takes them as
#: the tenant's budget allows (claiming them here would re-prepare and give back the same
#: rows on every poll while the budget is spent). Holding past that is harmless: the wave locks
#: occurrence rows and re-checks ``sent_at`` before publishing, so an expired claim moves
#: who sends, not how often.
CLAIM_SQL = f"""
UPDATE {OUTBOX}
SET claimed_by = %(token)s,
    claim_expires_at = GREATEST(available_at, %(now)s) + make_interval(secs => %(lease)s)
WHERE id IN (
    SELECT id FROM {OUTBOX}
    WHERE sent_at IS NULL AND available_at <= %(until)s {{shards}}
      AND (available_at > %(now)s OR NOT tenant_id = ANY(%(rate_limited)s::bigint[]))
      AND (claimed_by = '' OR claim_expires_at IS NULL OR claim_expires_at < %(now)s)
    ORDER BY available_at, priority DESC, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
RETURNING id, occurrence_id, shard, available_at, tenant_id
"""
READ_SQL = f"""
SELECT b.id, o.id, o.schedule_version, o.scheduled_for, s.id, s.version, s.task, s.args,
       s.kwargs, s.queue, s.priority, t.slug, o.attempt_count, o.manual
FROM {OUTBOX} b
JOIN {OCCURRENCE} o ON o.id = b.occurrence_id
JOIN {SCHEDULE} s ON s.id = o.schedule_id
JOIN {TENANT} t ON t.id = o.tenant_id
WHERE b.id = ANY(%s::bigint[])
"""
MARK_OUTBOX_SQL = f"""
UPDATE {OUTBOX} b
SET sent_at = v.t, publish_count = b.publish_count + 1, claim_expires_at = NULL
FROM unnest(%s::bigint[], %s::timestamptz[]) AS v(id, t)
WHERE b.id = v.id AND b.sent_at IS NULL
"""
MARK_OCCURRENCE_SQL = f"""
UPDATE {OCCURRENCE} o SET state = %s, enqueued_at = COALESCE(o.enqueued_at, v.t)
FROM unnest(%s::uuid[], %s::timestamptz[]) AS v(id, t)
WHERE o.id = v.id AND o.state = ANY(%s::varchar[])
"""
#: The shards' current fencing tokens (read, not locked: see ``BurstRelay._fence``).
FENCE_SQL = f"SELECT shard, fencing_token FROM {SHARD_LEASE} WHERE shard = ANY(%s::int[])"
#: The wave's occurrence rows, locked; a row a worker or a lifecycle call holds is skipped.
LOCK_SQL = f"""
SELECT id, state, schedule_version, manual, schedule_id, scheduled_for, created_at
FROM {OCCURRENCE} WHERE id = ANY(%s::uuid[]) FOR UPDATE SKIP LOCKED
"""
VERSIONS_SQL = f"SELECT id, version FROM {SCHEDULE} WHERE id = ANY(%s::uuid[])"
UNSENT_SQL = f"SELECT id FROM {OUTBOX} WHERE id = ANY(%s::bigint[]) AND sent_at IS NULL"
#: Occurrences of an old schedule version: CANCELED instead of published (parameters:
#: the state, finished_at, reason, ids, CANCEL_FROM).
CANCEL_STALE_SQL = f"""
UPDATE {OCCURRENCE} SET state = %s, finished_at = %s, reason = %s
WHERE id = ANY(%s::uuid[]) AND state = ANY(%s::varchar[])
"""
DROP_SQL = f"""
UPDATE {OUTBOX} SET sent_at = %s, claimed_by = 'dropped', claim_expires_at = NULL
WHERE id = ANY(%s::bigint[]) AND sent_at IS NULL
"""
RELEASE_SQL = f"""
UPDATE {OUTBOX} SET claimed_by = '', claim_expires_at = NULL
WHERE id = ANY(%s::bigint[]) AND claimed_by = %s AND sent_at IS NULL
"""
