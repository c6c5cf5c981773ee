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

from datetime import datetime
from typing import Any

from django.db import connection

from django_app.models import Occurrence, ScheduleCursor


def q(name: str) -> str:
    """``name`` quoted as an identifier for the current connection."""
    return str(connection.ops.quote_name(name))


def table(model: Any) -> str:
    """The table of a Django model, quoted for the current connection (every package's
    statements take their table names from here, never written out)."""
    return q(model._meta.db_table)


#: PostgreSQL's name of ``timestamptz`` (what ``DateTimeField.db_type`` says).
TIMESTAMPTZ = "timestamp with time zone"
#: Column types whose values' text forms never need quoting inside an array literal.
_PLAIN_TEXT_TYPES = frozenset({"uuid", "integer", "bigint", "smallint", TIMESTAMPTZ})


def array_literal(values: list[Any], kind: str) -> Any:
    """``values`` as one PostgreSQL array literal (``{a,b,NULL}``) when ``kind`` is a type
    whose text forms need no quoting (uuid, integers, aware datetimes); else the list.

    Django binds parameters on the client, and psycopg's list adapter dumps and
    regex-checks every element in Python (bench/README.md, "Catch-up after a 5-minute
    outage", has what it cost). One joined string, cast by the statement
    (``%s::uuid[]``), does the same in C.
    """
    if kind not in _PLAIN_TEXT_TYPES:
        return values
    return "{" + ",".join(["NULL" if v is None else str(v) for v in values]) + "}"


#: Any database: a no-op statement. It checks that the connection works (health probes),
#: and keeps a held transaction's session from counting as idle (the relay), failing at
#: once if the server already ended it.
PING = "SELECT 1"


# -- session bounds (PostgreSQL) -------------------------------------------------------------


def lock_timeout(ms: int) -> str:
    """PostgreSQL: bound the current transaction's lock waits to ``ms`` milliseconds."""
    return f"SET LOCAL lock_timeout = {int(ms)}"


#: PostgreSQL: the server's ``deadlock_timeout`` in milliseconds (how long a lock wait lasts
#: before the waiter checks for a cycle).
DEADLOCK_TIMEOUT_MS = "SELECT setting::int FROM pg_settings WHERE name = 'deadlock_timeout'"


def statement_timeout(ms: int) -> str:
    """PostgreSQL: bound the current transaction's statements to ``ms`` milliseconds."""
    return f"SET LOCAL statement_timeout = {int(ms)}"


def idle_timeout(ms: int) -> str:
    """PostgreSQL: end the session if the current transaction sits idle ``ms`` milliseconds."""
    return f"SET LOCAL idle_in_transaction_session_timeout = {int(ms)}"


#: PostgreSQL: the current transaction reads and writes times in UTC.
UTC = "SET LOCAL TimeZone = 'UTC'"


#: PostgreSQL: foreign key checks deferred in this transaction run now.
CONSTRAINTS_IMMEDIATE = "SET CONSTRAINTS ALL IMMEDIATE"


# -- partition maintenance (PostgreSQL) ------------------------------------------------------

#: The partition key of the occurrence, attempt and outbox tables (the model's column).
KEY = str(Occurrence._meta.get_field("scheduled_for").column)

#: Whether the visible table named ``table`` is a partitioned table.
IS_PARTITIONED = (
    "SELECT 1 FROM pg_partitioned_table p JOIN pg_class c ON c.oid = p.partrelid "
    "WHERE c.relname = %(table)s AND pg_table_is_visible(c.oid)"
)
#: ``table``'s partitions: (name, bound expression).
PARTITIONS_OF = (
    "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
    "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = %(table)s::regclass"
)
#: Wait for the transaction-scoped advisory lock ``key``.
ADVISORY_LOCK = "SELECT pg_advisory_xact_lock(%(key)s)"
#: Take the transaction-scoped advisory lock ``key`` if free; returns whether it did.
TRY_ADVISORY_LOCK = "SELECT pg_try_advisory_xact_lock(%(key)s)"
#: Held until released or the session ends, across transactions.
TRY_SESSION_ADVISORY_LOCK = "SELECT pg_try_advisory_lock(%(key)s)"
SESSION_ADVISORY_UNLOCK = "SELECT pg_advisory_unlock(%(key)s)"
#: PostgreSQL: the partitions of ``parents`` whose changes since their last ANALYZE reach
#: ``min`` rows and half their size (a slot filling up: analyzed each time it doubles).
GROWN_PARTITIONS = (
    "SELECT s.relname FROM pg_stat_user_tables s JOIN pg_inherits h ON h.inhrelid = s.relid "
    "WHERE h.inhparent = ANY(%(parents)s::regclass[]) "
    "AND s.n_mod_since_analyze >= GREATEST(%(min)s, s.n_live_tup / 2) ORDER BY s.relname"
)


