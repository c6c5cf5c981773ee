"""Every bad input is a clear error naming the field, at every entry point, and writes nothing.

One table: each input class (NUL bytes, a cron longer than its column, instants near year 1
and 9999, deep nesting, enormous or non-numeric intervals, a host-only zone, an oversized
payload, ...) through each entry point that takes it: the Python API (create and update),
the admin add and change forms, the admin's live preview endpoint and every management
command with such an argument. Each row asserts the error class a user sees (ValidationError
with ``field``, a form error on the field, HTTP 400 naming the field, CommandError naming the
option) and that no row was written. ``INPUT_TABLE_OUT=path`` writes the table as Markdown.
"""

# ruff: noqa: F811

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from celery_scheduler import api, errors
from django_app.schedules import validation
from tests.integration.admin_support import (  # noqa: F401 (fixtures)
    TASK,
    login,
    make_schedule,
    tenants,
    users,
)

pytestmark = pytest.mark.django_db

PLUS1 = timezone(timedelta(hours=1))
MINUS1 = timezone(timedelta(hours=-1))
YEAR1 = datetime(1, 1, 1, tzinfo=PLUS1)  # before year 1 once converted to UTC
YEAR9999 = datetime(9999, 12, 31, 23, 59, tzinfo=MINUS1)  # after 9999 in UTC
LONG_CRON = "0," * 100 + "0 * * * *"  # valid, 209 characters: longer than the column (200)
DEPTH = 100_000
HUGE = "9" * 30


def nested_list(depth: int) -> list[Any]:
    root: list[Any] = []
    current = root
    for _ in range(depth):
        child: list[Any] = []
        current.append(child)
        current = child
    return root


# --- entry points -------------------------------------------------------------------------


@dataclass
class Seen:
    """What the user got: the error kind, the field it names and its message."""

    kind: str
    field: str
    message: str


def api_create(payload: dict[str, Any], **_: Any) -> Seen:
    values: dict[str, Any] = {"name": "n", "task": TASK, "cron": "*/5 * * * *"}
    if {"interval", "run_at"} & set(payload):
        values["cron"] = None
    values.update(payload)
    with pytest.raises(errors.ValidationError) as caught:
        api.create_schedule(**values)
    return Seen(type(caught.value).__name__, caught.value.field or "", str(caught.value))


def api_update(payload: dict[str, Any], *, schedule: Any, **_: Any) -> Seen:
    values = dict(payload)
    values.pop("tenant", None)
    values.pop("idempotency_key", None)
    with pytest.raises(errors.ValidationError) as caught:
        api.update_schedule(schedule.pk, **values)
    return Seen(type(caught.value).__name__, caught.value.field or "", str(caught.value))


FORM_BASE = {
    "name": "form job", "task": TASK, "args": "[]", "kwargs": "{}", "kind": "CRON",
    "cron": "30 2 * * *", "timezone": "UTC", "interval_seconds": "",
    "run_at_0": "", "run_at_1": "", "start_at_0": "", "start_at_1": "", "end_at_0": "",
    "end_at_1": "", "misfire_policy": "SKIP", "max_lateness_seconds": "300",
    "catchup_cap": "10", "overlap_policy": "ALLOW", "flexible_window_seconds": "0",
    "concurrency_limit": "", "concurrency_group": "", "max_attempts": "",
    "deadline_seconds": "", "queue": "", "priority": "0",
}  # fmt: skip


def _form(client: Any, url: str, payload: dict[str, str]) -> Seen:
    response = client.post(url, {**FORM_BASE, **payload})
    assert response.status_code == 200, f"expected the form again, got {response.status_code}"
    form = response.context["adminform"].form
    assert form.errors, "the form was accepted"
    field, messages = next(iter(form.errors.items()))
    return Seen("form error", field, " ".join(messages))


def admin_add(payload: dict[str, str], *, client: Any, **_: Any) -> Seen:
    return _form(client, reverse("admin:django_app_schedule_add"), payload)


