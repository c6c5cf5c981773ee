"""Admin views outside the ModelAdmin CRUD: the fire-time preview (JSON) and the overview.

Both are wired by ``ScheduleAdmin.get_urls`` behind ``admin_site.admin_view`` (login, staff,
CSRF) and are scoped to the user's tenant like every other admin page.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, JsonResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone as dj_timezone
from django.utils.dateparse import parse_datetime

from celery_scheduler import errors
from celery_scheduler.core import timemath
from celery_scheduler.core.clock import Clock, SystemClock
from celery_scheduler.core.enums import ScheduleKind
from django_app.admin import display
from django_app.admin import overview as overview_stats
from django_app.admin.tenancy import has_scope, scope
from django_app.models import Schedule

PREVIEW_COUNT = 10
#: Tests replace this to pin "now"; the admin never reads the wall clock elsewhere.
clock: Clock = SystemClock()


def _local_datetime(text: str, zone: Any, field: str) -> datetime | None:
    """Parse "YYYY-MM-DD[ HH:MM[:SS]]" (or ISO with offset); naive input is read in ``zone``."""
    text = text.strip()
    if not text:
        return None
    if len(text) == 10:
        text += " 00:00"
    try:
        value = parse_datetime(text.replace("T", " "))
    except ValueError:  # well formed but impossible, e.g. 2026-02-30
        value = None
    if value is None:
        raise errors.InvalidTiming(
            f"{text[:40]!r} is not a date and time (YYYY-MM-DD HH:MM)", field=field
        )
    if value.tzinfo is None:
        value = timemath.wall_instant(value, zone)[0]  # a wall time in a gap: its end
    return timemath.check_instant(value, field)


def _trigger(params: Mapping[str, str], now: datetime) -> timemath.Trigger:
    kind = params.get("kind") or ScheduleKind.CRON.value
    tz_name = (params.get("timezone") or "UTC").strip()
    if kind == ScheduleKind.CRON.value:
        gap, fold = timemath.dst_policy(params.get("dst_gap"), params.get("dst_fold"), cron=True)
        cron = " ".join(params.get("cron", "").split())
        return timemath.trigger_of(kind, cron=cron, timezone=tz_name, dst_gap=gap, dst_fold=fold)
    default_zone = dj_timezone.get_current_timezone()
    if kind == ScheduleKind.INTERVAL.value:
        every = timemath.parse_interval(params.get("interval_seconds") or "", "interval_seconds")
        anchor = _local_datetime(params.get("start_at", ""), default_zone, "start_at") or now
        return timemath.trigger_of(kind, every=every, anchor=anchor)
    if kind == ScheduleKind.ONE_OFF.value:
        run_at = _local_datetime(params.get("run_at", ""), default_zone, "run_at")
        if run_at is None:
            raise errors.InvalidTiming("Pick the date and time to run at.", field="run_at")
        return timemath.trigger_of(kind, run_at=run_at)
    raise errors.ValidationError(f"Unknown kind {kind!r}.", field="kind")


def _row(row: timemath.PreviewRow) -> dict[str, Any]:
    return {
        "utc": row.utc.isoformat(),
        "local": row.local.isoformat(),
        "utc_display": row.utc.strftime("%Y-%m-%d %H:%M UTC"),
        "local_display": row.local.strftime("%a %d %b %Y %H:%M ") + (row.local.tzname() or ""),
        "note": row.note,
        "dst": bool(row.note),
    }


def preview_payload(params: Mapping[str, str], *, now: datetime) -> tuple[dict[str, Any], int]:
    """The preview answer for form values ``params``: (JSON body, HTTP status)."""
    try:
        trigger = _trigger(params, now)
        zone = trigger.zone if isinstance(trigger, timemath.CronTrigger) else UTC
        start = _local_datetime(params.get("from", ""), zone, "from") or now
        start_at = _local_datetime(
            params.get("start_at", ""), dj_timezone.get_current_timezone(), "start_at"
        )
        start = max(start, start_at or start)
        # Runs from the start on, itself included ("Preview from"; a run at start_at).
        rows = timemath.preview(
            trigger, start=start - timedelta(microseconds=1), count=PREVIEW_COUNT
        )
        description = ""
        if isinstance(trigger, timemath.CronTrigger):
            description = timemath.describe_cron(trigger.expression)
            if trigger.timezone != "UTC":
                description += f" ({trigger.timezone})"
            description += timemath.describe_dst(trigger)
        elif isinstance(trigger, timemath.IntervalTrigger):
            description = f"Every {_duration(trigger.every)}, elapsed time (DST does not apply)"
        else:
            description = "Once"
    except errors.ValidationError as exc:
        field = {"interval": "interval_seconds", "expression": "cron"}.get(
            exc.field or "", exc.field or "cron"
        )
        return {"ok": False, "errors": {field: str(exc)}}, 400
    return {
        "ok": True,
        "description": description,
        "from": start.isoformat(),
        "rows": [_row(r) for r in rows],
    }, 200


def _duration(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds % size == 0 and seconds >= size:
            n = seconds // size
            return f"{n} {unit}{'s' if n != 1 else ''}"
    return f"{seconds} seconds"


def schedule_preview(request: HttpRequest, model_admin: Any) -> JsonResponse:
    """GET admin/django_app/schedule/preview/?kind=CRON&cron=...&timezone=...&from=..."""
    if not has_scope(request) or not (
        model_admin.has_add_permission(request) or model_admin.has_view_permission(request)
    ):
        raise PermissionDenied
    schedule_id = request.GET.get("schedule")
    params: dict[str, str] = {k: str(v) for k, v in request.GET.items()}
    if schedule_id:
        # Previewing a stored schedule: only one the user can see, with its stored timing.

        try:
            pk = uuid.UUID(schedule_id)
        except ValueError:
            return JsonResponse(
                {"ok": False, "errors": {"schedule": "Not a schedule id."}}, status=400
            )
        schedule = scope(request, Schedule.objects.all()).filter(pk=pk).first()
        if schedule is None:
            return JsonResponse({"ok": False, "errors": {"schedule": "Not found."}}, status=404)
        params = {
            "kind": schedule.kind,
            "cron": schedule.cron,
            "timezone": schedule.timezone,
            "dst_gap": schedule.dst_gap,
            "dst_fold": schedule.dst_fold,
            "interval_seconds": str(schedule.interval_seconds or ""),
            "run_at": schedule.run_at.isoformat() if schedule.run_at else "",
            "start_at": schedule.start_at.isoformat() if schedule.start_at else "",
            "from": str(request.GET.get("from", "")),
        }
    body, status = preview_payload(params, now=clock.now())
    return JsonResponse(body, status=status)


def overview(request: HttpRequest, model_admin: Any) -> TemplateResponse:
    """Occurrence states, outbox backlog, oldest pending work and schedule lag, per tenant."""
    if not has_scope(request) or not model_admin.has_view_permission(request):
        raise PermissionDenied
    stats = overview_stats.collect(request, now=clock.now())
    occurrences_url = reverse("admin:django_app_occurrence_changelist")
    context = {
        **model_admin.admin_site.each_context(request),
        "title": "Scheduler overview",
        "opts": model_admin.opts,
        "stats": stats,
        "lag": {
            "p50": display.fmt_seconds(stats.lag_p50),
            "p95": display.fmt_seconds(stats.lag_p95),
            "p99": display.fmt_seconds(stats.lag_p99),
            "p99_bad": (stats.lag_p99 or 0) > display.SLO_SECONDS,
        },
        "oldest_unsent_age": display.fmt_seconds(stats.oldest_unsent_age),
        "oldest_pending_age": display.fmt_seconds(stats.oldest_pending_age),
        "oldest_pending_badge": display.badge(
            stats.oldest_pending.state if stats.oldest_pending else None
        ),
        "state_rows": [
            (
                state,
                display.badge(state),
                f"{count}+" if f"state:{state}" in stats.capped else count,
                round(100 * count / stats.max_state_count),
                f"{occurrences_url}?state__exact={state}",
            )
            for state, count in stats.state_counts
        ],
        "schedule_rows": [
            (s, display.badge(s), f"{n}+" if f"schedule:{s}" in stats.capped else n)
            for s, n in stats.schedule_counts
        ],
        "dead_capped": "dead" in stats.capped,
        "chart": overview_stats.lag_chart_svg(stats.lag_by_minute, slo_seconds=display.SLO_SECONDS),
    }
    return TemplateResponse(request, "admin/django_app/overview.html", context)