def analyze(table: str) -> str:
    """PostgreSQL: refresh the planner's statistics of ``table``."""
    return f"ANALYZE {q(table)}"


#: ``table``'s indexes inherited from its parent's: (index name, parent index name).
INHERITED_INDEXES = (
    "SELECT ci.relname, pi.relname FROM pg_index x JOIN pg_class ci ON ci.oid = "
    "x.indexrelid JOIN pg_inherits h ON h.inhrelid = ci.oid JOIN pg_class pi ON "
    "pi.oid = h.inhparent WHERE x.indrelid = %(table)s::regclass"
)
#: ``table``'s columns, in order.
COLUMNS = (
    "SELECT attname FROM pg_attribute WHERE attrelid = %(table)s::regclass AND attnum > 0 "
    "AND NOT attisdropped ORDER BY attnum"
)
#: ``table``'s indexes that back no constraint: (name, CREATE INDEX statement).
PLAIN_INDEXES = (
    "SELECT i.relname, pg_get_indexdef(x.indexrelid) FROM pg_index x "
    "JOIN pg_class i ON i.oid = x.indexrelid WHERE x.indrelid = %(table)s::regclass "
    "AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = x.indexrelid "
    "AND c.conrelid = x.indrelid) ORDER BY i.relname"
)
#: ``table``'s primary key and unique constraints: (name, kind 'p'/'u', columns).
UNIQUE_CONSTRAINTS = (
    "SELECT c.conname, c.contype, array(SELECT a.attname FROM unnest(c.conkey) "
    "WITH ORDINALITY k(n, o) JOIN pg_attribute a ON a.attrelid = c.conrelid "
    "AND a.attnum = k.n ORDER BY k.o) FROM pg_constraint c "
    "WHERE c.conrelid = %(table)s::regclass AND c.contype IN ('p', 'u') ORDER BY c.conname"
)
#: ``table``'s foreign keys and checks: (name, definition).
OTHER_CONSTRAINTS = (
    "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
    "WHERE conrelid = %(table)s::regclass AND contype IN ('f', 'c') ORDER BY conname"
)
#: ``table``'s identity column, if any.
IDENTITY_COLUMN = (
    "SELECT attname FROM pg_attribute WHERE attrelid = %(table)s::regclass AND attidentity <> ''"
)
#: Whether a relation named ``name`` exists.
EXISTS_RELATION = "SELECT to_regclass(%(name)s) IS NOT NULL"
#: Whether ``table`` has the constraint ``name``.
CONSTRAINT_EXISTS = (
    "SELECT EXISTS (SELECT 1 FROM pg_constraint "
    "WHERE conrelid = to_regclass(%(table)s) AND conname = %(name)s)"
)
#: A row when the index ``name`` exists and is INVALID (a concurrent build that did not end).
INDEX_INVALID = "SELECT 1 FROM pg_index WHERE indexrelid = to_regclass(%(name)s) AND NOT indisvalid"


def lock_exclusive(*tables: str) -> str:
    """ACCESS EXCLUSIVE on ``tables`` (and so their partitions), in the order named, until
    the transaction ends: one statement, so no round trip falls between two of the locks."""
    return f"LOCK TABLE {', '.join(q(t) for t in tables)} IN ACCESS EXCLUSIVE MODE"


def _with(storage: str) -> str:
    """A CREATE TABLE's ``WITH (...)`` clause of storage parameters, if any."""
    return f" WITH ({storage})" if storage else ""


