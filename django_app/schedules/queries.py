"""The schedule writes' raw SQL statements, named (PostgreSQL only: the portable paths use
the ORM).

One placeholder style: ``%(name)s``, with a dict of parameters. Table names come from the
models (``Model._meta.db_table``), quoted by the connection when a statement is built.
"""

from __future__ import annotations

from django_app.db.queries import table
from django_app.models import AuditEntry, Schedule

#: PostgreSQL: create a schedule (its version, cursor, tags and audit entry, given as
#: ``rows`` of JSON) in one call of ``django_app_create_schedule()``, unless its key names
#: an existing schedule or the tenant's quota is used up (see ``schedules/create_pg.py``).
CREATE_SCHEDULE = (
    "SELECT o_outcome, o_schedule_id, o_tenant_id, o_live, o_max_schedules "
    "FROM django_app_create_schedule(%(tenant)s, %(key)s, %(hash)s, %(rows)s::jsonb, "
    "%(tag_keys)s::text[], %(tag_values)s::text[])"
)


def existing_by_key() -> str:
    """PostgreSQL (bulk create): (key, id, content hash) of the ``tenant``'s schedules with
    one of the idempotency ``keys`` (one array parameter, not an IN list: building and
    converting that list cost more client time per item than the rest of the lookup)."""
    return (
        f"SELECT idempotency_key, id, content_hash FROM {table(Schedule)} "
        "WHERE tenant_id = %(tenant)s AND idempotency_key = ANY(%(keys)s)"
    )


def audit_many() -> str:
    """PostgreSQL (bulk create): one audit entry per schedule of ``ids``, built by the
    server; ``WITH ORDINALITY`` keeps the entries' ids in the order of ``ids``."""
    return (
        f"INSERT INTO {table(AuditEntry)} (at, tenant_id, schedule_id, occurrence_id, action, "
        "actor, reason, detail) SELECT %(at)s, %(tenant)s, s.id, NULL, %(action)s, %(actor)s, "
        "%(reason)s, '{}'::jsonb "
        "FROM unnest(%(ids)s::uuid[]) WITH ORDINALITY AS s(id, n) ORDER BY s.n"
    )
