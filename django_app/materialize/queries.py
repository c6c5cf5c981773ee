"""The materializers' raw SQL statements, named.

Placeholders: ``%(name)s`` with a dict where a statement has a fixed shape
(:func:`advance`). The inserts are positional ``%s``: their shape follows the rows (one
``VALUES`` group per row, or one array or scalar per column of the model), so their
parameters are a list built in the placeholders' order. Table and column names come from
the models (``Model._meta``), quoted by the connection when a statement is built.
"""

from __future__ import annotations

from typing import Any

from django.db import connection

from django_app.models import Schedule, ScheduleCursor


def _quote(name: str) -> str:
    return str(connection.ops.quote_name(name))


def insert_values_returning(model: Any, columns: list[Any], rows: int) -> str:
    """PostgreSQL and SQLite >= 3.35 (per-schedule materializer): insert ``rows`` rows of
    ``columns`` (one ``VALUES`` group each, positional), skipping any that hit a unique
    constraint; returns the pk of each row inserted."""
    names = ", ".join(_quote(str(f.column)) for f in columns)
    one = "(" + ", ".join(["%s"] * len(columns)) + ")"
    return (
        f"INSERT INTO {_quote(model._meta.db_table)} ({names}) "
        f"VALUES {', '.join([one] * rows)} "
        f"ON CONFLICT DO NOTHING RETURNING {_quote(str(model._meta.pk.column))}"
    )


def insert_ignore_one(model: Any, columns: list[Any]) -> str:
    """MySQL/MariaDB (per-schedule materializer): insert one row of ``columns``
    (positional), skipped if it hits a unique key (row count 0)."""
    names = ", ".join(_quote(str(f.column)) for f in columns)
    one = "(" + ", ".join(["%s"] * len(columns)) + ")"
    return f"INSERT IGNORE INTO {_quote(model._meta.db_table)} ({names}) VALUES {one}"


def insert_from_arrays(
    model: Any, varying: list[tuple[Any, str]], constant: list[tuple[Any, str]], rows: int
) -> str:
    """PostgreSQL (set-based materializer): ``INSERT INTO t (cols) SELECT v.*, <constants>
    FROM unnest(<arrays>) v``: one array parameter per ``varying`` column, then one scalar
    per ``constant`` column (each ``(field, PostgreSQL type)``); with no varying column,
    the constants ``rows`` times. Parameters: the constants' values, then the arrays."""
    names = ", ".join(_quote(f.column) for f, _ in varying + constant)
    arrays = ", ".join(f"%s::{kind}[]" for _, kind in varying)
    scalars = "".join(f", %s::{kind}" for _, kind in constant)
    if varying:
        source = f"SELECT v.*{scalars} FROM unnest({arrays}) AS v"
    else:
        source = f"SELECT {scalars[2:]} FROM generate_series(1, {rows})"
    return f"INSERT INTO {_quote(model._meta.db_table)} ({names}) {source}"


def returning_created(insert: str, model: Any) -> str:
    """PostgreSQL: ``insert`` skipping rows that hit a unique constraint, returning the pk
    of each row inserted."""
    return f"{insert} ON CONFLICT DO NOTHING RETURNING {_quote(model._meta.pk.column)}"


def advance() -> str:
    """PostgreSQL (set-based materializer): move the cursors of the schedules ``ids`` from
    ``cursors`` to ``nexts`` where version and cursor still match (the row count says how
    many did); a cursor with no next fire time goes inactive.

    ``c.schedule_id = ANY(ids)`` repeats the join's key as a condition on the table: without
    it PostgreSQL joined the batch's rows to a hash of every cursor in the database (a scan
    of the whole table per batch); with it, it reads the batch's cursors by their key."""
    return (
        f"UPDATE {_quote(ScheduleCursor._meta.db_table)} AS c "
        "SET next_run_at = v.next, active = v.next IS NOT NULL "
        "FROM unnest(%(ids)s::uuid[], %(versions)s::integer[], %(cursors)s::timestamptz[], "
        "%(nexts)s::timestamptz[]) "
        "AS v(id, version, cursor, next) "
        "WHERE c.schedule_id = ANY(%(ids)s::uuid[]) "
        "AND c.schedule_id = v.id AND c.version = v.version AND c.next_run_at = v.cursor "
        "AND c.active"
    )


def due_batch(*, shards: bool, lost: bool, after: bool) -> str:
    """PostgreSQL (set-based materializer): lock and read up to ``%(size)s`` due schedules
    in ``(next_run_at, id)`` order, skipping rows another node holds; the columns are
    :class:`django_app.materialize.set_based.DueSchedule`'s, in its order.

    The due cursors are read and ordered first (their own narrow table, by its index), then
    each one's schedule row is locked and read by its primary key, until ``size`` rows are
    taken. As one join, PostgreSQL planned a hash join over a scan of the whole schedule
    table for every batch (a shard's due rows are a few percent of it): each batch's read
    grew with every schedule in the database. The schedule's read is a ``LATERAL``
    subquery with its own row lock, which PostgreSQL runs once per cursor row, by key;
    rows come out in the cursors' order, so only the rows taken are locked, in that order.

    Placeholders: ``until``, ``interval`` (the kind whose ``created_at`` anchors it),
    ``size``; with ``shards`` the cursor's shard is one of ``%(shards)s``; with ``lost``
    the schedule's is none of ``%(lost)s``; with ``after`` the keyset page starts after
    ``(%(at)s, %(after_id)s)``."""
    schedule = _quote(Schedule._meta.db_table)
    cursor = _quote(ScheduleCursor._meta.db_table)
    where = ["c.active", "c.next_run_at <= %(until)s"]
    if shards:
        where.append("c.shard = ANY(%(shards)s::integer[])")
    if after:
        where.append("(c.next_run_at, c.schedule_id) > (%(at)s, %(after_id)s)")
    locked = "s.id = c.schedule_id"
    if lost:
        locked += " AND NOT (s.shard = ANY(%(lost)s::integer[]))"
    return (
        "SELECT s.*, c.next_run_at "
        f"FROM (SELECT c.schedule_id, c.next_run_at FROM {cursor} AS c "
        f"WHERE {' AND '.join(where)} ORDER BY c.next_run_at, c.schedule_id) AS c "
        "CROSS JOIN LATERAL ("
        "SELECT s.id, s.tenant_id, s.shard, s.version, s.priority, s.kind, s.cron, "
        "s.timezone, s.dst_gap, s.dst_fold, s.interval_seconds, s.run_at, s.start_at, "
        "s.end_at, s.misfire_policy, s.max_lateness_seconds, s.catchup_cap, "
        "s.flexible_window_seconds, "
        "CASE WHEN s.kind = %(interval)s THEN s.created_at END "
        f"FROM {schedule} AS s WHERE {locked} FOR UPDATE SKIP LOCKED) AS s "
        "ORDER BY c.next_run_at, c.schedule_id LIMIT %(size)s"
    )