def create_partition(table: str, name: str, *, storage: str = "") -> str:
    """Partition ``name`` of ``table`` for ``[start, end)`` (``storage``: its parameters)."""
    return (
        f"CREATE TABLE {q(name)} PARTITION OF {q(table)} "
        f"FOR VALUES FROM (%(start)s) TO (%(end)s){_with(storage)}"
    )


def create_default_partition(table: str, *, storage: str = "") -> str:
    """``table``'s DEFAULT partition, ``<table>_default``."""
    return f"CREATE TABLE {q(table + '_default')} PARTITION OF {q(table)} DEFAULT{_with(storage)}"


def set_storage(table: str, storage: str) -> str:
    """Set ``table``'s storage parameters (for the rows written from now on)."""
    return f"ALTER TABLE {q(table)} SET ({storage})"


def reset_storage(table: str, names: list[str]) -> str:
    return f"ALTER TABLE {q(table)} RESET ({', '.join(names)})"


def attach_partition(table: str, name: str) -> str:
    """Attach ``name`` to ``table`` for ``[start, end)``."""
    return (
        f"ALTER TABLE {q(table)} ATTACH PARTITION {q(name)} "
        "FOR VALUES FROM (%(start)s) TO (%(end)s)"
    )


def attach_history(table: str, name: str) -> str:
    """Attach ``name`` to ``table`` for ``[MINVALUE, end)``."""
    return (
        f"ALTER TABLE {q(table)} ATTACH PARTITION {q(name)} FOR VALUES FROM (MINVALUE) TO (%(end)s)"
    )


def detach_partition(table: str, name: str) -> str:
    return f"ALTER TABLE {q(table)} DETACH PARTITION {q(name)}"


def count_range(table: str) -> str:
    """The rows of ``table`` keyed in ``[start, end)``."""
    return f"SELECT count(*) FROM {q(table)} WHERE {KEY} >= %(start)s AND {KEY} < %(end)s"


def count_all(table: str) -> str:
    return f"SELECT count(*) FROM {q(table)}"


#: The oldest transaction id still running, as the 32-bit id a row's ``xmin`` holds.
SNAPSHOT_XMIN = "SELECT mod(pg_snapshot_xmin(pg_current_snapshot())::text::bigint, 4294967296)"


def count_written_since(table: str) -> str:
    """``table``'s rows, and those whose ``xmin`` is not older than ``%(since)s`` (a 32-bit
    transaction id): ``age()`` compares across wraparound; a row frozen so long ago that its
    age wraps reads as new, which errs on the safe side."""
    return (
        f"SELECT count(*), count(*) FILTER (WHERE age(xmin) <= age(%(since)s::text::xid)) "
        f"FROM {q(table)}"
    )


def has_rows(table: str) -> str:
    return f"SELECT EXISTS (SELECT 1 FROM {q(table)})"


def create_like(name: str, table: str, *, including: str, storage: str = "") -> str:
    """A plain table ``name`` shaped like ``table`` (``including``: the LIKE options)."""
    return f"CREATE TABLE {q(name)} (LIKE {q(table)} {including}){_with(storage)}"


def create_partitioned_like(name: str, table: str) -> str:
    """An empty table ``name`` shaped like ``table``, partitioned by range of the key."""
    return (
        f"CREATE TABLE {q(name)} (LIKE {q(table)} INCLUDING DEFAULTS "
        f"INCLUDING IDENTITY INCLUDING GENERATED) PARTITION BY RANGE ({KEY})"
    )


def move_range(source: str, target: str, columns: list[str]) -> str:
    """Move the rows of ``source`` keyed in ``[start, end)`` into ``target``."""
    cols = ", ".join(q(c) for c in columns)
    return (
        f"WITH moved AS (DELETE FROM {q(source)} WHERE {KEY} >= %(start)s AND {KEY} < %(end)s "
        f"RETURNING {cols}) INSERT INTO {q(target)} ({cols}) SELECT {cols} FROM moved"
    )


def copy_rows(target: str, source: str, columns: list[str], *, where: str = "") -> str:
    """Insert ``source``'s rows (those with ``where``'s column ``= ANY(ids)`` if given) into
    ``target``."""
    cols = ", ".join(q(c) for c in columns)
    sql = f"INSERT INTO {q(target)} ({cols}) SELECT {cols} FROM {q(source)}"
    return f"{sql} WHERE {where} = ANY(%(ids)s)" if where else sql


