"""The OpenAPI document speaks to API users: every operation has a summary in one style and
a description of its own, never a view's internal docstring (issue 27)."""

from __future__ import annotations

import inspect
import json

import pytest
from django.test import Client

from django_app.http import views

pytestmark = pytest.mark.django_db

METHODS = {"get", "post", "patch", "put", "delete"}


def operations() -> dict[str, dict[str, str]]:
    reply = Client().get("/scheduler/api/schema/", {"format": "json"})
    assert reply.status_code == 200
    schema = json.loads(reply.content)
    return {
        f"{method.upper()} {path}": op
        for path, item in schema["paths"].items()
        for method, op in item.items()
        if method in METHODS
    }


def test_every_operation_has_a_user_facing_description() -> None:
    found = operations()
    assert len(found) == 19
    internal = {
        inspect.getdoc(obj)
        for _, obj in inspect.getmembers(views, inspect.isclass)
        if obj.__module__ == views.__name__ and inspect.getdoc(obj)
    }
    for name, op in found.items():
        description = op.get("description", "")
        assert description, name
        assert description not in internal, f"{name}: a view docstring, not for users"
    descriptions = [op["description"] for op in found.values()]
    assert len(set(descriptions)) == len(descriptions)  # each says something of its own


def test_summaries_read_alike() -> None:
    for name, op in operations().items():
        summary = op.get("summary", "")
        # A short imperative phrase: capitalised, several words, no trailing period and no
        # parenthesised detail (that goes in the description).
        assert summary[:1].isupper(), (name, summary)
        assert len(summary.split()) >= 2, (name, summary)
        assert not summary.endswith("."), (name, summary)
        assert "(" not in summary, (name, summary)
        assert ";" not in summary, (name, summary)
        assert len(summary) <= 45, (name, summary)
