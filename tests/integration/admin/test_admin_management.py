"""The admin side of the management API: pause notes, limits and tags on the schedule pages."""

# The fixtures are imported from admin_support, so their parameters shadow the imports.
# ruff: noqa: F811

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from tests.integration.admin_support import (  # noqa: F401 (fixtures)
    login,
    make_schedule,
    tenants,
    users,
)

pytestmark = pytest.mark.django_db(transaction=False)

LIST = reverse("admin:django_app_schedule_changelist")


def test_pause_button_stores_the_note_and_the_list_shows_it(login: Any, make_schedule: Any) -> None:
    client = login("acme")
    s = make_schedule(name="nightly")
    act = reverse("admin:django_app_schedule_act", args=[s.pk, "pause"])
    client.post(act, {"note": "vendor outage until Monday"})
    s.refresh_from_db()
    assert (s.state, s.pause_reason) == ("PAUSED", "vendor outage until Monday")
    page = client.get(LIST).content.decode()
    assert "vendor outage until Monday" in page
    change = client.get(reverse("admin:django_app_schedule_change", args=[s.pk])).content.decode()
    assert "vendor outage until Monday" in change


def test_list_filters_by_tag_within_the_users_tenant(login: Any, make_schedule: Any) -> None:
    billing = make_schedule(name="billing job", tags={"team": "billing"})
    make_schedule(name="ops job", tags={"team": "ops"})
    make_schedule("globex", name="globex billing", tags={"team": "billing"})
    client = login("acme")
    page = client.get(LIST, {"tag": "team=billing"}).content.decode()
    assert "billing job" in page
    assert "ops job" not in page
    assert "globex billing" not in page
    change = client.get(reverse("admin:django_app_schedule_change", args=[billing.pk]))
    assert "team=billing" in change.content.decode()


def test_change_page_shows_remaining_runs(login: Any, make_schedule: Any) -> None:
    s = make_schedule(max_runs=3, pause_after_failures=2)
    page = login("acme").get(reverse("admin:django_app_schedule_change", args=[s.pk]))
    text = page.content.decode()
    assert "0 of 3 runs made, 3 remaining" in text
    assert "pauses after 2 consecutive failures" in text
