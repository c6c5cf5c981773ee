"""`null` in a request body means what None means to the Python API for that field (its
default, no limit, no key), so a client that sends every key, the unset ones as null, gets
what it gets from the Python API; a field the Python API needs a value for refuses null
with a 400 that names it and says so."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import Client

from celery_scheduler import api, errors
from django_app.http import tokens
from django_app.models import AuditEntry, Schedule, Tenant

pytestmark = pytest.mark.django_db

P = "/scheduler/api/"
CREATE: dict[str, Any] = {"name": "nulls", "task": "billing.ping", "cron": "*/10 * * * *"}
#: What a schedule's row says of its settings (its spec, extras, state), for comparisons.
COLUMNS = (
    "kind", "cron", "timezone", "dst_gap", "dst_fold", "interval_seconds", "run_at", "args",
    "kwargs", "queue", "priority", "misfire_policy", "max_lateness_seconds", "catchup_cap",
    "overlap_policy", "flexible_window_seconds", "concurrency_limit", "concurrency_group",
    "max_attempts", "deadline_seconds", "start_at", "end_at", "max_runs",
    "pause_after_failures", "version", "state", "idempotency_key", "tenant_id",
)  # fmt: skip
#: create_schedule's optional fields: None is each one's default (or "not given").
OPTIONAL = (
    "timezone", "dst_gap", "dst_fold", "interval", "run_at", "args", "kwargs", "queue",
    "priority", "misfire_policy", "max_lateness", "catchup_cap", "overlap_policy",
    "flexible_window", "concurrency_limit", "concurrency_group", "max_attempts", "deadline",
    "start_at", "end_at", "max_runs", "pause_after_failures", "tags", "idempotency_key",
)  # fmt: skip
#: A schedule with a value other than the default in each of them.
SET: dict[str, Any] = {
    **CREATE, "timezone": "Europe/Berlin", "dst_gap": "SHIFT", "dst_fold": "BOTH",
    "args": [1], "kwargs": {"x": 1}, "queue": "slow", "priority": 3,
    "misfire_policy": "CATCH_UP", "max_lateness": 60, "catchup_cap": 3,
    "overlap_policy": "QUEUE_ONE", "flexible_window": 5, "concurrency_limit": 2,
    "concurrency_group": "g", "max_attempts": 4, "deadline": 100, "max_runs": 50,
    "start_at": datetime(2026, 1, 1, tzinfo=UTC), "end_at": datetime(2099, 1, 1, tzinfo=UTC),
    "pause_after_failures": 2, "tags": {"team": "billing"},
}  # fmt: skip


def row(schedule_id: Any) -> dict[str, Any]:
    values = Schedule.objects.values(*COLUMNS).get(pk=schedule_id)
    values["tags"] = sorted(Schedule.objects.get(pk=schedule_id).tags.values_list("key", "value"))
    return values


class Caller:
    def __init__(self, client: Client, auth: dict[str, str]) -> None:
        self.client, self.auth = client, auth

    def send(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        response = getattr(self.client, method)(
            P + path, data=json.dumps(body), content_type="application/json", **self.auth
        )
        return response.status_code, json.loads(response.content)


@pytest.fixture
def acme() -> Caller:
    api.create_tenant("acme")
    token = tokens.issue("acme", "nulls").secret
    return Caller(Client(), {"HTTP_AUTHORIZATION": f"Bearer {token}"})


@pytest.mark.parametrize("field", OPTIONAL)
def test_null_in_a_create_is_what_none_is_to_create_schedule(acme: Caller, field: str) -> None:
    status, sent = acme.send("post", "schedules/", {**CREATE, field: None})
    assert status == 201, sent
    made = api.create_schedule(**{**CREATE, field: None}, tenant="acme")
    assert row(sent["schedule"]["id"]) == row(made.id)
    assert Schedule.objects.get(pk=made.id).content_hash == (
        Schedule.objects.get(pk=sent["schedule"]["id"]).content_hash
    )


def test_null_tenant_and_reason_in_a_create_are_not_given(acme: Caller) -> None:
    status, sent = acme.send("post", "schedules/", {**CREATE, "tenant": None, "reason": None})
    assert status == 201, sent
    assert sent["schedule"]["tenant"] == "acme"  # the token's own, as when left out
    entry = AuditEntry.objects.get(schedule_id=sent["schedule"]["id"])
    assert entry.reason == ""


@pytest.mark.parametrize(
    "field",
    [f for f in OPTIONAL if f != "idempotency_key"] + ["cron", "expected_version", "reason"],
)
def test_null_in_an_update_is_what_none_is_to_update_schedule(acme: Caller, field: str) -> None:
    """None resets a setting to its default (it is not "keep"); None for the one trigger
    given leaves none, which update_schedule refuses, naming `cron`."""
    http = api.create_schedule(**SET, tenant="acme")
    python = api.create_schedule(**SET, tenant="acme")
    status, sent = acme.send("patch", f"schedules/{http.id}/", {field: None})
    refused: errors.ValidationError | None = None
    try:
        api.update_schedule(python.id, **{field: None})
    except errors.ValidationError as exc:
        refused = exc
    if refused is not None:
        assert (status, sent["field"], sent["detail"]) == (400, refused.field, str(refused))
    else:
        assert status == 200, sent
    assert row(http.id) == row(python.id)


def test_a_null_trigger_beside_another_switches_the_kind(acme: Caller) -> None:
    made = api.create_schedule(**CREATE, tenant="acme")
    status, sent = acme.send("patch", f"schedules/{made.id}/", {"cron": None, "interval": 60})
    assert status == 200, sent
    assert Schedule.objects.get(pk=made.id).kind == "INTERVAL"
    soon = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    status, sent = acme.send("post", "schedules/", {**CREATE, "cron": None, "run_at": soon})
    assert status == 201, sent
    assert sent["schedule"]["kind"] == "ONE_OFF"


def test_null_in_the_other_bodies_is_not_given(acme: Caller, admin_client: Client) -> None:
    sid = str(api.create_schedule(**CREATE, tenant="acme").id)
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    window = {"start": (hour - timedelta(hours=3)).isoformat(), "end": hour.isoformat()}
    item = {**CREATE, "name": "item", "queue": None, "tags": None, "idempotency_key": "k1"}
    cases = [
        ("post", f"schedules/{sid}/pause/", {"note": None, "reason": None}, 200),
        ("post", f"schedules/{sid}/resume/", {"reason": None}, 200),
        ("post", f"schedules/{sid}/run-now/", {"idempotency_key": None, "reason": None}, 200),
        ("post", f"schedules/{sid}/skip/", {"scheduled_for": None, "note": None}, 200),
        ("post", f"schedules/{sid}/backfill/", {**window, "overlap_policy": None}, 200),
        (
            "post", "schedules/bulk/pause/",
            {"name_contains": "nulls", "state": None, "task": None, "tag": None,
             "next_run_before": None, "next_run_after": None, "tenant": None, "note": None,
             "reason": None},
            200,
        ),
        ("post", "schedules/bulk/", {"items": [item], "tenant": None, "reason": None}, 201),
        ("post", "schedules/sync/", {"items": [item], "prune": None, "tenant": None}, 200),
        ("post", f"schedules/{sid}/cancel/", {"reason": None}, 200),
    ]  # fmt: skip
    for method, path, body, expected in cases:
        status, sent = acme.send(method, path, body)
        assert status == expected, (path, body, sent)
    assert Schedule.objects.get(idempotency_key="k1").queue == ""

    root = Caller(admin_client, {})
    nulls = {"name": None, "relay_weight": None, "max_schedules": None, "catchup_rate": None}
    status, sent = root.send("post", "tenants/", {"slug": "by-http", **nulls})
    assert status == 201, sent
    # create_tenant's signature types name and relay_weight without None; it takes None
    # as their default all the same (tenants._validate), which null matches.
    by_python = api.create_tenant("by-python", **nulls)  # type: ignore[arg-type]
    # The name defaults to the slug, which differs: compare it as "the slug".
    named = {**{k: sent[k] for k in nulls}, "name": sent["name"] == "by-http"}
    assert named == {**{k: getattr(by_python, k) for k in nulls}, "name": True}
    assert by_python.name == "by-python"
    Tenant.objects.filter(slug="by-http").update(name="Named", relay_weight=7)
    status, sent = root.send("patch", "tenants/by-http/", {"name": None, "relay_weight": None})
    assert status == 200, sent
    assert (sent["name"], sent["relay_weight"]) == ("by-http", by_python.relay_weight)


def test_null_for_a_field_that_needs_a_value_is_a_400_naming_it(
    acme: Caller, admin_client: Client
) -> None:
    sid = str(api.create_schedule(**CREATE, tenant="acme").id)
    root = Caller(admin_client, {})
    cases = [
        (acme, "post", "schedules/", {**CREATE, "name": None}, "name"),
        (acme, "post", "schedules/", {**CREATE, "task": None}, "task"),
        (acme, "patch", f"schedules/{sid}/", {"name": None}, "name"),
        (acme, "post", f"schedules/{sid}/backfill/", {"start": None, "end": None}, "start"),
        (acme, "post", "schedules/bulk/", {"items": None}, "items"),
        (acme, "post", "schedules/bulk/", {"items": [{**CREATE, "task": None}]}, "items[0].task"),
        (root, "post", "tenants/", {"slug": None}, "slug"),
    ]
    for caller, method, path, body, field in cases:
        status, sent = caller.send(method, path, body)
        assert (status, sent["field"]) == (400, field), (path, body, sent)
        assert "null" in sent["detail"], sent
        assert field.rsplit(".", 1)[-1] in sent["detail"], sent
    # The Python API's own refusal, as it words it: a sync matches schedules by their key.
    status, sent = acme.send(
        "post", "schedules/sync/", {"items": [{**CREATE, "idempotency_key": None}]}
    )
    assert (status, sent["field"]) == (400, "items[0].idempotency_key"), sent
    assert Schedule.objects.count() == 1
