"""What the API sends is what its OpenAPI document says: each error body, requested for
real, validates against the schema the document gives for that operation and status, with
no member the document leaves out."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from celery_scheduler import api
from django_app.http import tokens
from tests.integration.http.openapi_support import PREFIX, check_response, document

pytestmark = pytest.mark.django_db

VALID: dict[str, Any] = {"name": "n", "task": "billing.ping", "cron": "*/10 * * * *"}


@pytest.fixture
def token() -> dict[str, str]:
    api.create_tenant("acme")
    return {"HTTP_AUTHORIZATION": f"Bearer {tokens.issue('acme', 'contract').secret}"}


def _send(method: str, path: str, body: Any, auth: dict[str, str]) -> tuple[int, Any]:
    client = Client(raise_request_exception=False)
    response = getattr(client, method)(
        PREFIX + path, data=json.dumps(body), content_type="application/json", **auth
    )
    return response.status_code, json.loads(response.content)


def test_a_400_of_the_request_typing_carries_fields_as_the_error_schema_declares(
    token: dict[str, str],
) -> None:
    doc = document()
    cases = [
        # Flat: each refused field with its messages.
        ("post", "schedules/", {**VALID, "priority": "high"}, "priority"),
        # A field with parts (tags), an item of a bulk body and a part of it, a list.
        ("post", "schedules/", {**VALID, "tags": {"env": 3}}, "tags.env"),
        ("post", "schedules/bulk/", {"items": [{**VALID, "tags": {"a": 1}}]}, "items[0].tags.a"),
        ("post", "schedules/bulk/pause/", {"tag": ["a=b", 7]}, "tag.1"),
        # Not an object at all.
        ("post", "schedules/", ["not", "an", "object"], None),
    ]
    for method, path, body, field in cases:
        status, sent = _send(method, path, body, token)
        assert (status, sent["field"]) == (400, field), (path, body, sent)
        assert "fields" in sent, sent
        template = PREFIX + ("schedules/bulk/{action}/" if "pause" in path else path)
        check_response(doc, method, template, 400, sent)
    error = doc["components"]["schemas"]["Error"]
    assert "fields" in error["properties"]
    assert "fields" not in error.get("required", [])  # a 400 of the API's own checks has none
