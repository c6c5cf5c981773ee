"""The schedule list tells the truth at a glance (issue 11 item 4).

A schedule that goes DEAD every 30 s must not read "Scheduled" because its newest row is a
future SCHEDULED one; "Next run" is the next pending occurrence, not the internal cursor one
period later; last success and last failure are shown; the task choice hides the
scheduler's own tasks.
"""

# The fixtures are imported from admin_support, so their parameters shadow the imports.
# ruff: noqa: F811

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from celery_scheduler.core.clock import SYSTEM_CLOCK
from tests.integration.admin_support import (  # noqa: F401 (fixtures)
    add_occurrence,
    login,
    make_schedule,
    tenants,
    users,
)

pytestmark = pytest.mark.django_db(transaction=False)

LIST = reverse("admin:django_app_schedule_changelist")


def row_of(html: str, name: str) -> str:
    start = html.index(name)
    return html[start : html.index("</tr>", start)]


def test_a_failing_schedule_reads_dead_not_scheduled(login: Any, make_schedule: Any) -> None:
    schedule = make_schedule(name="flaky export", interval=30)
    add_occurrence(schedule, state="SUCCEEDED", minutes_ago=3)
    add_occurrence(schedule, state="DEAD", minutes_ago=1, error="ValueError: bad row")
    pending = add_occurrence(schedule, state="SCHEDULED", minutes_ago=-0.5, lag=None)
    add_occurrence(schedule, state="CANCELED", minutes_ago=-2, lag=None)

    row = row_of(login("acme").get(LIST).content.decode(), "flaky export")

    last_run = re.search(r'data-column="last-run".*?</td>', row, re.S)
    assert last_run is not None, row
    assert 'data-state="DEAD"' in last_run.group(0)
    assert 'data-state="SCHEDULED"' not in last_run.group(0)
    assert 'data-state="CANCELED"' not in last_run.group(0)
    next_run = re.search(r'data-column="next-run".*?</td>', row, re.S)
    assert next_run is not None
    assert pending.scheduled_for.strftime("%H:%M") in next_run.group(0)
    outcomes = re.search(r'data-column="outcomes".*?</td>', row, re.S)
    assert outcomes is not None
    assert "success" in outcomes.group(0)
    assert "failure" in outcomes.group(0)


def test_next_run_falls_back_to_the_cursor_when_nothing_is_planned(
    login: Any, make_schedule: Any
) -> None:
    schedule = make_schedule(name="weekly digest", cron="0 9 * * 1")
    row = row_of(login("acme").get(LIST).content.decode(), "weekly digest")
    next_run = re.search(r'data-column="next-run".*?</td>', row, re.S)
    assert next_run is not None
    assert schedule.next_run_at.strftime("%Y-%m-%d %H:%M") in next_run.group(0)


def test_the_list_costs_a_fixed_number_of_queries(login: Any, make_schedule: Any) -> None:
    client = login("acme")

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert client.get(LIST).status_code == 200
        return len(captured)

    first = make_schedule(interval=60)
    add_occurrence(first, state="SUCCEEDED")
    few = queries()
    now = SYSTEM_CLOCK.now()
    for i in range(10):
        schedule = make_schedule(interval=60 + i)
        add_occurrence(schedule, state="DEAD", now=now - timedelta(minutes=i))
    assert queries() == few  # per page, not per row


def test_task_choices_hide_the_scheduler_internals(login: Any) -> None:
    html = login("acme").get(reverse("admin:django_app_schedule_add")).content.decode()
    assert "celery_scheduler.run_occurrence" not in html
    assert '<option value="billing.ping">' in html


def test_a_single_tenant_install_hides_the_tenant_selector(client: Any, db: None) -> None:
    from django.contrib.auth.models import User

    from celery_scheduler import api
    from django_app.models import Tenant

    client.force_login(User.objects.create_superuser("solo", "solo@example.com", "pw"))
    api.create_schedule(name="only tenant", task="billing.ping", interval=30)
    add = reverse("admin:django_app_schedule_add")
    assert 'name="tenant"' not in client.get(add).content.decode()
    assert "column-tenant_column" not in client.get(LIST).content.decode()

    Tenant.objects.create(slug="second")
    assert 'name="tenant"' in client.get(add).content.decode()
    assert "column-tenant_column" in client.get(LIST).content.decode()


def test_a_schedule_added_without_the_selector_lands_in_the_default_tenant(
    client: Any, db: None
) -> None:
    from django.contrib.auth.models import User

    from django_app.models import Schedule
    from tests.integration.admin.test_admin_schedules import form_data

    client.force_login(User.objects.create_superuser("solo", "solo@example.com", "pw"))
    response = client.post(reverse("admin:django_app_schedule_add"), form_data(name="solo job"))
    assert response.status_code == 302, response.content.decode()[:2000]
    assert Schedule.objects.get(name="solo job").tenant.slug == "default"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (30, "every 30 s"),
        (90, "every 1 min 30 s"),
        (3600, "every 1 h"),
        (86400 + 60, "every 1 d 1 min"),
    ],
)
def test_intervals_read_as_people_say_them(seconds: int, text: str) -> None:
    from django_app.admin.display import fmt_interval

    assert fmt_interval(seconds) == text
