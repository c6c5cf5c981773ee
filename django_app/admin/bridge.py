"""The admin's only way to change schedules: the public lifecycle API.

Maps form field names to API keyword arguments and API errors back to form fields, so the
admin never writes a Schedule row itself (versions, invalidation and the audit trail stay
in one place).
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from celery_scheduler.core.enums import ScheduleKind


def actor(request: HttpRequest | None) -> str | None:
    """Who an admin change is by, for the audit trail (``admin:<username>``)."""
    return None if request is None else f"admin:{request.user.get_username()}"


#: Form field -> lifecycle API keyword (only where the names differ).
FORM_TO_API = {
    "interval_seconds": "interval",
    "max_lateness_seconds": "max_lateness",
    "flexible_window_seconds": "flexible_window",
    "deadline_seconds": "deadline",
}
API_TO_FORM = {api: form for form, api in FORM_TO_API.items()} | {"expression": "cron"}

#: Form fields that go to the API unchanged or renamed (kind and tenant are handled apart).
API_FIELDS = (
    "name", "task", "args", "kwargs", "queue", "priority",
    "cron", "timezone", "dst_gap", "dst_fold", "interval_seconds", "run_at", "start_at",
    "end_at",
    "misfire_policy", "max_lateness_seconds", "catchup_cap", "overlap_policy",
    "flexible_window_seconds", "concurrency_limit", "concurrency_group",
    "max_attempts", "deadline_seconds",
)  # fmt: skip
TRIGGER_FIELDS = ("cron", "interval_seconds", "run_at")
DST_FIELDS = ("dst_gap", "dst_fold")


def api_values(cleaned: dict[str, Any], only: set[str] | None = None) -> dict[str, Any]:
    """API keyword arguments for cleaned form data (restricted to ``only`` form fields).

    The kind decides which trigger is sent: the other two are sent empty, so switching a
    schedule from cron to interval clears the cron instead of being rejected as ambiguous.
    """
    kind = cleaned.get("kind") or ScheduleKind.CRON.value
    active = {
        ScheduleKind.CRON.value: "cron",
        ScheduleKind.INTERVAL.value: "interval_seconds",
        ScheduleKind.ONE_OFF.value: "run_at",
    }[kind]
    values: dict[str, Any] = {}
    for name in API_FIELDS:
        if only is not None and name not in only:
            continue
        value = cleaned.get(name)
        if name in TRIGGER_FIELDS and name != active:
            value = None
        elif name in DST_FIELDS and active != "cron":
            value = None  # hidden for an interval or one-off: the API's default (none)
        elif name == "cron" and value is not None:
            value = value.strip() or None
        values[FORM_TO_API.get(name, name)] = value
    if only is not None and any(n in only for n in (*TRIGGER_FIELDS, "kind")):
        # A trigger change is sent whole: the API needs exactly one trigger to be set.
        values.update(
            {
                FORM_TO_API.get(n, n): (cleaned.get(n) if n == active else None)
                for n in TRIGGER_FIELDS
            }
        )
        values["timezone"] = cleaned.get("timezone")
    # Empty optional numbers mean "use the default", which the API spells None.
    return {k: v for k, v in values.items() if not (v is None and k not in _NULLABLE)}


# Keys that must be sent even when None, so an update can clear them.
_NULLABLE = frozenset(
    {"cron", "interval", "run_at", "concurrency_limit", "max_attempts", "deadline",
     "start_at", "end_at"}
)  # fmt: skip


def form_field_for(api_field: str | None, form_fields: set[str]) -> str | None:
    """The form field an API error belongs on, or None for a form-wide error."""
    if not api_field:
        return None
    name = API_TO_FORM.get(api_field, api_field)
    return name if name in form_fields else None