def admin_change(payload: dict[str, str], *, client: Any, schedule: Any, **_: Any) -> Seen:
    return _form(client, reverse("admin:django_app_schedule_change", args=[schedule.pk]), payload)


def preview(params: dict[str, str], *, client: Any, **_: Any) -> Seen:
    query = {"kind": "CRON", "cron": "*/5 * * * *", "timezone": "UTC", **params}
    response = client.get(reverse("admin:django_app_schedule_preview"), query)
    assert response.status_code == 400, f"HTTP {response.status_code}: {response.content[:200]!r}"
    field, message = next(iter(response.json()["errors"].items()))
    return Seen("HTTP 400", field, message)


def command(argv: list[str], **_: Any) -> Seen:
    with pytest.raises(CommandError) as caught:
        call_command(*argv, stdout=StringIO(), stderr=StringIO())
    return Seen("CommandError", argv[0], str(caught.value))


ENTRY_POINTS: dict[str, Callable[..., Seen]] = {
    "API create": api_create,
    "API update": api_update,
    "admin add": admin_add,
    "admin change": admin_change,
    "preview endpoint": preview,
    "command": command,
}

# --- the table: (input class, entry point, input, what the error must name) ----------------

D1, D9 = "0001-01-01", "9999-12-31"
ROWS: list[tuple[str, str, Any, str]] = [
    # NUL bytes in every text field and inside args/kwargs
    ("NUL in name", "API create", {"name": "a\x00b"}, "name"),
    ("NUL in name", "API update", {"name": "a\x00b"}, "name"),
    ("NUL in name", "admin add", {"name": "a\x00b"}, "name"),
    ("NUL in name", "admin change", {"name": "a\x00b"}, "name"),
    ("NUL in task", "API create", {"task": "billing.ping\x00"}, "task"),
    ("NUL in task", "API update", {"task": "billing.ping\x00"}, "task"),
    ("NUL in task", "admin add", {"task": "billing.ping\x00"}, "task"),
    ("NUL in queue", "API create", {"queue": "q\x00"}, "queue"),
    ("NUL in queue", "API update", {"queue": "q\x00"}, "queue"),
    ("NUL in queue", "admin add", {"queue": "q\x00"}, "queue"),
    ("NUL in concurrency_group", "API create", {"concurrency_group": "g\x00"}, "concurrency_group"),
    ("NUL in concurrency_group", "API update", {"concurrency_group": "g\x00"}, "concurrency_group"),
    ("NUL in concurrency_group", "admin change", {"concurrency_group": "g\x00"}, "concurrency_group"),  # noqa: E501
    ("NUL in idempotency_key", "API create", {"idempotency_key": "k\x00"}, "idempotency_key"),
    ("NUL in tenant slug", "API create", {"tenant": "acme\x00"}, "tenant"),
    ("NUL in tenant slug", "command", ["import_django_celery_beat", "--tenant", "a\x00"], "--tenant"),  # noqa: E501
    ("NUL in cron", "API create", {"cron": "*/5 * * * *\x00"}, "cron"),
    ("NUL in cron", "admin add", {"cron": "*/5 * * * *\x00"}, "cron"),
    ("NUL in cron", "preview endpoint", {"cron": "*/5 * * * *\x00"}, "cron"),
    ("NUL in cron", "command", ["preview_schedule", "*/5 * * * *\x00"], "expression"),
    ("NUL in timezone", "API create", {"timezone": "UTC\x00"}, "timezone"),
    ("NUL in timezone", "admin add", {"timezone": "UTC\x00"}, "timezone"),
    ("NUL in timezone", "preview endpoint", {"timezone": "UTC\x00"}, "timezone"),
    ("NUL in timezone", "command", ["preview_schedule", "* * * * *", "--tz", "UTC\x00"], "--tz"),
    ("NUL in args", "API create", {"args": ["a\x00"]}, "args"),
    ("NUL in args", "API update", {"args": [{"k": ["a\x00"]}]}, "args"),
    ("NUL in args", "admin add", {"args": '["a\\u0000"]'}, "args"),
    ("NUL in kwargs", "API create", {"kwargs": {"k\x00": 1}}, "kwargs"),
    ("NUL in kwargs", "API update", {"kwargs": {"k": "v\x00"}}, "kwargs"),
    ("NUL in kwargs", "admin change", {"kwargs": '{"k": "\\u0000"}'}, "kwargs"),
    ("lone surrogate in name", "API create", {"name": "a\ud800"}, "name"),
    ("lone surrogate in args", "API create", {"args": ["\udfff"]}, "args"),
    # a cron longer than the column
    ("cron longer than 200", "API create", {"cron": LONG_CRON}, "cron"),
    ("cron longer than 200", "API update", {"cron": LONG_CRON}, "cron"),
    ("cron longer than 200", "admin add", {"cron": LONG_CRON}, "cron"),
    ("cron longer than 200", "preview endpoint", {"cron": LONG_CRON}, "cron"),
    ("cron longer than 200", "command", ["preview_schedule", LONG_CRON], "expression"),
    ("Unicode digit in cron", "API create", {"cron": "² * * * *"}, "cron"),
    ("Unicode digit in cron", "admin add", {"cron": "٣ * * * *"}, "cron"),
    ("Unicode digit in cron", "preview endpoint", {"cron": "① * * * *"}, "cron"),
    ("Unicode digit in cron", "command", ["preview_schedule", "² * * * *"], "expression"),
    # instants near year 1 and 9999
    ("run_at near year 1", "API create", {"run_at": YEAR1}, "run_at"),
    ("run_at near year 9999", "API create", {"run_at": YEAR9999}, "run_at"),
    ("run_at near year 9999", "API update", {"run_at": YEAR9999}, "run_at"),
    ("run_at near year 9999", "admin add", {"kind": "ONE_OFF", "run_at_0": D9, "run_at_1": "23:59"}, "run_at"),  # noqa: E501
    ("run_at near year 1", "preview endpoint", {"kind": "ONE_OFF", "run_at": f"{D1} 00:00+01:00"}, "run_at"),  # noqa: E501
    ("run_at near year 9999", "preview endpoint", {"kind": "ONE_OFF", "run_at": f"{D9} 23:59"}, "run_at"),  # noqa: E501
    ("start_at near year 1", "API create", {"start_at": YEAR1}, "start_at"),
    ("start_at near year 9999", "API create", {"interval": 60, "start_at": YEAR9999}, "start_at"),
    ("start_at near year 9999", "API update", {"start_at": YEAR9999}, "start_at"),
    ("start_at near year 1", "admin add", {"start_at_0": D1, "start_at_1": "00:00"}, "start_at"),
    ("start_at near year 9999", "admin change", {"start_at_0": D9, "start_at_1": "23:59"}, "start_at"),  # noqa: E501
    ("start_at near year 9999", "preview endpoint", {"kind": "INTERVAL", "interval_seconds": "60", "start_at": f"{D9} 23:59"}, "start_at"),  # noqa: E501
    ("end_at near year 9999", "API create", {"end_at": YEAR9999}, "end_at"),
    ("end_at near year 9999", "API update", {"end_at": YEAR9999}, "end_at"),
    ("end_at near year 9999", "admin add", {"end_at_0": D9, "end_at_1": "23:59"}, "end_at"),
    ("preview start near year 1", "preview endpoint", {"from": f"{D1} 00:00"}, "from"),
    ("preview start near year 9999", "preview endpoint", {"from": f"{D9} 23:59"}, "from"),
    ("preview start near year 1", "command", ["preview_schedule", "* * * * *", "--start", f"{D1}T00:00+01:00"], "--start"),  # noqa: E501
    ("preview start near year 9999", "command", ["preview_schedule", "* * * * *", "--tz", "Asia/Tokyo", "--start", f"{D9}T23:59"], "--start"),  # noqa: E501
    ("reconcile window near year 1", "command", ["reconcile", "--from", f"{D1}T00:00+01:00", "--to", "2026-01-01T00:00Z"], "--from"),  # noqa: E501
    ("reconcile window near year 9999", "command", ["reconcile", "--from", "2026-01-01T00:00Z", "--to", f"{D9}T23:59-01:00"], "--to"),  # noqa: E501
    ("--older-than past year 1", "command", ["prune_occurrences", "--older-than", "99999999999"], "--older-than"),  # noqa: E501
    ("--older-than past year 1", "command", ["prune_occurrences", "--older-than", "1", "--idempotency-older-than", "800000"], "--idempotency-older-than"),  # noqa: E501
    ("--older-than not ASCII digits", "command", ["prune_occurrences", "--older-than", "٣"], "--older-than"),  # noqa: E501
    # deeply nested args / kwargs
    ("deeply nested args", "API create", {"args": nested_list(DEPTH)}, "args"),
    ("deeply nested args", "API update", {"kwargs": {"k": nested_list(DEPTH)}}, "kwargs"),
    ("deeply nested args", "admin add", {"args": "[" * DEPTH + "]" * DEPTH}, "args"),
    ("deeply nested args", "admin change", {"kwargs": '{"k": ' + "[" * DEPTH + "]" * DEPTH + "}"}, "kwargs"),  # noqa: E501
    # payload size
    ("args over the size limit", "API create", {"args": ["x" * 70_000]}, "args"),
    ("args over the size limit", "API update", {"kwargs": {"blob": "x" * 70_000}}, "kwargs"),
    ("args over the size limit", "admin add", {"args": json.dumps(["x" * 70_000])}, "args"),
    # enormous, non-numeric and zero intervals
    ("enormous interval", "API create", {"interval": 10**30}, "interval"),
    ("enormous interval", "API update", {"interval": timedelta(days=10**8)}, "interval"),
    ("enormous interval", "admin add", {"kind": "INTERVAL", "interval_seconds": HUGE}, "interval_seconds"),  # noqa: E501
    ("enormous interval", "preview endpoint", {"kind": "INTERVAL", "interval_seconds": HUGE}, "interval_seconds"),  # noqa: E501
    ("non-numeric interval", "API create", {"interval": "every minute"}, "interval"),
    ("non-numeric interval", "API update", {"interval": float("nan")}, "interval"),
    ("non-numeric interval", "admin add", {"kind": "INTERVAL", "interval_seconds": "abc"}, "interval_seconds"),  # noqa: E501
    ("non-numeric interval", "preview endpoint", {"kind": "INTERVAL", "interval_seconds": "²"}, "interval_seconds"),  # noqa: E501
    ("interval=0", "API create", {"interval": 0}, "interval"),
    ("interval=0", "API update", {"interval": 0}, "interval"),
    ("interval=0", "admin add", {"kind": "INTERVAL", "interval_seconds": "0"}, "interval_seconds"),
    ("interval=0", "preview endpoint", {"kind": "INTERVAL", "interval_seconds": "0"}, "interval_seconds"),  # noqa: E501
    # a zone that is not an IANA name
    ("zone 'localtime'", "API create", {"timezone": "localtime"}, "timezone"),
    ("zone 'localtime'", "API update", {"timezone": "localtime"}, "timezone"),
    ("zone 'localtime'", "admin add", {"timezone": "localtime"}, "timezone"),
    ("zone 'localtime'", "admin change", {"timezone": "localtime"}, "timezone"),
    ("zone 'localtime'", "preview endpoint", {"timezone": "localtime"}, "timezone"),
    ("zone 'localtime'", "command", ["preview_schedule", "* * * * *", "--tz", "localtime"], "--tz"),
]  # fmt: skip


