"""Numbers for the overview page, scoped to the viewer's tenant.

Lag percentiles are the nearest-rank percentiles of the newest ``MAX_LAG_ROWS`` enqueued
occurrences of the last hour: ``percentile_disc`` in PostgreSQL, in Python elsewhere (the
same answer on the same rows). Every count stops at ``COUNT_CAP`` rows (the page says
"100000+"), so the page costs the same at ten million occurrences as at ten thousand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import Count, Min, Q, QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from celery_scheduler.core.enums import OccurrenceState, ScheduleState
from django_app.admin import queries
from django_app.admin.scale import capped_count
from django_app.admin.tenancy import scope
from django_app.models import Occurrence, OutboxEntry, Schedule
from django_app.querysets import OccurrenceQuerySet

MAX_LAG_ROWS = 20_000
#: Each count on the page stops here ("100000+"): a count must not read ten million rows.
COUNT_CAP = 100_000
LAG_WINDOW = timedelta(hours=1)
STATE_WINDOW = timedelta(hours=24)
PENDING = (OccurrenceState.SCHEDULED, OccurrenceState.ENQUEUED, OccurrenceState.RETRY_WAIT)


@dataclass
class Overview:
    now: datetime
    state_counts: list[tuple[str, int]]
    schedule_counts: list[tuple[str, int]]
    dead_total: int
    outbox_backlog: int
    outbox_due: int
    oldest_unsent: datetime | None
    oldest_pending: Occurrence | None
    lag_samples: int
    lag_p50: float | None
    lag_p95: float | None
    lag_p99: float | None
    lag_by_minute: list[tuple[int, float | None]] = field(default_factory=list)
    #: Names of the counts above that stopped at COUNT_CAP: "state:<S>", "schedule:<S>",
    #: "dead".
    capped: frozenset[str] = frozenset()

    @property
    def oldest_unsent_age(self) -> float | None:
        if self.oldest_unsent is None:
            return None
        return (self.now - self.oldest_unsent).total_seconds()

    @property
    def oldest_pending_age(self) -> float | None:
        if self.oldest_pending is None:
            return None
        return (self.now - self.oldest_pending.available_at).total_seconds()

    @property
    def max_state_count(self) -> int:
        return max((c for _, c in self.state_counts), default=0) or 1


def nearest_rank(sorted_values: list[float], percent: float) -> float | None:
    """The nearest-rank percentile (same as SQL ``percentile_disc``)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(percent / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def _window(occurrences: OccurrenceQuerySet, now: datetime) -> QuerySet[Any]:
    """The newest MAX_LAG_ROWS enqueued occurrences of the last hour."""
    return occurrences.sent_scheduled_between(now - LAG_WINDOW, now).values_list(
        "scheduled_for", "enqueued_at"
    )[:MAX_LAG_ROWS]


def _lag_rows(occurrences: OccurrenceQuerySet, now: datetime) -> list[tuple[datetime, float]]:
    rows = _window(occurrences, now)
    return [(s, (e - s).total_seconds()) for s, e in rows if e is not None]


def _sql_summary(
    occurrences: OccurrenceQuerySet, now: datetime
) -> tuple[int, list[float | None], dict[int, float]]:
    """(samples, p50/p95/p99, worst lag per minute ago) computed by PostgreSQL over the same
    rows as the Python path: reading tens of thousands of rows into Python takes seconds."""
    inner_sql, params = _window(occurrences, now).query.sql_with_params()
    # One read of the rows: a materialized CTE feeds the percentiles and the per-minute max.
    with connection.cursor() as cursor:
        cursor.execute(queries.lag_summary(inner_sql), [*params, now])
        count, values, minutes = cursor.fetchone()
    worst = {int(m): float(v) for m, v in (minutes or []) if v is not None}
    percentiles = [float(v) if v is not None else None for v in (values or [None, None, None])]
    return int(count), percentiles, worst


def lag_percentiles(
    occurrences: OccurrenceQuerySet, now: datetime, *, use_sql: bool | None = None
) -> tuple[int, list[float | None], list[tuple[int, float | None]]]:
    """(samples, [p50, p95, p99], worst lag per minute for the last 60 minutes), over the
    newest MAX_LAG_ROWS enqueued occurrences of the last hour (in SQL on PostgreSQL)."""
    if use_sql is None:
        use_sql = connection.vendor == "postgresql"
    if use_sql:
        samples, percentiles, worst = _sql_summary(occurrences, now)
    else:
        rows = _lag_rows(occurrences, now)
        lags = sorted(lag for _, lag in rows)
        samples, percentiles, worst = len(rows), [nearest_rank(lags, p) for p in (50, 95, 99)], {}
        for scheduled_for, lag in rows:
            minute = int((now - scheduled_for).total_seconds() // 60)
            worst[minute] = max(worst.get(minute, lag), lag)
    by_minute = [(m, worst.get(m)) for m in range(59, -1, -1)]
    return samples, percentiles, by_minute


def _capped(queryset: QuerySet[Any]) -> tuple[int, bool]:
    """(rows, True when the count stopped at COUNT_CAP)."""
    n, exact = capped_count(queryset, COUNT_CAP)
    return n, not exact


def collect(request: HttpRequest, *, now: datetime) -> Overview:
    occurrences = scope(request, Occurrence.objects.all())
    capped: set[str] = set()
    # One bounded count per state (the (state, scheduled_for) and (state, id) indexes),
    # where a GROUP BY would read every row of the day and every schedule.
    recent: dict[str, int] = {}
    for state in OccurrenceState:
        n, over = _capped(
            occurrences.filter(state=state.value, scheduled_for__gte=now - STATE_WINDOW)
        )
        recent[state.value] = n
        if over:
            capped.add(f"state:{state.value}")
    schedules: dict[str, int] = {}
    for schedule_state in ScheduleState:
        n, over = _capped(scope(request, Schedule.objects.filter(state=schedule_state.value)))
        schedules[schedule_state.value] = n
        if over:
            capped.add(f"schedule:{schedule_state.value}")
    dead_total, over = _capped(occurrences.filter(state=OccurrenceState.DEAD.value))
    if over:
        capped.add("dead")
    outbox = scope(request, OutboxEntry.objects.unsent())
    backlog = outbox.aggregate(
        n=Count("id"),
        # Waiting means due and unsent: a row planned for later is not late yet.
        oldest=Min("available_at", filter=Q(available_at__lte=now)),
    )
    samples, (p50, p95, p99), by_minute = lag_percentiles(occurrences, now)
    return Overview(
        now=now,
        state_counts=[(s.value, recent.get(s.value, 0)) for s in OccurrenceState],
        schedule_counts=[(s.value, schedules.get(s.value, 0)) for s in ScheduleState],
        dead_total=dead_total,
        outbox_backlog=backlog["n"],
        outbox_due=outbox.filter(available_at__lte=now).count(),
        oldest_unsent=backlog["oldest"],
        oldest_pending=occurrences.filter(
            state__in=[s.value for s in PENDING], available_at__lte=now
        )
        .select_related("schedule")
        .order_by("available_at")
        .first(),
        lag_samples=samples,
        lag_p50=p50,
        lag_p95=p95,
        lag_p99=p99,
        lag_by_minute=by_minute,
        capped=frozenset(capped),
    )


def lag_chart_svg(
    by_minute: list[tuple[int, float | None]], *, slo_seconds: float, width: int = 640
) -> SafeString:
    """A bar per minute (worst schedule lag), with the SLO as a dashed line. No JavaScript."""
    height, top, bottom, left = 150, 10, 20, 36
    plot_h = height - top - bottom
    values = [v for _, v in by_minute if v is not None]
    ceiling = max([slo_seconds * 1.5, *values]) if values else slo_seconds * 1.5
    bar_w = (width - left) / max(len(by_minute), 1)

    def y(value: float) -> float:
        return top + plot_h - plot_h * max(value, 0.0) / ceiling

    # format_html escapes its arguments into strings, so numbers are formatted first.
    bars = format_html_join(
        "",
        '<rect x="{}" y="{}" width="{}" height="{}" class="{}">'
        "<title>{} min ago: worst lag {} s</title></rect>",
        (
            (
                f"{left + i * bar_w + 1:.1f}",
                f"{y(value):.1f}",
                f"{max(bar_w - 2, 1):.1f}",
                f"{top + plot_h - y(value):.1f}",
                "cs-bar-bad" if value > slo_seconds else "cs-bar-ok",
                minute,
                f"{value:.2f}",
            )
            for i, (minute, value) in enumerate(by_minute)
            if value is not None
        ),
    )
    slo_y = y(slo_seconds)
    return format_html(
        '<svg class="cs-chart" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" '
        'aria-label="Worst schedule lag per minute, last hour">'
        '<line x1="{l}" y1="{base}" x2="{w}" y2="{base}" class="cs-axis"/>'
        '<line x1="{l}" y1="{slo}" x2="{w}" y2="{slo}" class="cs-slo"/>'
        '<text x="{l2}" y="{slo_t}" class="cs-label">SLO {s} s</text>'
        '<text x="0" y="{top_t}" class="cs-label">{c} s</text>'
        '<text x="0" y="{base}" class="cs-label">0 s</text>'
        '<text x="{l}" y="{h}" class="cs-label">-60 min</text>'
        '<text x="{w}" y="{h}" text-anchor="end" class="cs-label">now</text>'
        "{bars}</svg>",
        w=width,
        h=height,
        l=left,
        l2=left + 4,
        base=top + plot_h,
        slo=f"{slo_y:.1f}",
        slo_t=f"{slo_y - 3:.1f}",
        s=f"{slo_seconds:g}",
        top_t=top + 8,
        c=f"{ceiling:.1f}",
        bars=bars,
    )
