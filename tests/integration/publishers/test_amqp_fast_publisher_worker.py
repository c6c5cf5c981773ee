"""A real Celery worker (subprocess) on RabbitMQ runs occurrences the AMQP fast path sent.

The example project's worker runs ``celery_scheduler.run_occurrence``, which claims each
occurrence in the test's PostgreSQL database, runs ``billing.ping`` and completes it: the
occurrences reaching SUCCEEDED with one attempt each proves the worker decoded our frames
(properties, protocol-2 headers, JSON body) exactly as it decodes kombu's messages.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from amqp.protocol import queue_declare_ok_t
from celery import Celery

from celery_scheduler.core.enums import OccurrenceState
from celery_scheduler.publishers import OccurrenceMessage, RecordingPublisher
from celery_scheduler.publishers.amqp_fast import AmqpFastPublisher
from tests.acceptance import support
from tests.integration.publishers.test_amqp_fast_publisher import amqp_channel, rabbitmq_url
from tests.integration.worker_support import make_occurrence, make_schedule

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq, pytest.mark.acceptance]


def waiting(app: Celery, queue: str) -> int:
    """How many messages ``queue`` holds (a passive declare)."""
    with app.connection_for_write() as conn:
        declared = amqp_channel(conn).queue_declare(queue, passive=True)
    # py-amqp returns a queue_declare_ok_t (its stubs say a plain tuple, or None for nowait).
    assert isinstance(declared, queue_declare_ok_t), declared
    return declared.message_count


@pytest.mark.django_db(transaction=True)
def test_real_worker_runs_occurrences_published_by_the_amqp_fast_path(
    tenant: Any, tmp_path: Path
) -> None:
    from django_app.models import Attempt, Occurrence

    url = rabbitmq_url()
    queue = f"cs-fast-worker-{uuid.uuid4().hex[:8]}"  # the test's own queue
    schedule = make_schedule(tenant, task="billing.ping", args=["fast-path"], queue=queue)
    base = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1)
    occurrences = [make_occurrence(schedule, base + timedelta(seconds=i)) for i in range(3)]
    messages = [
        OccurrenceMessage.from_occurrence(occ, schedule, tenant=tenant.slug) for occ in occurrences
    ]
    app = Celery("amqp-fast-publisher", broker=url, set_as_current=False)
    fallback = RecordingPublisher()
    publisher = AmqpFastPublisher(app, fallback=fallback)
    try:
        publisher.publish(messages)
        assert fallback.sent == []
        assert waiting(app, queue) == 3
    finally:
        publisher.close()

    log = tmp_path / "worker.log"
    ids = [occ.id for occ in occurrences]
    worker = support.start_worker(support.process_env(url), log, name="amqpfast", queues=queue)
    try:
        with support.running(worker):
            try:
                support.wait_until(
                    lambda: (
                        Occurrence.objects.filter(
                            id__in=ids, state=OccurrenceState.SUCCEEDED.value
                        ).count()
                        == 3
                    ),
                    timeout=60,
                    what="the worker to run all three occurrences",
                )
            except AssertionError:
                raise AssertionError(support.tail(log)) from None
        assert waiting(app, queue) == 0
    finally:
        with app.connection_for_write() as conn:
            channel = amqp_channel(conn)
            channel.queue_delete(queue)
            channel.exchange_delete(queue)
        app.close()

    assert Attempt.objects.filter(occurrence_id__in=ids).count() == 3
    text = log.read_text()
    for occ in occurrences:
        # The worker names the user's task (the message's shadow name), not the wrapper.
        assert f"{occ.schedule.task}[{occ.id}]" in text
        assert f"celery_scheduler.run_occurrence[{occ.id}]" not in text
