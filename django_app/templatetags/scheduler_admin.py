"""``{% bounded_date_hierarchy cl %}``: Django's date drill-down without a scan of the table.

Django's ``{% date_hierarchy %}`` lists the years, months or days that hold rows with a
``SELECT DISTINCT date_trunc(...)`` over every row of the list (ten million occurrences: a
full scan per page view). This tag renders the same links from the first and last instant
alone (one ``MIN``/``MAX`` query, two index probes): every year, month or day between them
is offered, including one that happens to hold no rows (its page is simply empty).
"""

from __future__ import annotations

from datetime import date, datetime, timedelta
from typing import Any

from django import template
from django.contrib.admin.templatetags.admin_list import date_hierarchy
from django.contrib.admin.templatetags.base import InclusionAdminNode
from django.db.models import Max, Min, QuerySet
from django.utils import timezone

register = template.Library()


def _buckets(first: date | datetime, last: date | datetime, kind: str) -> list[Any]:
    """The start of every year / month / day from ``first`` to ``last`` (inclusive)."""
    out: list[Any] = []
    if kind == "year":
        return [first.replace(year=y, month=1, day=1) for y in range(first.year, last.year + 1)]
    if kind == "month":
        year, month = first.year, first.month
        while (year, month) <= (last.year, last.month):
            out.append(first.replace(year=year, month=month, day=1))
            year, month = (year + 1, 1) if month == 12 else (year, month + 1)
        return out
    day = first.replace(day=first.day)
    while day <= last:
        out.append(day)
        day = day + timedelta(days=1)
    return out


class _BoundedQuerySet:
    """Answers ``dates()``/``datetimes()`` from the bounds of the real queryset."""

    def __init__(self, queryset: QuerySet[Any]) -> None:
        self._queryset = queryset
        self._found: dict[str, Any] | None = None

    def aggregate(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        found = self._queryset.aggregate(*args, **kwargs)
        if not args and set(kwargs) == {"first", "last"}:
            self._found = found  # Django's own MIN/MAX of the field: the bounds, once
        return found

    def _bounds(self, field: str) -> tuple[Any, Any]:
        if self._found is None:
            self._found = self._queryset.aggregate(first=Min(field), last=Max(field))
        return self._found["first"], self._found["last"]

    def datetimes(self, field: str, kind: str) -> list[datetime]:
        first, last = self._bounds(field)
        if first is None or last is None:
            return []
        if timezone.is_aware(first):
            first, last = timezone.localtime(first), timezone.localtime(last)
        first = first.replace(hour=0, minute=0, second=0, microsecond=0)
        return _buckets(first, last, kind)

    def dates(self, field: str, kind: str) -> list[date]:
        first, last = self._bounds(field)
        if first is None or last is None:
            return []
        return _buckets(first, last, kind)


class _BoundedChangeList:
    def __init__(self, cl: Any) -> None:
        self._cl = cl
        self.queryset = _BoundedQuerySet(cl.queryset)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cl, name)


def bounded_date_hierarchy(cl: Any) -> Any:
    return date_hierarchy(_BoundedChangeList(cl))  # type: ignore[arg-type]


@register.tag(name="bounded_date_hierarchy")
def bounded_date_hierarchy_tag(parser: Any, token: Any) -> InclusionAdminNode:
    return InclusionAdminNode(  # type: ignore[call-arg]
        parser,
        token,
        func=bounded_date_hierarchy,
        template_name="date_hierarchy.html",
        takes_context=False,
    )
