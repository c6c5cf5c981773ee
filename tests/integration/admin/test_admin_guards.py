"""Issue 9, hole 11 in the admin: a double submit of "run now" runs once, a stale change form
is refused with a form error, and replaying a dead run of an old version says why not."""

# The fixtures are imported from admin_support, so their parameters shadow the imports.
# ruff: noqa: F811

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse

from celery_scheduler import api
from tests.integration.admin.test_admin_schedules import LIST, change_url, edit_data
from tests.integration.admin_support import (  # noqa: F401 (fixtures)
    add_occurrence,
    login,
    make_schedule,
    tenants,
    users,
)

pytestmark = pytest.mark.django_db(transaction=False)


def _hidden(html: str, name: str) -> str:
    found = re.search(rf'<input type="hidden" name="{name}" value="([^"]*)"', html)
    assert found, f"no hidden {name} input in the page"
    return found.group(1)


def messages_of(response: Any) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_double_submitted_run_now_action_runs_once(login: Any, make_schedule: Any) -> None:
    from django_app.models import Occurrence

    schedule = make_schedule()
    client = login("acme")
    key = _hidden(client.get(LIST).content.decode(), "idempotency_key")
    data = {"action": "run_selected_now", "_selected_action": [str(schedule.pk)]}

    client.post(LIST, {**data, "idempotency_key": key}, follow=True)
    again = client.post(LIST, {**data, "idempotency_key": key}, follow=True)

    assert Occurrence.objects.filter(schedule=schedule, manual=True).count() == 1
    assert "Already queued by this submission" in " ".join(messages_of(again))
    fresh = _hidden(again.content.decode(), "idempotency_key")
    assert fresh != key  # the next page is a new submission
    client.post(LIST, {**data, "idempotency_key": fresh}, follow=True)
    assert Occurrence.objects.filter(schedule=schedule, manual=True).count() == 2


def test_double_submitted_run_now_button_runs_once(login: Any, make_schedule: Any) -> None:
    from django_app.models import Occurrence

    schedule = make_schedule()
    client = login("acme")
    page = client.get(change_url(schedule)).content.decode()
    key = _hidden(page, "idempotency_key")
    url = reverse("admin:django_app_schedule_act", args=[schedule.pk, "run_now"])

    client.post(url, {"idempotency_key": key}, follow=True)
    client.post(url, {"idempotency_key": key}, follow=True)

    assert Occurrence.objects.filter(schedule=schedule, manual=True).count() == 1


def test_stale_change_form_is_refused_and_writes_nothing(login: Any, make_schedule: Any) -> None:
    schedule = make_schedule(cron="0 * * * *", timezone="UTC")
    client = login("acme")
    page = client.get(change_url(schedule)).content.decode()
    loaded = _hidden(page, "loaded_version")
    assert loaded == "1"
    api.update_schedule(schedule.id, name="changed by someone else")  # another admin saves

    response = client.post(
        change_url(schedule), edit_data(schedule, cron="15 * * * *", loaded_version=loaded)
    )

    assert response.status_code == 200
    errors = response.context["adminform"].form.non_field_errors()
    assert any("version 1" in e and "version 2" in e for e in errors), errors
    schedule.refresh_from_db()
    assert (schedule.version, schedule.cron, schedule.name) == (
        2,
        "0 * * * *",
        "changed by someone else",
    )


def test_current_change_form_saves(login: Any, make_schedule: Any) -> None:
    schedule = make_schedule(cron="0 * * * *", timezone="UTC")
    login("acme").post(
        change_url(schedule), edit_data(schedule, cron="15 * * * *", loaded_version="1")
    )
    schedule.refresh_from_db()
    assert (schedule.version, schedule.cron) == (2, "15 * * * *")


def test_replay_of_an_old_version_says_why_not(login: Any, make_schedule: Any) -> None:
    schedule = make_schedule()
    dead = add_occurrence(schedule, state="DEAD")
    api.update_schedule(schedule.id, args=[1])

    response = login("acme").post(
        reverse("admin:django_app_occurrence_changelist"),
        {"action": "replay_selected", "_selected_action": [str(dead.pk)]},
        follow=True,
    )

    dead.refresh_from_db()
    assert dead.state == "DEAD"
    text = " ".join(messages_of(response))
    assert "Could not replay" in text
    assert "version 1" in text
    assert "version 2" in text
    assert "Run now" in text
