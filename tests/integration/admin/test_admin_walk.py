"""No admin page answers 500 (issue 25, item 3): every admin URL of the app with odd query
strings (the field names of its forms among them: Django's add view takes them as initial
values), and the schedule add and change forms with the hostile-input table in every field.

Complements ``test_admin_malformed_params.py`` (list filters of issue 15). Counts the
requests it sends; each answer must be a page, a redirect, 400, 403 or 404.

The whole query-string walk (every page x every key x every value, 2 x ~1,700 requests) runs
on PostgreSQL, the strictest of the three about values (NUL bytes, integer range, dates).
SQLite and MariaDB get a sample of it that still sends every value to every page and every
key to every page (a value per key in turn, a key per value in turn), and every hostile value
in every form field (the saves, where the databases differ most: lengths, encodings, ranges),
the add and the change form taking turns (1,207 -> 782 requests per user there; 2,236 on
PostgreSQL).
"""

# ruff: noqa: F811

from __future__ import annotations

from typing import Any

import pytest
from django.contrib import admin
from django.db import connection
from django.urls import reverse

from django_app.models import Schedule
from tests.integration.admin.test_admin_schedules import edit_data, form_data
from tests.integration.admin_support import (  # noqa: F401 (fixtures)
    login,
    make_schedule,
    tenants,
    users,
)

pytestmark = pytest.mark.django_db

HUGE = "9" * 30
SURROGATE_JSON = '["\\ud800"]'
#: Values for any field: impossible dates, NUL, lone surrogates, huge numbers, deep JSON.
HOSTILE = [
    "2026-02-30T00:00:00Z", "2026-13-01", "25:00", "2026-01-01T00:00:00+24:00",
    "2026-01-01T10:00:00Z", "\x00", "a\x00b", SURROGATE_JSON, '{"k": "\\udfff"}',
    HUGE, "-" + HUGE, "1e999", "NaN", "[" * 2000, "x" * 5000, "", " ",
]  # fmt: skip
#: Query-string keys: the form fields (initial values of an add view) and Django's own.
QUERY_KEYS = [
    "run_at", "start_at", "end_at", "args", "kwargs", "kind", "interval_seconds", "tenant",
    "_changelist_filters", "_popup", "o",
]  # fmt: skip
#: The query-string values (a subset of HOSTILE: the walk multiplies pages by keys).
QUERY_VALUES = [
    "2026-02-30T00:00:00Z", "2026-01-01T10:00:00Z", "\x00", SURROGATE_JSON, HUGE, "[" * 2000,
]  # fmt: skip


def _app_urls(schedule: Schedule) -> list[str]:
    """Every admin page of the app: each admin's URLs that take no argument (changelist,
    add where it has one, its own extra pages) and, for a schedule, change, history and
    delete."""
    urls = []
    for model, model_admin in admin.site._registry.items():
        if model._meta.app_label != "django_app":
            continue
        info = f"admin:{model._meta.app_label}_{model._meta.model_name}"
        urls.append(reverse(f"{info}_changelist"))
        for pattern in model_admin.get_urls():
            name = getattr(pattern, "name", None)
            if name and not pattern.pattern.converters and name.startswith("django_app_"):
                urls.append(reverse(f"admin:{name}"))
    for view in ("change", "history", "delete"):
        urls.append(reverse(f"admin:django_app_schedule_{view}", args=[schedule.pk]))
    return sorted(set(urls))


def _query_strings(full: bool) -> list[tuple[str, str]]:
    """Every (key, value) pair, or a sample in which each key and each value still occurs."""
    if full:
        return [(key, value) for key in QUERY_KEYS for value in QUERY_VALUES]
    pairs = [(key, QUERY_VALUES[i % len(QUERY_VALUES)]) for i, key in enumerate(QUERY_KEYS)]
    pairs += [(QUERY_KEYS[(i + 1) % len(QUERY_KEYS)], v) for i, v in enumerate(QUERY_VALUES)]
    return sorted(set(pairs))


def test_the_sample_sends_every_key_and_every_value() -> None:
    sample = _query_strings(full=False)
    assert {key for key, _ in sample} == set(QUERY_KEYS)
    assert {value for _, value in sample} == set(QUERY_VALUES)
    assert len(sample) < len(_query_strings(full=True)) / 3


def _status(client: Any, method: str, url: str, data: dict[str, str]) -> int:
    response = getattr(client, method)(url, data)
    if response.status_code == 302 and response["Location"].startswith(url.split("?")[0]):
        return int(client.get(response["Location"]).status_code)
    return int(response.status_code)


@pytest.mark.parametrize("who", ["root", "acme"])
def test_no_admin_page_answers_500_to_odd_query_strings_or_hostile_forms(
    login: Any, make_schedule: Any, who: str
) -> None:
    client = login(who)
    client.raise_request_exception = False
    schedule = make_schedule("acme", name="walked")
    failures: list[str] = []
    sent = 0
    full = connection.vendor == "postgresql"
    query_strings = _query_strings(full=full)
    for url in _app_urls(schedule):
        for key, value in query_strings:
            status = _status(client, "get", url, {key: value})
            sent += 1
            if status not in (200, 302, 400, 403, 404):
                failures.append(f"GET {url} {key}={value[:20]!r}: HTTP {status}")
    add = reverse("admin:django_app_schedule_add")
    change = reverse("admin:django_app_schedule_change", args=[schedule.pk])
    fields = [k for k in form_data() if k != "tenant"]
    for i, field in enumerate(fields):
        for j, value in enumerate(HOSTILE):
            views = [(add, form_data()), (change, edit_data(schedule))]
            if not full:  # the sample: add and change take turns, each pair goes to one
                views = [views[(i + j) % 2]]
            for url, data in views:
                status = _status(client, "post", url, {**data, field: value})
                sent += 1
                if status not in (200, 302, 400, 403, 404):
                    failures.append(f"POST {url} {field}={value[:20]!r}: HTTP {status}")
    assert not failures, f"{len(failures)} of {sent}:\n" + "\n".join(failures[:40])
    print(f"admin walk ({who}): {sent} requests, none 5xx")


def test_a_lone_surrogate_in_args_is_a_form_error_naming_args(login: Any) -> None:
    client = login("acme")
    client.raise_request_exception = False
    response = client.post(reverse("admin:django_app_schedule_add"), form_data(args=SURROGATE_JSON))
    assert response.status_code == 200
    assert "args" in response.context["adminform"].form.errors
    assert not Schedule.objects.exists()
