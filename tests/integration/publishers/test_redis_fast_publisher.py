"""The Redis fast path writes exactly what ``app.send_task`` writes, and workers run it.

Both publishers push to the same Redis database; the raw LPUSHed JSON of each is read back
and compared field by field. The only field allowed to differ is kombu's per-message
``delivery_tag`` (a fresh uuid every publish).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import redis
from celery import Celery
from celery.utils.saferepr import saferepr
from hypothesis import given, settings
from hypothesis import strategies as st
from kombu import Exchange, Queue

from celery_scheduler import errors
from celery_scheduler.publishers import OccurrenceMessage, RecordingPublisher
from celery_scheduler.publishers.celery import CeleryPublisher
from celery_scheduler.publishers.redis_fast import (
    KOMBU_REDIS_SEP,
    RedisFastPublisher,
    celery_saferepr,
    publisher_for,
)

WHEN = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)


def make_app(redis_url: str) -> Celery:
    app = Celery("fast-path-test", broker=redis_url, set_as_current=False)
    app.conf.task_routes = {
        "reports.*": {"queue": "reports"},
        "urgent.*": {"queue": "reports", "priority": 9},
    }
    app.conf.task_queues = [
        Queue("celery"),
        Queue("reports"),
        Queue("special"),
        Queue("fan", Exchange("fan", type="topic"), routing_key="fan.#"),
    ]
    return app


@pytest.fixture
def app(redis_url: str) -> Iterator[Celery]:
    app = make_app(redis_url)
    yield app
    app.close()


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def message(task: str = "billing.ping", **fields: Any) -> OccurrenceMessage:
    values: dict[str, Any] = {
        "occurrence_id": str(uuid.uuid4()),
        "schedule_id": str(uuid.uuid4()),
        "schedule_version": 3,
        "scheduled_for": WHEN,
        "tenant": "acme",
        "task": task,
        "args": (1, "it's", [2, {"deep": [None, True, 1.5]}]),
        "kwargs": {"customer": "c-1", "note": 'quote " and \\ backslash'},
    }
    values.update(fields)
    return OccurrenceMessage(**values)


def pop_all(client: redis.Redis, key: str) -> list[dict[str, Any]]:
    raw = client.lrange(key, 0, -1)
    client.delete(key)
    return [json.loads(item) for item in reversed(raw)]  # oldest first, as BRPOP reads


@pytest.mark.redis
@pytest.mark.parametrize(
    ("fields", "key"),
    [
        ({}, "celery"),
        ({"task": "reports.daily"}, "reports"),
        ({"queue": "special"}, "special"),
        ({"priority": 5}, f"celery{KOMBU_REDIS_SEP}3"),
        ({"priority": 9}, f"celery{KOMBU_REDIS_SEP}9"),
        ({"task": "urgent.page"}, f"reports{KOMBU_REDIS_SEP}9"),
    ],
    ids=["default-queue", "routed", "explicit-queue", "priority-5", "priority-9", "route-priority"],
)
def test_envelope_equals_send_task_field_by_field(
    app: Celery, client: redis.Redis, fields: dict[str, Any], key: str
) -> None:
    sent = message(**fields)
    CeleryPublisher(app).publish([sent])
    (reference,) = pop_all(client, key)
    fallback = RecordingPublisher()
    RedisFastPublisher(app, fallback=fallback).publish([sent])
    assert fallback.sent == []  # the fast path built it, kombu did not
    (fast,) = pop_all(client, key)

    assert set(fast) == set(reference)
    assert set(fast["properties"]) == set(reference["properties"])
    assert set(fast["headers"]) == set(reference["headers"])
    for name in ("body", "content-type", "content-encoding"):
        assert fast[name] == reference[name], name
    for name, value in reference["headers"].items():
        assert fast["headers"][name] == value, f"header {name}"
    for name, value in reference["properties"].items():
        if name != "delivery_tag":
            assert fast["properties"][name] == value, f"property {name}"
    assert fast["properties"]["delivery_tag"] != reference["properties"]["delivery_tag"]
    uuid.UUID(fast["properties"]["delivery_tag"])
    assert fast["headers"]["id"] == sent.occurrence_id
    assert fast["properties"]["body_encoding"] == "base64"
    # Worker logs, events and Flower show the user's task, not the wrapper.
    assert fast["headers"]["shadow"] == reference["headers"]["shadow"] == sent.task


@pytest.mark.redis
def test_routes_the_fast_path_cannot_reproduce_go_through_the_fallback(
    app: Celery, client: redis.Redis
) -> None:
    fallback = RecordingPublisher()
    publisher = RedisFastPublisher(app, fallback=fallback)
    topic, plain = message(queue="fan"), message()

    publisher.publish([topic, plain])

    assert fallback.task_ids == [topic.occurrence_id]
    assert [m["headers"]["id"] for m in pop_all(client, "celery")] == [plain.occurrence_id]


@pytest.mark.redis
def test_publisher_for_picks_the_fast_path_only_for_redis(app: Celery) -> None:
    assert isinstance(publisher_for(app), RedisFastPublisher)
    amqp = Celery("amqp", broker="amqp://guest:guest@127.0.0.1:5672//", set_as_current=False)
    assert isinstance(publisher_for(amqp), CeleryPublisher)
    amqp.close()


def test_unreachable_redis_raises_coordination_unavailable() -> None:
    app = Celery("down", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.task_queues = [Queue("celery")]
    publisher = RedisFastPublisher(app)
    publisher._declared.add("celery")  # skip kombu's declare, whose retries are its own
    with pytest.raises(errors.CoordinationUnavailable, match="did not accept a batch of 2"):
        publisher.publish([message(), message()])
    app.close()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(value=st.dictionaries(st.text(max_size=10), json_values, max_size=6))
@settings(max_examples=400, deadline=None)
def test_celery_saferepr_is_celerys_saferepr(value: dict[str, Any]) -> None:
    for maxsize, maxlevels in ((1024, 3), (64, 3), (1024, 1), (30, 0)):
        expected = saferepr(value, maxsize, maxlevels=maxlevels)
        assert celery_saferepr(value, maxsize, maxlevels) == expected
