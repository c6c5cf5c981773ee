"""Every route of the HTTP API, with a table of malformed dates, depths, sizes and paths:
never a 5xx, always a JSON body; a bad value is a 400 naming its field, a body over the
route's limit a 413 that says the limit (issue 25).

Driven through Django's test client with ``raise_request_exception=False``, so a 500 comes
back as a response (as a user would get it) instead of an exception in the test.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from django.db import connection
from django.test import Client, override_settings

from celery_scheduler import api
from django_app.http import tokens
from django_app.http.views import BULK_MAX_BODY
from django_app.models import Schedule, ScheduleVersion

pytestmark = pytest.mark.django_db

P = "/scheduler/api/"
IMPOSSIBLE = [
    "2026-02-30T00:00:00Z",
    "2026-13-01T00:00:00Z",
    "2026-01-01T25:00:00Z",
    "2026-01-01T00:00:00+24:00",
    "2026-01-01T00:61:00Z",
]
VALID: dict[str, Any] = {"name": "walk", "task": "billing.ping", "cron": "*/10 * * * *"}


def nested(levels: int) -> Any:
    value: Any = 0
    for _ in range(levels):
        value = [value]
    return value


def deep_text(levels: int) -> str:
    return "[" * levels + "]" * levels


class Walk:
    """Sends requests, checks each answer's shape, counts them."""

    def __init__(self, client: Client, token: str) -> None:
        self.client = client
        self.auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
        self.sent: Counter[str] = Counter()

    def send(self, method: str, path: str, raw: str | bytes | None = None) -> tuple[int, Any]:
        kwargs: dict[str, Any] = dict(self.auth)
        if raw is not None:
            kwargs.update(data=raw, content_type="application/json")
        response = getattr(self.client, method.lower())(P + path, **kwargs)
        self.sent[method] += 1
        where = f"{method} {path} ({len(raw or '')} bytes)"
        assert response.status_code < 500, f"{where}: {response.status_code}"
        assert response["Content-Type"].startswith("application/json"), (
            f"{where}: {response.status_code} {response['Content-Type']} {response.content[:80]!r}"
        )
        payload = json.loads(response.content) if response.content else None
        if response.status_code >= 400:
            assert isinstance(payload, dict), (where, payload)
            assert set(payload) >= {"error", "detail", "field"}, (where, payload)
        return response.status_code, payload

    def json(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        return self.send(method, path, json.dumps(body))

    def bad(self, method: str, path: str, body: Any, field: str, status: int = 400) -> None:
        code, payload = self.json(method, path, body)
        assert (code, payload["field"]) == (status, field), (method, path, body, payload)


@pytest.fixture
def walk() -> Walk:
    api.create_tenant("acme")
    return Walk(Client(raise_request_exception=False), tokens.issue("acme", "walk").secret)


@override_settings(DEBUG=False)
def test_every_route_answers_malformed_input_with_json_naming_the_field(walk: Walk) -> None:
    code, created = walk.json("POST", "schedules/", VALID)
    assert code == 201
    sid = created["schedule"]["id"]
    one_off = {"name": "once", "task": "billing.ping", "run_at": "2030-01-01T00:00:00Z"}
    writes = (Schedule.objects.count(), ScheduleVersion.objects.count())

    # Impossible dates in every date field of every route (issue 25, bug 2).
    for bad in IMPOSSIBLE:
        for field in ("run_at", "start_at", "end_at"):
            base = one_off if field == "run_at" else VALID
            walk.bad("POST", "schedules/", {**base, field: bad}, field)
            walk.bad("PATCH", f"schedules/{sid}/", {field: bad}, field)
            walk.bad(
                "POST", "schedules/bulk/", {"items": [{**base, field: bad}]}, f"items[0].{field}"
            )
            walk.bad(
                "POST", "schedules/sync/", {"items": [{**base, field: bad}]}, f"items[0].{field}"
            )
        walk.bad("POST", f"schedules/{sid}/skip/", {"scheduled_for": bad}, "scheduled_for")
        walk.bad("POST", f"schedules/{sid}/backfill/", {"start": bad, "end": bad}, "start")
        for field in ("next_run_before", "next_run_after"):
            code, payload = walk.send("GET", f"schedules/?{field}={bad.replace('+', '%2B')}")
            assert (code, payload["field"]) == (400, field)
            walk.bad("POST", "schedules/bulk/pause/", {field: bad}, field)

    # Depth: args at the limit pass, one more level is refused; a body deeper than the
    # decoder's recursion limit is a parse error, not a RecursionError (bugs 3 and 6).
    code, payload = walk.json("POST", "schedules/", {**VALID, "name": "d100", "args": nested(100)})
    if connection.vendor == "mysql":
        # MariaDB's JSON check (json_valid) refuses documents nested past its own depth
        # limit: there the deep args are a 400 too, never a 500 or a half-written row.
        assert code == 400, payload
    else:
        assert code == 201, payload
    walk.bad("POST", "schedules/", {**VALID, "args": nested(101)}, "args")
    deep_routes = [
        ("POST", "schedules/"),
        ("PATCH", f"schedules/{sid}/"),
        ("POST", "schedules/bulk/"),
        ("POST", "schedules/sync/"),
        ("POST", f"schedules/{sid}/skip/"),
        ("POST", f"schedules/{sid}/run-now/"),
        ("POST", f"schedules/{sid}/backfill/"),
        ("POST", "schedules/bulk/pause/"),
    ]
    hostile_bodies = [
        deep_text(1000),
        deep_text(5000),
        '{"name": "x", "args": ' + deep_text(1200) + "}",
        '{"priority": ' + "9" * 5000 + "}",
        '{"name": NaN}',
        "{not json",
        "\xff\xfe",
    ]
    for method, path in deep_routes:
        for raw in hostile_bodies:
            code, payload = walk.send(method, path, raw)
            assert (code, payload["field"]) == (400, "body"), (method, path, raw[:20], payload)

    # Size: over Django's 2.5 MiB on a plain route is a 413 naming the limit (bug 5) ...
    filler = {**VALID, "args": ["x" * (3 * 1024 * 1024)]}
    code, payload = walk.json("POST", "schedules/", filler)
    assert code == 413
    assert "2621440 bytes" in payload["detail"]
    # ... while 10,000 bulk items of ~300 bytes (about 3.3 MB) fit the bulk routes' limit.
    items = [
        {
            **VALID,
            "name": f"bulk {i:05d}",
            "kwargs": {"note": "n" * 200},
            "idempotency_key": f"k{i}",
        }
        for i in range(10_000)
    ]
    big = json.dumps({"items": items})
    assert 3_000_000 < len(big) < BULK_MAX_BODY
    code, payload = walk.send("POST", "schedules/bulk/", big)
    assert code == 201, payload
    code, payload = walk.send("POST", "schedules/bulk/", " " * (BULK_MAX_BODY + 1))
    assert code == 413
    assert str(BULK_MAX_BODY) in payload["detail"]

    # Paths: uppercase ids work, a malformed id or unknown route is the JSON 404 (bug 6).
    code, _ = walk.send("GET", f"schedules/{sid.upper()}/")
    assert code == 200
    for path in (
        "schedules/not-a-uuid/",
        f"schedules/{sid}x/",
        "schedules/123/pause/",
        "occurrences/zz/replay/",
        "nothing/here/",
        f"schedules/{sid}/occurrences/extra/",
    ):
        for method in ("GET", "POST", "PATCH", "DELETE"):
            code, payload = walk.send(method, path, "{}" if method != "GET" else None)
            assert (code, payload["error"]) == (404, "not_found"), (method, path)

    assert sum(walk.sent.values()) == 177  # the whole table was walked
    # Nothing of the refused requests was written: only the two accepted creates and the
    # 10,000 bulk items.
    deep_created = 0 if connection.vendor == "mysql" else 1  # the d100 schedule above
    assert Schedule.objects.count() == writes[0] + deep_created + 10_000
    print(f"route walk: {sum(walk.sent.values())} requests {dict(walk.sent)}")


@override_settings(DEBUG=False)
def test_a_tenant_patch_naming_slug_is_refused_not_ignored(admin_client: Client) -> None:
    api.create_tenant("acme")
    response = admin_client.patch(
        P + "tenants/acme/", data=json.dumps({"slug": "other"}), content_type="application/json"
    )
    assert response.status_code == 400
    assert response.json()["field"] == "slug"
    assert api.get_tenant("acme").slug == "acme"