def _counts() -> dict[str, int]:
    from django_app.models import Occurrence, OutboxEntry, Schedule, ScheduleVersion, Tenant

    return {
        m.__name__: m.objects.count()
        for m in (Schedule, ScheduleVersion, Occurrence, OutboxEntry, Tenant)
    }


def _row_id(row: tuple[str, str, Any, str]) -> str:
    return f"{row[0]} | {row[1]}"


def _run(
    row: tuple[str, str, Any, str], login: Any, make_schedule: Any
) -> tuple[Seen, dict[str, int], dict[str, int]]:
    _, entry, payload, _ = row
    schedule = make_schedule("acme", name="existing", cron="*/5 * * * *")
    before, version = _counts(), schedule.version
    seen = ENTRY_POINTS[entry](payload, client=login("root"), schedule=schedule)
    schedule.refresh_from_db()
    after = _counts()
    assert after == before, "rows were written"
    assert schedule.version == version, "the schedule changed"
    return seen, before, after


@pytest.mark.parametrize("row", ROWS, ids=_row_id)
def test_bad_input_is_an_error_naming_the_field_and_writes_nothing(
    row: tuple[str, str, Any, str], login: Any, make_schedule: Any
) -> None:
    seen, _, _ = _run(row, login, make_schedule)
    expected = row[3]
    if seen.kind == "CommandError":
        # The cron argument has no option name: the message names the cron or its field.
        names = ("cron", "Cron", "field") if expected == "expression" else (expected,)
        assert any(name in seen.message for name in names), seen.message
    else:
        assert seen.field == expected, f"{seen.kind} on {seen.field!r}: {seen.message}"
    assert len(seen.message) < 400, "the message should be short enough to read"


