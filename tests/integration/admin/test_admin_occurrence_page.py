"""The occurrence pages are usable (issue 11 item 5): what ran, with what, how it failed."""

# The fixtures are imported from admin_support, so their parameters shadow the imports.
# ruff: noqa: F811

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.urls import reverse

from tests.integration.admin_support import (  # noqa: F401 (fixtures)
    add_occurrence,
    login,
    make_schedule,
    tenants,
    users,
)

pytestmark = pytest.mark.django_db

OCC_LIST = reverse("admin:django_app_occurrence_changelist")
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "billing/tasks.py", line 12, in create_invoice\n'
    "    raise ValueError(customer_id)\n"
    "ValueError: customer 42 has no address"
)


def change_url(occurrence: Any) -> str:
    return reverse("admin:django_app_occurrence_change", args=[occurrence.pk])


def dead_one(make_schedule: Any) -> Any:
    schedule = make_schedule(name="invoices", args=[42, "2026-11"], kwargs={"dry_run": False})
    occurrence = add_occurrence(schedule, state="DEAD", error=TRACEBACK)
    occurrence.started_at = occurrence.scheduled_for + timedelta(seconds=1)
    occurrence.finished_at = occurrence.started_at + timedelta(seconds=2, milliseconds=500)
    occurrence.save()
    return occurrence


def test_the_page_shows_task_args_traceback_duration_and_seconds(
    login: Any, make_schedule: Any
) -> None:
    occurrence = dead_one(make_schedule)
    html = login("acme").get(change_url(occurrence)).content.decode()
    assert "billing.ping" in html  # the task name
    assert "[42, &quot;2026-11&quot;]" in html
    assert "&quot;dry_run&quot;: false" in html
    assert "ValueError: customer 42 has no address" in html
    assert "line 12, in create_invoice" in html  # the whole traceback, not its last line
    assert "2.50 s" in html  # duration
    started = occurrence.started_at.strftime("%Y-%m-%d %H:%M:%S")
    assert started in html  # to the second
    assert "Occurrence id = Celery task id" in html  # the run's link to Celery's tools
    assert f'<code class="cs-mono">{occurrence.pk}</code>' in html


def test_replay_button_on_a_dead_occurrence(login: Any, make_schedule: Any) -> None:
    occurrence = dead_one(make_schedule)
    client = login("acme")
    html = client.get(change_url(occurrence)).content.decode()
    replay = reverse("admin:django_app_occurrence_replay", args=[occurrence.pk])
    assert f'action="{replay}"' in html
    response = client.post(replay, follow=True)
    occurrence.refresh_from_db()
    assert occurrence.state == "ENQUEUED"
    assert response.redirect_chain[-1][0] == change_url(occurrence)
    assert f'action="{replay}"' not in response.content.decode()  # no longer DEAD


def test_replay_needs_change_permission(login: Any, make_schedule: Any) -> None:
    occurrence = dead_one(make_schedule)
    client = login("viewer")
    replay = reverse("admin:django_app_occurrence_replay", args=[occurrence.pk])
    assert f'action="{replay}"' not in client.get(change_url(occurrence)).content.decode()
    assert client.post(replay).status_code == 403
    occurrence.refresh_from_db()
    assert occurrence.state == "DEAD"


def test_dead_letters_show_the_error_and_no_red_crosses(login: Any, make_schedule: Any) -> None:
    dead_one(make_schedule)
    html = login("acme").get(OCC_LIST, {"state__exact": "DEAD"}).content.decode()
    assert "ValueError: customer 42 has no address" in html
    assert "icon-no" not in html  # "not manual" is the ordinary case, not a failure
    # One date format: no Django default "Nov. 30, 2026, 4:49 p.m." style cells.
    assert not re.search(r"\b[A-Z][a-z]{2}\. \d{1,2}, \d{4}", html)
