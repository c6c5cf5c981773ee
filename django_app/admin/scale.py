"""What keeps the admin lists fast with a million schedules and ten million occurrences.

Every list query must be bounded by the page, never by the table:

- counts stop at :data:`COUNT_CAP` rows (``SELECT COUNT(*) FROM (... LIMIT cap + 1)``); past
  the cap the paginator uses PostgreSQL's estimate (``pg_class.reltuples`` for an
  unfiltered list, the planner's row estimate for a filtered one) and the page says
  "about"; other databases count exactly (small installs);
- the tie-breaking primary key is ordered in the direction of the sort, so one index on
  ``(column, id)`` serves the list both ways (Django appends ``-pk`` whatever the sort);
- the distinct task names of a filter are read by a loose index scan (one index probe per
  name, a recursive CTE) instead of a DISTINCT over the table.
"""

from __future__ import annotations

import json
from functools import cached_property
from typing import Any

from django.contrib.admin.views.main import ChangeList
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import Model, QuerySet

from django_app.admin import queries

#: Counts (list totals, tab badges, history) stop here; beyond it they are estimates.
COUNT_CAP = 10_000


def capped_count(queryset: QuerySet[Any], cap: int = COUNT_CAP) -> tuple[int, bool]:
    """(rows, True) when the queryset holds at most ``cap`` rows; else (cap, False)."""
    n = queryset.order_by()[: cap + 1].count()
    return (n, True) if n <= cap else (cap, False)


def count_label(queryset: QuerySet[Any], cap: int = COUNT_CAP) -> str:
    """The row count for a badge: exact up to the cap, then "10000+"."""
    n, exact = capped_count(queryset, cap)
    return str(n) if exact else f"{cap}+"


def estimated_rows(queryset: QuerySet[Any]) -> int | None:
    """PostgreSQL's estimate of the queryset's rows, or None on another database."""
    connection = connections[queryset.db]
    if connection.vendor != "postgresql":
        return None
    query = queryset.order_by().query
    with connection.cursor() as cursor:
        if not query.where:
            # Unfiltered: the table's row estimate, kept by ANALYZE and autovacuum.
            cursor.execute(queries.TABLE_ESTIMATE, {"table": queryset.model._meta.db_table})
            row = cursor.fetchone()
            if row and row[0] is not None and row[0] >= 0:
                return int(row[0])
            # -1: never analyzed; the planner still has an estimate
        sql, params = query.sql_with_params()
        cursor.execute(queries.explain(sql), params)
        plan = cursor.fetchone()[0]
    if isinstance(plan, str):
        plan = json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"])


class EstimatedCountPaginator(Paginator):
    """Exact up to :data:`COUNT_CAP`, PostgreSQL's estimate beyond (``estimated`` says which).

    A page past the first is read in two steps: the primary keys of its rows (the sort's
    index alone, ``(column, id)``, without visiting the rows it skips), then those rows.
    ``OFFSET 100000`` over whole rows would fetch and drop a hundred thousand of them.
    """

    estimated = False

    def page(self, number: Any) -> Any:
        queryset = self.object_list
        number = self.validate_number(number)
        if not isinstance(queryset, QuerySet) or number == 1:
            return super().page(number)
        bottom = (number - 1) * self.per_page
        top = min(bottom + self.per_page, self.count)
        keys = list(queryset.values_list("pk", flat=True)[bottom:top])
        rows = {row.pk: row for row in queryset.filter(pk__in=keys).order_by()}
        return self._get_page([rows[k] for k in keys if k in rows], number, self)  # type: ignore[attr-defined]

    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        if not isinstance(queryset, QuerySet):
            return super().count
        n, exact = capped_count(queryset)
        if exact:
            return n
        estimate = estimated_rows(queryset)
        if estimate is None:
            return queryset.count()  # another database: small installs count exactly
        self.estimated = True
        return max(estimate, n + 1)


class ScaleChangeList(ChangeList):
    """A changelist whose tie-breaking pk follows the sort's direction."""

    def _get_deterministic_ordering(self, ordering: list[Any]) -> list[Any]:
        ordered: list[Any] = super()._get_deterministic_ordering(ordering)  # type: ignore[misc]
        if (
            len(ordered) >= 2
            and ordered[-1] == "-pk"
            and isinstance(ordered[0], str)
            and not ordered[0].startswith("-")
        ):
            # Django adds "-pk" after an ascending sort: an index on (column, id) could not
            # serve "column ASC, id DESC" and the database would sort the whole table.
            ordered[-1] = "pk"
        return ordered


def distinct_values(
    model: type[Model], column: str, *, where: dict[str, Any], limit: int
) -> list[str]:
    """Up to ``limit`` distinct non-empty values of ``column``, in order, by a loose index
    scan: each step asks the index for the next value greater than the last one.

    ``where`` holds equality conditions (column -> value) that every row must meet; an
    index on ``(*where, column)`` makes each step one probe.
    """
    connection = connections[model._default_manager.db]
    params = list(where.values())
    sql = queries.distinct_walk(connection, model, column, list(where))
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, *params, limit])
        return [row[0] for row in cursor.fetchall()]
