"""POST schedules/bulk/ and schedules/sync/ over real HTTP: 400 naming items[i].field with
nothing written, 409 on a key conflict, the tenant from the token."""

from __future__ import annotations

from typing import Any

import pytest

from celery_scheduler import api
from django_app.http import tokens
from django_app.models import AuditEntry, Schedule, Tenant
from tests.integration.http.http_support import HttpClient

pytestmark = pytest.mark.django_db(transaction=True)

ITEM = {"name": "report", "task": "billing.ping", "cron": "*/10 * * * *"}


@pytest.fixture
def acme(live_server: Any) -> HttpClient:
    api.create_tenant("acme")
    api.create_tenant("globex")
    return HttpClient(live_server.url, token=tokens.issue("acme", "ci").secret)


def test_bulk_create_over_http(acme: HttpClient) -> None:
    items = [
        dict(ITEM, name=f"r{i}", idempotency_key=f"k{i}", tags={"n": str(i)}) for i in range(3)
    ]
    reply = acme.post("schedules/bulk/", {"items": items, "reason": "load"})
    assert reply.status == 201, reply.body
    assert (reply.body["created"], reply.body["existing"]) == (3, 0)
    acme_tenant = Tenant.objects.get(slug="acme")
    rows = {
        str(k): v for k, v in Schedule.objects.filter(tenant=acme_tenant).values_list("id", "name")
    }
    assert [rows[i] for i in reply.body["schedule_ids"]] == ["r0", "r1", "r2"]
    entry = AuditEntry.objects.filter(action="create").first()
    assert entry is not None
    assert entry.reason == "load"
    assert entry.actor.startswith("token:")
    again = acme.post("schedules/bulk/", {"items": items})
    assert (again.status, again.body["created"], again.body["existing"]) == (201, 0, 3)
    conflict = acme.post("schedules/bulk/", {"items": [dict(items[0], cron="0 * * * *")]})
    assert conflict.status == 409
    assert conflict.body["error"] == "idempotency_conflict"


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"cron": "61 * * * *"}, "items[1].cron"),  # the API's validation
        ({"priority": "high"}, "items[1].priority"),  # the request's typing
        ({"color": "red"}, "items[1].color"),  # an unknown field
        ({"task": "billing.pong"}, "items[1].task"),
    ],
)
def test_a_bad_item_is_a_400_naming_it_and_nothing_is_written(
    acme: HttpClient, bad: dict[str, Any], field: str
) -> None:
    items = [dict(ITEM, name="a"), dict(ITEM, name="b", **bad), dict(ITEM, name="c")]
    for path in ("schedules/bulk/", "schedules/sync/"):
        keyed = [dict(item, idempotency_key=item["name"]) for item in items]
        reply = acme.post(path, {"items": keyed})
        assert reply.status == 400, reply.body
        assert reply.body["error"] == "validation_error"
        assert reply.body["field"] == field
    assert not Schedule.objects.exists()


def test_sync_over_http(acme: HttpClient, live_server: Any) -> None:
    items = [dict(ITEM, name=n, idempotency_key=n) for n in ("a", "b")]
    first = acme.post("schedules/sync/", {"items": items})
    assert first.status == 200, first.body
    assert first.body["created"] == ["a", "b"]
    items[0]["cron"] = "5 * * * *"
    second = acme.post("schedules/sync/", {"items": items[:1], "prune": True})
    assert second.body == {
        "created": [], "updated": ["a"], "unchanged": [], "stopped": [], "pruned": ["b"],
    }  # fmt: skip
    missing = acme.post("schedules/sync/", {"items": [ITEM]})
    assert (missing.status, missing.body["field"]) == (400, "items[0].idempotency_key")
    # A token syncs its own tenant only.
    other = acme.post("schedules/sync/", {"items": items, "tenant": "globex"})
    assert other.status == 403
    globex = Tenant.objects.get(slug="globex")
    assert not Schedule.objects.filter(tenant=globex).exists()
    assert acme.post("schedules/bulk/", {"items": "nope"}).status == 400


@pytest.mark.parametrize("prune", ["false", "", "null", 0, 1, "true"])
def test_sync_takes_prune_as_a_json_boolean_only(acme: HttpClient, prune: Any) -> None:
    """As the Python API (a bool only: prune cancels schedules), not read by DRF's table of
    spellings, which took "" and "null" as no prune and "false", 0 or "yes" as a choice.
    Seen failing: 200 for each."""
    items = [dict(ITEM, name=n, idempotency_key=n) for n in ("a", "b")]
    assert acme.post("schedules/sync/", {"items": items}).status == 200
    reply = acme.post("schedules/sync/", {"items": items[:1], "prune": prune})
    assert (reply.status, reply.body["field"]) == (400, "prune"), reply.body
    assert "JSON boolean" in reply.body["detail"]
    assert set(Schedule.objects.values_list("state", flat=True)) == {"ACTIVE"}
