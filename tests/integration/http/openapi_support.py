"""The API's own OpenAPI document as the oracle of what it sends.

``check`` validates a body against the schema the document gives for one operation and
status, with every object schema closed: a member the document does not declare fails, as
it would surprise a client generated from the document (an open schema accepts anything).
"""

from __future__ import annotations

import copy
import json
from typing import Any

from django.test import Client
from openapi_schema_validator import OAS30Validator

PREFIX = "/scheduler/api/"


def document() -> dict[str, Any]:
    reply = Client().get(PREFIX + "schema/", {"format": "json"})
    assert reply.status_code == 200, reply.content[:200]
    found: dict[str, Any] = json.loads(reply.content)
    return found


def operations(doc: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """(method, path) -> operation, for every operation of the document."""
    return {
        (method, path): op
        for path, item in doc["paths"].items()
        for method, op in item.items()
        if method in {"get", "post", "put", "patch", "delete"}
    }


def response_schema(doc: dict[str, Any], method: str, path: str, status: int) -> dict[str, Any]:
    responses = doc["paths"][path][method]["responses"]
    assert str(status) in responses, f"{method.upper()} {path}: no {status} in {sorted(responses)}"
    schema: dict[str, Any] = responses[str(status)]["content"]["application/json"]["schema"]
    return schema


def _closed(schema: Any) -> Any:
    if isinstance(schema, dict):
        out = {k: _closed(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_closed(v) for v in schema]
    return schema


def check(doc: dict[str, Any], schema: dict[str, Any], body: Any) -> None:
    """Raise jsonschema's ValidationError unless ``body`` is what ``schema`` declares."""
    root = {**copy.deepcopy(schema), "components": _closed(doc.get("components", {}))}
    OAS30Validator(root).validate(body)


def check_response(doc: dict[str, Any], method: str, path: str, status: int, body: Any) -> None:
    check(doc, response_schema(doc, method, path, status), body)
