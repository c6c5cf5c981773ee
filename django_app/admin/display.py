"""Small HTML renderers shared by the admin pages (badges, times, lag)."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from celery_scheduler.core.enums import OccurrenceState, ScheduleState
from django_app.schedules.reads import BACKFILL_REASON

SLO_SECONDS = 5.0

_TONE = {
    ScheduleState.ACTIVE.value: "ok",
    ScheduleState.PAUSED.value: "warn",
    ScheduleState.CANCELED.value: "muted",
    ScheduleState.COMPLETED.value: "muted",
    ScheduleState.PARKED.value: "bad",
    OccurrenceState.SCHEDULED.value: "info",
    OccurrenceState.ENQUEUED.value: "info",
    OccurrenceState.RUNNING.value: "run",
    OccurrenceState.RETRY_WAIT.value: "warn",
    OccurrenceState.SUCCEEDED.value: "ok",
    OccurrenceState.DEAD.value: "bad",
    OccurrenceState.MISSED.value: "bad",
    OccurrenceState.CANCELED.value: "muted",
    OccurrenceState.SKIPPED_OVERLAP.value: "muted",
}


def state_label(state: str) -> str:
    return state.replace("_", " ").capitalize()


def badge(state: str | None) -> SafeString | str:
    if not state:
        return "—"
    return format_html(
        '<span class="cs-badge cs-{}" data-state="{}">{}</span>',
        _TONE.get(state, "muted"),
        state,
        state_label(state),
    )


def zone_or_utc(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except Exception:  # a stored zone that the tzdata in use no longer knows
        return ZoneInfo("UTC")


def local_and_utc(
    value: datetime | None, zone_name: str, *, seconds: bool = False
) -> SafeString | str:
    """The instant in the schedule's zone, with UTC underneath (one format everywhere)."""
    if value is None:
        return "—"
    shape = "%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M"
    local = value.astimezone(zone_or_utc(zone_name))
    utc = value.astimezone(UTC)
    if zone_name == "UTC":
        return format_html('<span class="cs-time">{}</span>', utc.strftime(shape + " UTC"))
    return format_html(
        '<span class="cs-time">{}</span><br><small class="cs-utc">{}</small>',
        local.strftime(shape + " ") + (local.tzname() or ""),
        utc.strftime(shape + " UTC"),
    )


def instant(value: datetime | None) -> SafeString | str:
    """An exact instant, to the second, in UTC (execution times, leases)."""
    return local_and_utc(value, "UTC", seconds=True)


def lag(seconds: float | None) -> SafeString | str:
    if seconds is None:
        return "—"
    tone = "bad" if seconds > SLO_SECONDS else "ok"
    return format_html('<span class="cs-lag cs-lag-{}">{}</span>', tone, fmt_seconds(seconds))


def run_lag(seconds: float | None, reason: str) -> SafeString | str:
    """An occurrence's lag, or what it was instead: a backfill runs past times on purpose.

    A backfilled run is ``scheduled_for`` a time long gone, so its enqueue "lag" (1.8 d) is
    no lateness at all; it gets a "backfill" label rather than a red figure.
    """
    if reason == BACKFILL_REASON:
        return format_html('<span class="cs-tag cs-backfill">{}</span>', _("backfill"))
    return lag(seconds)


def fmt_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if abs(seconds) < 60:
        return f"{seconds:.2f} s"
    if abs(seconds) < 3600:
        return f"{seconds / 60:.1f} min"
    if abs(seconds) < 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def fmt_interval(seconds: int | None) -> str:
    """A whole-second period as people say it: "every 30 s", "every 1 h 30 min"."""
    if not seconds:
        return "—"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count} {unit}")
    return "every " + " ".join(parts)


def ago(value: datetime | None) -> SafeString | str:
    """'3 minutes ago', with the exact UTC instant on hover; "never" for None."""
    if value is None:
        return format_html('<span class="cs-muted">{}</span>', "never")
    seconds = max((datetime.now(UTC) - value).total_seconds(), 0)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            text = f"{int(seconds // size)} {unit}"
            break
    else:
        text = f"{int(seconds)} s"
    return format_html(
        '<span class="cs-time" title="{}">{} ago</span>',
        value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        text,
    )
