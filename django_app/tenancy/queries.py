"""The tenancy package's raw SQL statements, named.

Positional ``%s`` placeholders: the one statement wraps a sub-select the ORM compiled
(``QuerySet.query.sql_with_params()``), whose placeholders are positional, and one
statement cannot mix the two styles. Table names come from the models
(``Model._meta.db_table``), quoted by the connection when the statement is built.
"""

from __future__ import annotations

from django.db import connection

from django_app.models import OutboxEntry


def fair_lock(ranked: str) -> str:
    """PostgreSQL and MySQL/MariaDB (the general relay's fair batch): lock, ``SKIP LOCKED``,
    up to ``size`` of the outbox rows the ``ranked`` sub-select returns, in its fair order,
    re-checking on each locked row version that it is unsent, due by ``until`` and not
    claimed by another relay than ``token`` (unless its claim expired before ``now``).

    Parameters: the sub-select's, then ``until, token, now, size``. MariaDB has no ``FOR
    UPDATE OF``; its locking read locks the outer query's tables only (here the outbox),
    not those the ranked sub-select reads.
    """
    of = " OF o" if connection.features.has_select_for_update_of else ""
    return f"""
SELECT o.id FROM {connection.ops.quote_name(OutboxEntry._meta.db_table)} o
JOIN ({ranked}) r ON r.id = o.id
WHERE o.sent_at IS NULL AND o.available_at <= %s
  AND (o.claimed_by = '' OR o.claimed_by = %s OR o.claim_expires_at IS NULL
       OR o.claim_expires_at < %s)
ORDER BY r.fair, r.available_at, r.priority DESC, r.id
LIMIT %s FOR UPDATE{of} SKIP LOCKED
"""
