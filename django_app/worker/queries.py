"""The worker's raw SQL statements, named (PostgreSQL only: the portable paths use the ORM).

One placeholder style: ``%(name)s``, with a dict of parameters. Table names come from the
models (``Model._meta.db_table``), quoted by the connection when the statement is built.
"""

from __future__ import annotations

from django_app.db.queries import table
from django_app.models import IdempotencyRecord, Occurrence

#: PostgreSQL: the common claim in one call of ``django_app_claim()`` (migrations 0021,
#: 0025); ``outcome`` is ``'claimed'`` when it wrote the claim (see
#: :mod:`django_app.worker.claim_pg`). ``scheduled_for`` (the partition key, or NULL when
#: unknown) prunes its lookups to one partition.
CLAIM = (
    "SELECT o_outcome, o_token, o_number, o_last_dead, o_tenant_id, o_tenant, "
    "o_max_attempts, o_deadline_seconds, o_timezone, o_scheduled_for, o_state, "
    "o_enqueued_at, o_retry_at FROM django_app_claim("
    "%(id)s, %(scheduled_for)s, %(worker)s, %(now)s, %(lease)s, %(generic)s)"
)

#: PostgreSQL: the completion of a run in one call of ``django_app_complete()`` (migrations
#: 0022, 0025): PL/pgSQL keeps its plan for the session, where the same text sent each time was
#: planned on every call. The schedule is read, not locked: the portable path reads
#: pause_after_failures unlocked too, and locks the schedule only when it is set (then the
#: statement changes nothing).
COMPLETE = (
    "SELECT o_moved, o_counts, o_released, o_sync FROM django_app_complete("
    "%(id)s, %(scheduled_for)s, %(token)s, %(now)s, %(result)s::jsonb, %(owner)s, "
    "%(state)s, %(running)s, %(outcome)s, %(generic)s)"
)


def insert_key() -> str:
    """PostgreSQL: insert an idempotency key's record; a row back means it went in (a key
    already done conflicts on the unique index and returns nothing)."""
    return (
        f"INSERT INTO {table(IdempotencyRecord)} "
        "(tenant_id, task_name, key, occurrence_id, task_id, created_at) "
        "VALUES (%(tenant)s, %(task_name)s, %(key)s, %(id)s, %(task_id)s, %(now)s) "
        "ON CONFLICT DO NOTHING RETURNING 1"
    )


def store_fenced(*, tenant_is_null: bool, keyed: bool = False) -> str:
    """PostgreSQL: store an idempotent task's result and lock its occurrence row if it is
    still RUNNING under the claim's token, in one statement; returns (records updated, the
    locked row's ``lease_expires_at`` or NULL). The caller judges the lease with the time
    it reads once the statement returned: a lock wait must not age the check.

    The record is this transaction's own insert (nobody else can hold it), so the order of
    the update and the fence's lock does not matter. ``keyed``: the occurrence is looked up
    with its ``scheduled_for`` too (one history partition instead of all).
    """
    tenant = "tenant_id IS NULL" if tenant_is_null else "tenant_id = %(tenant)s"
    key = " AND scheduled_for = %(scheduled_for)s" if keyed else ""
    return f"""
WITH stored AS (
    UPDATE {table(IdempotencyRecord)} SET result = %(result)s::jsonb
    WHERE {tenant} AND task_name = %(task_name)s AND key = %(key)s
    RETURNING 1
)
SELECT (SELECT count(*) FROM stored), max(fence.lease_expires_at) FROM (
    SELECT lease_expires_at FROM {table(Occurrence)}
    WHERE id = %(id)s{key} AND fencing_token = %(token)s AND state = %(running)s
    FOR UPDATE
) AS fence
"""