def route_back(target: str, hold: str, columns: list[str]) -> str:
    """Insert the rows held in ``hold`` into ``target`` (through its partitioning), then
    drop ``hold``."""
    return f"{copy_rows(target, hold, columns)}; DROP TABLE {q(hold)}"


#: Plain tables of the current schema (not partitions) whose name matches ``%(pattern)s``.
DETACHED_TABLES = (
    "SELECT relname FROM pg_class WHERE relkind = 'r' AND NOT relispartition "
    "AND relnamespace = current_schema()::regnamespace AND relname ~ %(pattern)s"
)


def truncate(*tables: str) -> str:
    return f"TRUNCATE {', '.join(q(t) for t in tables)}"


def drop_table(table: str, *, cascade: bool = False) -> str:
    return f"DROP TABLE {q(table)}" + (" CASCADE" if cascade else "")


def rename_table(table: str, name: str) -> str:
    return f"ALTER TABLE {q(table)} RENAME TO {q(name)}"


def rename_index(index: str, name: str) -> str:
    return f"ALTER INDEX {q(index)} RENAME TO {q(name)}"


def create_index(
    name: str, table: str, body: str, *, only: bool = False, concurrently: bool = False
) -> str:
    """``CREATE INDEX name ON table <body>``; ``body``: the columns and any ``WHERE``."""
    how = " CONCURRENTLY" if concurrently else ""
    on = "ONLY " if only else ""
    return f"CREATE INDEX{how} {q(name)} ON {on}{q(table)} {body}"


def attach_index(parent: str, child: str) -> str:
    """Make ``child`` (a partition's index) a part of the partitioned index ``parent``."""
    return f"ALTER INDEX {q(parent)} ATTACH PARTITION {q(child)}"


def drop_index(name: str, *, concurrently: bool = False) -> str:
    how = " CONCURRENTLY" if concurrently else ""
    return f"DROP INDEX{how} IF EXISTS {q(name)}"


def key_not_null(table: str, *, required: bool = True) -> str:
    """``table``'s key column made NOT NULL (``required``) or nullable again."""
    what = "SET" if required else "DROP"
    return f"ALTER TABLE {q(table)} ALTER COLUMN {KEY} {what} NOT NULL"


def add_constraint(table: str, name: str, definition: str) -> str:
    return f"ALTER TABLE {q(table)} ADD CONSTRAINT {q(name)} {definition}"


def add_key(table: str, name: str, kind: str, columns: list[str]) -> str:
    """A primary key (``kind`` 'p') or unique constraint over ``columns``."""
    what = "PRIMARY KEY" if kind == "p" else "UNIQUE"
    return add_constraint(table, name, f"{what} ({', '.join(q(c) for c in columns)})")


def add_key_using_index(table: str, name: str, kind: str, index: str) -> str:
    """A primary key (``kind`` 'p') or unique constraint over the prebuilt ``index``."""
    what = "PRIMARY KEY" if kind == "p" else "UNIQUE"
    return add_constraint(table, name, f"{what} USING INDEX {q(index)}")


def drop_constraint(table: str, name: str, *, if_exists: bool = False) -> str:
    guard = "IF EXISTS " if if_exists else ""
    return f"ALTER TABLE {q(table)} DROP CONSTRAINT {guard}{q(name)}"


def validate_constraint(table: str, name: str) -> str:
    return f"ALTER TABLE {q(table)} VALIDATE CONSTRAINT {q(name)}"


def unique_index_concurrently(name: str, table: str, columns: list[str]) -> str:
    """Build the unique index ``name`` on ``columns`` while reads and writes go on."""
    cols = ", ".join(q(c) for c in columns)
    return f"CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS {q(name)} ON {q(table)} ({cols})"


def range_check(table: str, name: str, boundary: datetime) -> str:
    """``CHECK (key IS NOT NULL AND key < boundary) NOT VALID`` (no scan; the boundary is a
    literal: a check constraint takes no parameter)."""
    literal = f"'{boundary.isoformat()}'::timestamptz"
    return add_constraint(table, name, f"CHECK ({KEY} IS NOT NULL AND {KEY} < {literal}) NOT VALID")


