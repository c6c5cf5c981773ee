"""What a newcomer misread in the admin (issue 27): the index order, History to the second,
the version once, a failed one-off, backfilled runs, the occurrence page's title."""

# The fixtures are imported from admin_support, so their parameters shadow the imports.
# ruff: noqa: F811

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.urls import reverse

from celery_scheduler.core.clock import SYSTEM_CLOCK
from django_app.models import Occurrence, Schedule
from tests.integration.admin_support import (  # noqa: F401 (fixtures)
    add_occurrence,
    login,
    make_schedule,
    tenants,
    users,
)

pytestmark = pytest.mark.django_db

SCHEDULE_LIST = reverse("admin:django_app_schedule_changelist")
OCC_LIST = reverse("admin:django_app_occurrence_changelist")


def change_page(client: Any, schedule: Any) -> str:
    response = client.get(reverse("admin:django_app_schedule_change", args=[schedule.pk]))
    assert response.status_code == 200
    return str(response.content.decode())


def cell(html: str, css_class: str, end: str = "</td>|form-row") -> str:
    """The first list cell or change-page row of a field (by its ``field-...`` class)."""
    found = re.search(rf'class="[^"]*field-{css_class}[^"]*">(.*?)({end})', html, re.S)
    assert found, f"no field-{css_class} in the page"
    return found.group(1)


def test_the_admin_index_lists_schedules_first(login: Any) -> None:
    response = login("root").get(reverse("admin:index"))
    [ours] = [app for app in response.context["app_list"] if app["app_label"] == "django_app"]
    names = [model["object_name"] for model in ours["models"]]
    assert names[:2] == ["Schedule", "Occurrence"], names


def test_history_shows_seconds(login: Any, make_schedule: Any) -> None:
    schedule = make_schedule(interval=10)
    now = SYSTEM_CLOCK.now().replace(microsecond=0)
    runs = [add_occurrence(schedule, minutes_ago=s / 60, now=now) for s in (10, 20, 30)]
    history = cell(change_page(login("acme"), schedule), "history", "cs-history-link")
    for run in runs:  # three rows 10 s apart, not three identical minutes
        assert f"{run.scheduled_for:%H:%M:%S}" in history


def test_the_change_page_shows_the_version_once(login: Any, make_schedule: Any) -> None:
    schedule = make_schedule(interval=10)
    state = cell(change_page(login("acme"), schedule), r"state_\w+")
    assert f"v{schedule.version}" not in state  # the Version row says it, once
    assert 'data-state="ACTIVE"' in state


def test_a_one_off_whose_only_run_went_dead_does_not_read_completed(
    login: Any, make_schedule: Any
) -> None:
    one_off = make_schedule(run_at=SYSTEM_CLOCK.now() + timedelta(hours=1))
    add_occurrence(one_off, state="DEAD", minutes_ago=1)
    Schedule.objects.filter(pk=one_off.pk).update(state="COMPLETED")
    client = login("acme")
    for state in (
        cell(client.get(SCHEDULE_LIST).content.decode(), "state_column"),
        cell(change_page(client, one_off), r"state_\w+"),
    ):
        assert 'data-state="DEAD"' in state, state
        assert 'data-state="COMPLETED"' not in state, state
        assert "did not succeed" in state


def test_a_succeeded_one_off_still_reads_completed(login: Any, make_schedule: Any) -> None:
    one_off = make_schedule(run_at=SYSTEM_CLOCK.now() + timedelta(hours=1))
    add_occurrence(one_off, state="SUCCEEDED", minutes_ago=1)
    Schedule.objects.filter(pk=one_off.pk).update(state="COMPLETED")
    state = cell(change_page(login("acme"), one_off), r"state_\w+")
    assert 'data-state="COMPLETED"' in state


def backfilled(schedule: Any, days_ago: float) -> Occurrence:
    minutes = days_ago * 24 * 60
    run = add_occurrence(schedule, minutes_ago=minutes, lag=minutes * 60)
    Occurrence.objects.filter(pk=run.pk).update(manual=True, reason="backfill")
    run.refresh_from_db()
    return run


def test_a_backfilled_run_is_labelled_a_backfill_not_a_red_lag(
    login: Any, make_schedule: Any
) -> None:
    schedule = make_schedule()
    run = backfilled(schedule, days_ago=1.8)
    client = login("acme")
    for html in (
        cell(client.get(SCHEDULE_LIST).content.decode(), "last_run_column"),
        cell(client.get(OCC_LIST, {"schedule": str(schedule.pk)}).content.decode(), "lag_column"),
        cell(change_page(client, schedule), "history", "cs-history-link"),
    ):
        assert "backfill" in html, html
        assert "cs-lag-bad" not in html, html
        assert "1.8 d" not in html, html
    page = client.get(reverse("admin:django_app_occurrence_change", args=[run.pk]))
    assert "a backfill (manual)" in page.content.decode()


def test_the_occurrence_page_title_names_the_schedule_and_the_local_time(
    login: Any, make_schedule: Any
) -> None:
    schedule = make_schedule(name="hourly report", cron="0 * * * *", timezone="Europe/Berlin")
    run = add_occurrence(schedule, minutes_ago=5)
    html = login("acme").get(reverse("admin:django_app_occurrence_change", args=[run.pk]))
    text = html.content.decode()
    title = re.search(r"<title>(.*?)</title>", text, re.S)
    assert title
    local = run.scheduled_for.astimezone(ZoneInfo("Europe/Berlin"))
    assert f"hourly report at {local:%Y-%m-%d %H:%M:%S} {local.tzname()}" in title.group(1)
    assert run.scheduled_for.isoformat() not in text  # not str(obj)'s raw timestamp