@pytest.mark.skipif(not os.environ.get("INPUT_TABLE_OUT"), reason="set INPUT_TABLE_OUT=path")
def test_write_the_table(login: Any, make_schedule: Any) -> None:
    lines = [
        "| input class | entry point | error the user sees | rows before = after "
        "(schedule/version/occurrence/outbox/tenant) |",
        "|---|---|---|---|",
    ]
    for row in ROWS:
        seen, before, after = _run(row, login, make_schedule)
        message = seen.message.replace("|", "\\|").replace("\n", " ").replace("\x00", "\\x00")
        message = message if len(message) <= 110 else message[:107] + "..."
        counts = "/".join(str(before[k]) for k in before), "/".join(str(after[k]) for k in after)
        lines.append(
            f"| {row[0]} | {row[1]} | {seen.kind} `{seen.field}`: {message} | "
            f"{counts[0]} = {counts[1]} |"
        )
    with open(os.environ["INPUT_TABLE_OUT"], "w", encoding="utf-8") as out:
        out.write("\n".join(lines) + "\n")


def test_the_size_limit_is_a_setting(settings: Any, make_schedule: Any) -> None:
    settings.CELERY_SCHEDULER = {"max_arguments_bytes": 100}
    with pytest.raises(errors.InvalidArguments) as caught:
        make_schedule("acme", args=["x" * 200])
    assert caught.value.field == "args"
    assert "100 bytes" in str(caught.value)
    settings.CELERY_SCHEDULER = {"max_arguments_bytes": 1_000_000}
    assert make_schedule("acme", args=["x" * 200_000]).args == ["x" * 200_000]


def test_sane_edges_still_work(make_schedule: Any) -> None:
    """The limits do not reject what is legitimate."""
    year = datetime.now(UTC).year
    far = datetime(year + 50, 1, 1, tzinfo=UTC)
    assert make_schedule("acme", interval=366 * 86400).interval_seconds == 366 * 86400
    assert make_schedule("acme", cron="0 0 1 1 *", end_at=far).end_at == far
    # nested_list(n) is n + 1 levels, and the args list around it one more.
    deep = 50 if validation.max_json_depth() > 51 else validation.max_json_depth() - 2
    assert make_schedule("acme", args=[nested_list(deep)]).args == [nested_list(deep)]
    assert make_schedule("acme", cron=" ".join(["0,1,2,3,4,5,6,7,8,9"] * 2 + ["*"] * 3))
