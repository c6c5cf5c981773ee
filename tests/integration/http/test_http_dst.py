"""The DST policy over HTTP: given on create and update, shown on every schedule, described
in the OpenAPI schema; a bad one is a 400 naming the field with nothing written."""

from __future__ import annotations

from typing import Any

import pytest

from celery_scheduler import api
from django_app.http import tokens
from django_app.models import Schedule, ScheduleVersion
from tests.integration.http.http_support import HttpClient

pytestmark = pytest.mark.django_db(transaction=True)

CRON = {
    "name": "nightly",
    "task": "billing.ping",
    "cron": "30 2 * * *",
    "timezone": "Europe/Berlin",
}


@pytest.fixture
def acme(live_server: Any) -> HttpClient:
    api.create_tenant("acme", name="Acme")
    return HttpClient(live_server.url, token=tokens.issue("acme", "ci").secret)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({**CRON, "dst_gap": "later"}, "dst_gap"),
        ({**CRON, "dst_fold": "twice"}, "dst_fold"),
        ({"name": "i", "task": "billing.ping", "interval": 60, "dst_fold": "BOTH"}, "dst_fold"),
    ],
)
def test_a_bad_policy_is_a_400_naming_the_field(
    acme: HttpClient, body: dict[str, Any], field: str
) -> None:
    reply = acme.post("schedules/", body)
    assert reply.status == 400, reply.body
    assert reply.body["field"] == field, reply.body
    assert Schedule.objects.count() == 0
    assert ScheduleVersion.objects.count() == 0


def test_policy_round_trips_and_an_update_is_a_new_version(acme: HttpClient) -> None:
    created = acme.post("schedules/", {**CRON, "dst_gap": "SHIFT"})
    assert created.status == 201, created.body
    assert (created.body["schedule"]["dst_gap"], created.body["schedule"]["dst_fold"]) == (
        "SHIFT", "FIRST",
    )  # fmt: skip
    sid = created.body["schedule"]["id"]
    updated = acme.patch(f"schedules/{sid}/", {"dst_fold": "SECOND"})
    assert updated.status == 200, updated.body
    described = acme.get(f"schedules/{sid}/")
    assert described.body["schedule"]["dst_fold"] == "SECOND"
    assert described.body["schedule"]["version"] == 2
    assert described.body["current_version"]["dst_fold"] == "SECOND"


def test_openapi_schema_describes_the_policy(live_server: Any) -> None:
    schema = HttpClient(live_server.url).get("schema/?format=json").body
    components = schema["components"]["schemas"]
    create = components["ScheduleCreate"]["properties"]
    assert "dst_gap" in create
    assert "dst_fold" in create
    assert "SHIFT" in str(components)
    assert "dst_fold" in components["ScheduleSummary"]["properties"]
