"""The admin's raw SQL statements, named (PostgreSQL's estimates and summaries, and the
distinct-values walk every database runs).

Placeholders: ``%(name)s`` with a dict where a statement stands alone
(:data:`TABLE_ESTIMATE`). The others are positional ``%s``: they wrap SQL the ORM compiled
(``QuerySet.query.sql_with_params()``, positional) or repeat a condition per column given,
and one statement cannot mix the two styles; their parameters are listed in each
docstring, in order. Table and column names come from the models, quoted by the connection
of the statement's database.
"""

from __future__ import annotations

from typing import Any

#: PostgreSQL: the ``table``'s row estimate, kept by ANALYZE and autovacuum (-1: never
#: analyzed).
TABLE_ESTIMATE = "SELECT reltuples::bigint FROM pg_class WHERE oid = %(table)s::regclass"


def explain(sql: str) -> str:
    """PostgreSQL: the plan of ``sql`` (ORM-compiled; its parameters) as JSON."""
    return "EXPLAIN (FORMAT JSON) " + sql


def lag_summary(window: str) -> str:
    """PostgreSQL (overview): over the rows of ``window`` (ORM-compiled, yielding
    ``scheduled_for, enqueued_at``): their count, the p50/p95/p99 of their lag, and the worst
    lag per minute before ``now``. A materialized CTE reads the rows once. Parameters: the
    window's, then ``now``."""
    return (
        f"WITH w AS MATERIALIZED (SELECT x.scheduled_for AS at, "
        f"EXTRACT(EPOCH FROM (x.enqueued_at - x.scheduled_for)) AS lag "
        f"FROM ({window}) AS x) "
        f"SELECT (SELECT COUNT(*) FROM w), "
        f"(SELECT percentile_disc(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY lag) FROM w), "
        f"(SELECT array_agg(ARRAY[m, worst]) FROM (SELECT FLOOR(EXTRACT(EPOCH FROM (%s - at)) "
        f"/ 60) AS m, MAX(lag) AS worst FROM w GROUP BY 1) AS g)"
    )


def distinct_walk(connection: Any, model: Any, column: str, where: list[str]) -> str:
    """Any database: the distinct non-empty values of ``column`` in ``model``'s table, in
    order, one index probe per step (a recursive CTE), under equality conditions on the
    ``where`` columns. Parameters: the ``where`` values, the same again, then the limit."""
    quote = connection.ops.quote_name
    table, col = quote(model._meta.db_table), quote(column)
    conditions = "".join(f" AND {quote(k)} = %s" for k in where)
    return (
        f"WITH RECURSIVE walk (v, n) AS ("
        f" SELECT MIN({col}), 1 FROM {table} WHERE {col} > ''{conditions}"
        f" UNION ALL"
        f" SELECT (SELECT MIN({col}) FROM {table} WHERE {col} > walk.v{conditions}), n + 1"
        f" FROM walk WHERE walk.v IS NOT NULL AND n < %s"
        f") SELECT v FROM walk WHERE v IS NOT NULL"
    )
