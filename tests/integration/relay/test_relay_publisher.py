"""The Celery publisher against a real Redis broker: envelope, task id, headers, routing."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from celery import Celery

from celery_scheduler import errors
from celery_scheduler.publishers import RUN_OCCURRENCE_TASK, OccurrenceMessage
from celery_scheduler.publishers.celery import CeleryPublisher

pytestmark = pytest.mark.redis
WHEN = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def decode_kombu_redis_message(raw: bytes | str) -> dict[str, Any]:
    """One entry of a kombu Redis queue list -> ``{"id", "task", "headers", "kwargs"}``."""
    envelope = json.loads(raw)
    headers = envelope["headers"]
    body = envelope["body"]
    if envelope["properties"].get("body_encoding") == "base64":
        body = base64.b64decode(body)
    _args, kwargs, _embed = json.loads(body)
    return {"id": headers["id"], "task": headers["task"], "headers": headers, "kwargs": kwargs}


def read_queue(redis_url: str, queue: str) -> list[dict[str, Any]]:
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        return [decode_kombu_redis_message(raw) for raw in client.lrange(queue, 0, -1)]
    finally:
        client.close()


@pytest.fixture
def app(redis_url: str) -> Iterator[Celery]:
    app = Celery("publisher-test", broker=redis_url, set_as_current=False)
    app.conf.task_routes = {"reports.*": {"queue": "reports"}}

    @app.task(name="pinned.task", queue="pinned", shared=False)
    def pinned() -> None:  # pragma: no cover - never executed here
        pass

    yield app
    app.close()


def message(task: str, queue: str = "", priority: int = 0) -> OccurrenceMessage:
    return OccurrenceMessage(
        occurrence_id=str(uuid.uuid4()),
        schedule_id=str(uuid.uuid4()),
        schedule_version=2,
        scheduled_for=WHEN,
        tenant="acme",
        task=task,
        args=(1, "a"),
        kwargs={"k": 1},
        queue=queue,
        priority=priority,
    )


def test_messages_carry_the_occurrence_id_headers_and_real_task_routing(
    app: Celery, redis_url: str
) -> None:
    explicit = message("reports.daily", queue="special")
    routed = message("reports.daily")
    pinned = message("pinned.task")
    default = message("billing.ping")

    CeleryPublisher(app).publish([explicit, routed, pinned, default])

    queues = {q: read_queue(redis_url, q) for q in ("special", "reports", "pinned", "celery")}
    assert {q: [m["id"] for m in got] for q, got in queues.items()} == {
        "special": [explicit.occurrence_id],
        "reports": [routed.occurrence_id],
        "pinned": [pinned.occurrence_id],
        "celery": [default.occurrence_id],
    }
    (sent,) = queues["reports"]
    assert sent["task"] == RUN_OCCURRENCE_TASK
    assert sent["kwargs"] == routed.task_kwargs()
    assert sent["kwargs"]["task"] == "reports.daily"
    assert sent["kwargs"]["scheduled_for"] == "2026-03-01T12:00:00.000000Z"
    for name, value in routed.headers().items():
        assert sent["headers"][name] == value
    assert sent["headers"]["scheduler_tenant"] == "acme"


def test_unreachable_broker_raises_coordination_unavailable() -> None:
    app = Celery("down", broker="redis://127.0.0.1:1/0", set_as_current=False)
    publisher = CeleryPublisher(
        app, retry_policy={"max_retries": 1, "interval_start": 0, "interval_step": 0.1}
    )
    with pytest.raises(errors.CoordinationUnavailable, match="did not accept a batch of 1"):
        publisher.publish([message("billing.ping")])
    app.close()
