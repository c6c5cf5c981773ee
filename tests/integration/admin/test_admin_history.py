"""History pages: occurrences per schedule, attempt detail, dead letters and replay."""

# The fixtures are imported from admin_support, so their parameters shadow the imports.
# ruff: noqa: F811

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.messages import get_messages
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


def test_occurrences_of_one_schedule_with_timing_columns(login: Any, make_schedule: Any) -> None:
    schedule = make_schedule(name="hourly", cron="0 * * * *", timezone="Europe/Berlin")
    other = make_schedule(name="other")
    mine = [add_occurrence(schedule, minutes_ago=m, lag=1.25) for m in (5, 65)]
    add_occurrence(other)
    response = login("acme").get(OCC_LIST, {"schedule": str(schedule.pk)})
    assert response.status_code == 200
    assert {o.pk for o in response.context["cl"].result_list} == {o.pk for o in mine}
    html = response.content.decode()
    assert "Occurrences of “hourly”" in html
    for column in ("Scheduled for", "Lag", "Attempts"):
        assert column.lower() in html.lower(), column
    assert "1.25 s" in html
    assert "CET" in html or "CEST" in html  # scheduled_for in the schedule's zone


def test_dead_letter_tab_counts_and_filters(login: Any, make_schedule: Any) -> None:
    schedule = make_schedule()
    dead = add_occurrence(schedule, state="DEAD", minutes_ago=3)
    add_occurrence(schedule, state="SUCCEEDED", minutes_ago=8)
    response = login("acme").get(OCC_LIST, {"state__exact": "DEAD"})
    assert [o.pk for o in response.context["cl"].result_list] == [dead.pk]
    html = response.content.decode()
    assert "<h1>Dead letters</h1>" in html
    assert 'cs-tab cs-tab-active">Dead letters <span class="cs-count">1</span>' in html
    assert "replay_selected" in html


def test_occurrence_detail_shows_attempts_with_lease_token_worker_error(
    login: Any, make_schedule: Any
) -> None:
    from django_app.models import Attempt

    occ = add_occurrence(make_schedule(), state="DEAD", error="Traceback...\nValueError: bad id")
    for number, outcome in ((1, "RETRY"), (2, "FAILED")):
        Attempt.objects.create(
            occurrence=occ, number=number, fencing_token=40 + number, worker=f"worker-{number}",
            started_at=occ.scheduled_for, outcome=outcome, error="ValueError: bad id",
        )  # fmt: skip
    client = login("acme")
    html = client.get(reverse("admin:django_app_occurrence_change", args=[occ.pk])).content
    text = html.decode()
    assert "worker-2" in text
    assert ">42<" in text
    assert "ValueError: bad id" in text
    assert 'name="_save"' not in text  # read-only
    attempt = Attempt.objects.get(number=2)
    detail = client.get(reverse("admin:django_app_attempt_change", args=[attempt.pk]))
    assert detail.status_code == 200
    body = detail.content.decode()
    assert "worker-2" in body
    assert "42" in body
    assert "cs-error" in body


def test_replay_dead_occurrence_keeps_its_id(login: Any, make_schedule: Any) -> None:
    from django_app.models import Occurrence

    schedule = make_schedule()
    dead = add_occurrence(schedule, state="DEAD")
    ok = add_occurrence(schedule, state="SUCCEEDED", minutes_ago=20)
    response = login("acme").post(
        OCC_LIST,
        {"action": "replay_selected", "_selected_action": [str(dead.pk), str(ok.pk)]},
        follow=True,
    )
    dead.refresh_from_db()
    ok.refresh_from_db()
    assert dead.state == "ENQUEUED"
    assert ok.state == "SUCCEEDED"
    assert Occurrence.objects.count() == 2  # same id, no new row
    messages = {m.level_tag: str(m) for m in get_messages(response.wsgi_request)}
    assert "Replayed 1 occurrence under its own id" in messages["success"]
    assert str(dead.pk)[:8] in messages["success"]
    assert "only DEAD occurrences can be replayed" in messages["warning"]
