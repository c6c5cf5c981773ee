"""The relay's raw SQL statements, named.

One placeholder style: ``%(name)s``, with a dict of parameters. Table names come from the
models (``Model._meta.db_table``), quoted by the connection when a statement is first built
(each builder is cached: one process talks to one database).

The burst relay's statements are PostgreSQL's (arrays, ``unnest``, ``SKIP LOCKED``); the
transaction bounds are MySQL/MariaDB's session variables here (PostgreSQL's ``SET LOCAL``
and the keepalive's ``SELECT 1`` are in :mod:`django_app.db.queries`). A ``SET`` takes no
parameters: its values are formatted in by the caller.
"""

from __future__ import annotations

from functools import cache

from django_app.db.queries import table
from django_app.models import Occurrence, OutboxEntry, Schedule, ShardLease


def mysql_set(assignments: list[str]) -> str:
    """MySQL/MariaDB: one ``SET`` of session and user variables (the old values are read
    before any is changed)."""
    return "SET " + ", ".join(assignments)


#: Every array parameter is cast to its column's type: psycopg sends a list of small ints
#: as int2[], and ``bigint = ANY(int2[])`` is not hashed, so on an unanalysed table (a fresh
#: burst) a 20,000-id check became a seq scan comparing each row with every id.
_SHARDS = "AND shard = ANY(%(shards)s::int[])"
#: The partition key of the rows a statement names by id: the distinct times of those rows
#: (``keys``). On the partitioned history tables an id is unique only with its time, and a
#: lookup by id alone probes the id index of every slot; with this it reads the slots the
#: times fall in. Left out (``keyed=False``) when a row's time is unknown (NULL: an outbox
#: row written before migration 0020 on a table that was never converted).
_KEYS = "AND {alias}scheduled_for = ANY(%(keys)s::timestamptz[])"


def _keys(keyed: bool, alias: str = "") -> str:
    return _KEYS.format(alias=alias) if keyed else ""


@cache
def claim(*, sharded: bool, keyed: bool) -> str:
    """PostgreSQL (burst relay): claim the unsent outbox rows due until ``until`` (of the
    relay's ``shards`` when ``sharded``) for ``token``; returns (id, occurrence_id, shard,
    available_at, tenant_id, scheduled_for) of each.

    A claim lasts until the row's own time (a row already late: the claim's time) plus
    ``lease`` seconds (``claim_grace_seconds``, not the window's end): rows a dead or
    stalled relay held are taken over that soon after they were due, however far ahead the
    window reached. Rows already past due are claimed too (oldest first), so a backlog after
    an outage, a restart or a late plan goes out at the burst rate, not one general-relay
    batch at a time. Late rows of ``rate_limited`` tenants are left to the general relay,
    which takes them as the tenant's budget allows (claiming them here would re-prepare and
    give back the same rows on every poll while the budget is spent). Holding past that is
    harmless: the wave locks occurrence rows and re-checks ``sent_at`` and the claim before
    publishing, so an expired claim moves who sends, not how often. ``keyed`` (partitioned
    tables, where the key is never NULL): the update finds the rows the inner select chose
    by their key.

    The rows come back in the order they were chosen, ``(available_at, -priority, id)``:
    the relay keeps that order among the rows of one instant (SPEC, "The single-node
    dispatcher"). ``RETURNING`` alone has no order: it gave the plan's, which with the
    table's statistics is the order the rows were written in.
    """
    outbox = table(OutboxEntry)
    return f"""
WITH claimed AS (
UPDATE {outbox}
SET claimed_by = %(token)s,
    claim_expires_at = GREATEST(available_at, %(now)s) + make_interval(secs => %(lease)s)
WHERE {"(id, scheduled_for)" if keyed else "id"} IN (
    SELECT id{", scheduled_for" if keyed else ""} FROM {outbox}
    WHERE sent_at IS NULL AND available_at <= %(until)s {_SHARDS if sharded else ""}
      AND (available_at > %(now)s OR NOT tenant_id = ANY(%(rate_limited)s::bigint[]))
      AND (claimed_by = '' OR claim_expires_at IS NULL OR claim_expires_at < %(now)s)
    ORDER BY available_at, priority DESC, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
RETURNING id, occurrence_id, shard, available_at, tenant_id, scheduled_for, priority
)
SELECT id, occurrence_id, shard, available_at, tenant_id, scheduled_for FROM claimed
ORDER BY available_at, priority DESC, id
"""


