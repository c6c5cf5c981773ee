"""One suite over every publisher, each on a real broker (the ``publisher`` fixture of
``tests/contracts.py``): kombu's ``send_task`` path, the Redis fast path, the AMQP fast path.

What the relays rely on from any publisher: a batch arrives once per message, in order per
queue (across the fast paths' chunks), on the queue Celery's routing names, with the
occurrence id as the task id and the user's task as the name workers and Flower show.
That each fast path writes what kombu writes, field by field, is that path's own promise
(``test_redis_fast_publisher.py``, ``test_amqp_fast_publisher.py``).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from celery_scheduler.publishers import OccurrenceMessage
from tests.contracts import PublisherCase

WHEN = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)


def message(task: str = "billing.ping", **fields: Any) -> OccurrenceMessage:
    values: dict[str, Any] = {
        "occurrence_id": str(uuid.uuid4()),
        "schedule_id": str(uuid.uuid4()),
        "schedule_version": 3,
        "scheduled_for": WHEN,
        "tenant": "acme",
        "task": task,
        "args": (1, "it's", [2, {"deep": [None, True, 1.5]}]),
        "kwargs": {"customer": "c-1", "note": 'quote " and \\ backslash', "é": "ü"},
    }
    values.update(fields)
    return OccurrenceMessage(**values)


def test_a_batch_arrives_once_each_in_order_per_queue_across_chunks(
    publisher: PublisherCase,
) -> None:
    batch = [message(args=(i,)) for i in range(50)] + [message("reports.x") for _ in range(3)]
    publisher.publisher.publish(batch)
    last = message()
    publisher.publisher.publish([last])  # a second batch on the same publisher

    assert publisher.ids("celery") == [m.occurrence_id for m in [*batch[:50], last]]
    assert publisher.ids("reports") == [m.occurrence_id for m in batch[50:]]
    assert publisher.ids("special") == []


@pytest.mark.parametrize(
    ("fields", "queue"),
    [({}, "celery"), ({"task": "reports.daily"}, "reports"), ({"queue": "special"}, "special")],
    ids=["default-queue", "routed", "explicit-queue"],
)
def test_each_message_goes_to_its_queue_with_its_occurrence_id_and_task(
    publisher: PublisherCase, fields: dict[str, Any], queue: str
) -> None:
    if "queue" in fields:
        fields = {**fields, "queue": publisher.queue(fields["queue"])}
    sent = message(**fields)
    publisher.publisher.publish([sent])

    (headers,) = publisher.headers(queue)
    assert headers["id"] == sent.occurrence_id
    # Worker logs, events and Flower show the user's task, not the wrapper.
    assert headers["shadow"] == sent.task
    others = {"celery", "reports", "special"} - {queue}
    assert all(publisher.ids(other) == [] for other in others)
