"""The raw SQL statements of the database plumbing, named: session bounds every package
uses, and the PostgreSQL partition maintenance (:mod:`~django_app.db.partitions`,
:mod:`~django_app.db.convert`).

One placeholder style: ``%(name)s``, with a dict of parameters. A statement PostgreSQL
does not plan (``SET``, ``LOCK``, ``CREATE``/``ALTER``/``DROP``) takes no parameters: its
values are names quoted with ``connection.ops.quote_name`` or integers formatted in by the
builder. Table names come from the models (``Model._meta.db_table``, via
:func:`django_app.db.partitions.tables`) or from the catalog (partitions), quoted here.
"""

from __future__ import annotations

from django.db import connection


def q(name: str) -> str:
    """``name`` quoted as an identifier for the current connection."""
    return str(connection.ops.quote_name(name))


#: Any database: a no-op statement. It checks that the connection works (health probes),
#: and keeps a held transaction's session from counting as idle (the relay), failing at
#: once if the server already ended it.
PING = "SELECT 1"


# -- session bounds (PostgreSQL) -------------------------------------------------------------


def lock_timeout(ms: int) -> str:
    """PostgreSQL: bound the current transaction's lock waits to ``ms`` milliseconds."""
    return f"SET LOCAL lock_timeout = {int(ms)}"


def statement_timeout(ms: int) -> str:
    """PostgreSQL: bound the current transaction's statements to ``ms`` milliseconds."""
    return f"SET LOCAL statement_timeout = {int(ms)}"


def idle_timeout(ms: int) -> str:
    """PostgreSQL: end the session if the current transaction sits idle ``ms`` milliseconds."""
    return f"SET LOCAL idle_in_transaction_session_timeout = {int(ms)}"


#: PostgreSQL: the current transaction reads and writes times in UTC.
UTC = "SET LOCAL TimeZone = 'UTC'"
