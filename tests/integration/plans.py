"""What a statement read, from PostgreSQL's own plans: for tests whose promise is a cost
that does not grow with rows the caller did not ask about. PostgreSQL only: mark the tests
``postgres`` (tests/conftest.py skips them elsewhere)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from django.db import connection


def rows_read(plan: dict[str, Any], tables: tuple[str, ...]) -> int:
    """Rows the plan's scans of ``tables`` (and of their partitions) produced or filtered
    out, over all their loops."""
    read = 0
    name = plan.get("Relation Name", "")
    if name in tables or name.startswith(
        tuple(f"{t}_p" for t in tables) + tuple(f"{t}_default" for t in tables)
    ):
        kept = plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)
        read += int(kept * plan.get("Actual Loops", 1))
    return read + sum(rows_read(child, tables) for child in plan.get("Plans", []))


def read_by(
    statements: Iterable[dict[str, Any]], tables: tuple[str, ...], *, price_out_scans: bool = True
) -> int:
    """Rows of ``tables`` the captured ``statements`` read, each run again under
    ``EXPLAIN ANALYZE``. With ``price_out_scans`` sequential scans are priced out: an index
    path must exist for each read, or it falls back to a scan and counts every row (call it
    inside the test's transaction: ``SET LOCAL``); without, the plan is the one PostgreSQL
    chooses from the tables' statistics."""
    read = 0
    with connection.cursor() as cur:
        if price_out_scans:
            cur.execute("SET LOCAL enable_seqscan = off")
        for query in statements:
            cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + query["sql"])
            (raw,) = cur.fetchone()
            plan = (raw if isinstance(raw, list) else json.loads(raw))[0]["Plan"]
            read += rows_read(plan, tables)
    return read