@cache
def read_occurrences(*, keyed: bool) -> str:
    """PostgreSQL (burst relay): what the messages need of the occurrences ``ids``.

    The prepare stage reads occurrences and schedules in two lookups by key, not one join
    from the outbox: on a filling slot PostgreSQL planned the join as hash joins over the
    whole occurrence and schedule tables (bench/README.md, "Catch-up after a 5-minute
    outage")."""
    return f"""
SELECT id, schedule_id, schedule_version, scheduled_for, tenant_id, attempt_count, manual
FROM {table(Occurrence)} WHERE id = ANY(%(ids)s::uuid[]) {_keys(keyed)}
"""


@cache
def read_schedules() -> str:
    """PostgreSQL (burst relay): what the messages need of the schedules ``ids``."""
    return f"""
SELECT id, version, task, args, kwargs, queue, priority
FROM {table(Schedule)} WHERE id = ANY(%(ids)s::uuid[])
"""


@cache
def mark_outbox(*, keyed: bool) -> str:
    """PostgreSQL (burst relay): mark the outbox rows ``ids`` sent, each at its ``times``."""
    return f"""
UPDATE {table(OutboxEntry)} b
SET sent_at = v.t, publish_count = b.publish_count + 1, claim_expires_at = NULL
FROM unnest(%(ids)s::bigint[], %(times)s::timestamptz[]) AS v(id, t)
WHERE b.id = v.id AND b.sent_at IS NULL {_keys(keyed, "b.")}
"""


@cache
def mark_occurrence(*, keyed: bool) -> str:
    """PostgreSQL (burst relay): move the occurrences ``ids`` to ``state`` (ENQUEUED) from
    one of ``sources``, ``enqueued_at`` set to each one's ``times`` unless already set."""
    return f"""
UPDATE {table(Occurrence)} o SET state = %(state)s, enqueued_at = COALESCE(o.enqueued_at, v.t)
FROM unnest(%(ids)s::uuid[], %(times)s::timestamptz[]) AS v(id, t)
WHERE o.id = v.id AND o.state = ANY(%(sources)s::varchar[]) {_keys(keyed, "o.")}
"""


@cache
def fence() -> str:
    """PostgreSQL (burst relay): the ``shards``' current fencing tokens (read, not locked:
    see ``BurstRelay._fence``)."""
    return (
        f"SELECT shard, fencing_token FROM {table(ShardLease)} WHERE shard = ANY(%(shards)s::int[])"
    )


@cache
def lock(*, keyed: bool) -> str:
    """PostgreSQL (burst relay): the wave's occurrence rows ``ids``, locked; a row a worker
    or a lifecycle call holds is skipped."""
    return f"""
SELECT id, state, schedule_version, manual, schedule_id, scheduled_for, created_at
FROM {table(Occurrence)} WHERE id = ANY(%(ids)s::uuid[]) {_keys(keyed)}
FOR UPDATE SKIP LOCKED
"""


@cache
def versions() -> str:
    """PostgreSQL (burst relay): the current version of the schedules ``ids``."""
    return f"SELECT id, version FROM {table(Schedule)} WHERE id = ANY(%(ids)s::uuid[])"


@cache
def unsent(*, keyed: bool) -> str:
    """PostgreSQL (burst relay): which of the outbox rows ``ids`` are still unsent and still
    claimed by ``token``. A held row the worker side re-opened meanwhile (a retry's or a
    deferral's later ``available_at``, its claim cleared) goes out at that time, by whoever
    claims it then; a row another relay took over is that relay's to send."""
    return (
        f"SELECT id FROM {table(OutboxEntry)} WHERE id = ANY(%(ids)s::bigint[]) "
        f"AND sent_at IS NULL AND claimed_by = %(token)s {_keys(keyed)}"
    )


@cache
def cancel_stale() -> str:
    """PostgreSQL (burst relay): occurrences ``ids`` of an old schedule version move to
    ``state`` (CANCELED) from one of ``sources`` instead of being published."""
    return f"""
UPDATE {table(Occurrence)} SET state = %(state)s, finished_at = %(now)s, reason = %(reason)s
WHERE id = ANY(%(ids)s::uuid[]) AND state = ANY(%(sources)s::varchar[])
"""


@cache
def drop() -> str:
    """PostgreSQL (burst relay): mark the outbox rows ``ids`` done without publishing them."""
    return f"""
UPDATE {table(OutboxEntry)} SET sent_at = %(now)s, claimed_by = 'dropped', claim_expires_at = NULL
WHERE id = ANY(%(ids)s::bigint[]) AND sent_at IS NULL
"""


@cache
def release() -> str:
    """PostgreSQL (burst relay): give back the claims ``token`` holds on the unsent outbox
    rows ``ids``."""
    return f"""
UPDATE {table(OutboxEntry)} SET claimed_by = '', claim_expires_at = NULL
WHERE id = ANY(%(ids)s::bigint[]) AND claimed_by = %(token)s AND sent_at IS NULL
"""