def set_aside(table: str, hold: str, columns: list[str]) -> str:
    """Move ``table``'s rows keyed at or after ``boundary`` into ``hold``; returns how many."""
    names = ", ".join(q(c) for c in columns)
    return (
        f"WITH m AS (DELETE FROM {q(table)} WHERE {KEY} >= %(boundary)s RETURNING {names}) "
        f", i AS (INSERT INTO {q(hold)} ({names}) SELECT {names} FROM m RETURNING 1) "
        f"SELECT count(*) FROM i"
    )


def backfill_key(table: str, occurrence: str, batch: int) -> str:
    """Copy the key from each row's occurrence onto up to ``batch`` rows of ``table`` that
    lack it and have an occurrence (rows locked by others skipped); returns how many."""
    return (
        f"WITH b AS (SELECT t.id FROM {q(table)} t JOIN {q(occurrence)} o "
        f"ON o.id = t.occurrence_id WHERE t.{KEY} IS NULL LIMIT {int(batch)} "
        f"FOR UPDATE OF t SKIP LOCKED), u AS (UPDATE {q(table)} t SET {KEY} = o.{KEY} "
        f"FROM b, {q(occurrence)} o WHERE t.id = b.id AND o.id = t.occurrence_id "
        f"RETURNING 1) SELECT count(*) FROM u"
    )


def backfill_key_waiting(table: str, occurrence: str) -> str:
    """:func:`backfill_key` for every row left, waiting for the locks others hold on them."""
    return (
        f"UPDATE {q(table)} t SET {KEY} = o.{KEY} FROM {q(occurrence)} o "
        f"WHERE o.id = t.occurrence_id AND t.{KEY} IS NULL"
    )


def backfill_key_from(table: str, column: str) -> str:
    """The key of ``table``'s rows still without one, from their own ``column``."""
    return f"UPDATE {q(table)} SET {KEY} = {column} WHERE {KEY} IS NULL"


def continue_identity(history: str, column: str) -> str:
    """The sequence of ``table``'s identity ``column`` goes on from ``history``'s largest
    value."""
    return (
        f"SELECT setval(pg_get_serial_sequence(%(table)s, %(column)s), "
        f"greatest((SELECT max({q(column)}) FROM {q(history)}), 1))"
    )


def drop_identity(table: str, column: str) -> str:
    return f"ALTER TABLE {q(table)} ALTER COLUMN {q(column)} DROP IDENTITY"


def blocking_probes(occurrences: str, outbox: str, waiting: tuple[str, ...]) -> dict[str, str]:
    """The rows of one occurrence partition that retention must not delete, as three
    statements each served by an index (an expired slot holds a day of rows, of which a
    handful block): ``(id, why)`` of the rows in a ``waiting`` state (why: the state),
    with an unsent outbox row in ``outbox`` (``UNSENT_OUTBOX``; bounded to the slot's
    ``%(start)s``/``%(end)s``), and at a time the schedule's live version has not passed
    yet (``AHEAD_OF_CURSOR``, a skip marker: deleting it would let the time run). The
    state probe reads the partial index by state (no SUCCEEDED entries), the outbox probe
    the due index (unsent rows only), the cursor probe the cursors behind the slot's end
    and then each one's rows by schedule and time."""
    states = ", ".join(f"'{s}'" for s in waiting)
    occ, out, cursor = q(occurrences), q(outbox), q(ScheduleCursor._meta.db_table)
    return {
        "state": f"SELECT id, state FROM {occ} WHERE state IN ({states})",
        "outbox": f"""
            SELECT occurrence_id, 'UNSENT_OUTBOX' FROM {out}
            WHERE sent_at IS NULL AND {KEY} >= %(start)s AND {KEY} < %(end)s""",
        "cursor": f"""
            SELECT o.id, 'AHEAD_OF_CURSOR' FROM {cursor} c
            JOIN {occ} o ON o.schedule_id = c.schedule_id
                AND o.schedule_version = c.version AND o.scheduled_for >= c.next_run_at
            WHERE c.next_run_at < %(end)s AND NOT o.manual""",
    }


def lock_share(*tables: str) -> str:
    """SHARE on ``tables``: their writers wait until the transaction ends, readers do not."""
    return f"LOCK TABLE {', '.join(q(t) for t in tables)} IN SHARE MODE"
