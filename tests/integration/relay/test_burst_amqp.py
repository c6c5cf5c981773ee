"""The burst relay on PostgreSQL + RabbitMQ (the AMQP fast path): on time, once each, and a
broker refusal marks nothing."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta

import pytest
from celery import Celery
from kombu import Queue

from celery_scheduler import errors
from celery_scheduler.core.clock import SystemClock
from celery_scheduler.core.enums import OccurrenceState
from celery_scheduler.publishers.amqp_fast import AmqpFastPublisher, PreparedAmqpMessage
from django_app.models import Occurrence, OutboxEntry
from django_app.relay.burst import BurstRelay
from tests.integration.publishers.test_amqp_fast_publisher import (
    amqp_channel,
    get_all,
    headers_of,
    message,
    rabbitmq_url,
)
from tests.integration.relay.test_burst import seed

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("burst-amqp-test", broker=rabbitmq_url(), set_as_current=False)
    tag = uuid.uuid4().hex[:8]
    app.conf.task_default_queue = f"cs-burst-{tag}"  # the test's own default queue
    app.conf.task_queues = [
        Queue(f"cs-burst-{tag}"),
        Queue(
            f"cs-burst-capped-{tag}",
            queue_arguments={"x-max-length": 12, "x-overflow": "reject-publish"},
        ),
    ]
    yield app
    with app.connection_for_write() as conn:
        channel = amqp_channel(conn)
        for queue in app.amqp.queues.values():  # with the exchanges Celery gave them
            channel.queue_delete(queue.name)
            channel.exchange_delete(queue.exchange.name)
    app.close()


def run_waves(relay: BurstRelay, clock: SystemClock) -> None:
    while (hold := relay.next_due_at()) is not None:
        clock.sleep(max(0.0, (hold - clock.now()).total_seconds()))
        relay.publish_held()


def test_burst_to_rabbitmq_arrives_once_each_on_time(
    app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="django_app.relay.burst")
    clock = SystemClock()
    at = datetime.now(UTC) + timedelta(seconds=3)
    seed(clock, [(at, 400)])
    publisher = AmqpFastPublisher(app)
    try:
        relay = BurstRelay(clock=clock, publisher=publisher, node="n1")
        relay.poll()
        assert relay.held() == 400
        held = [r.prepared for w in relay._waves for r in w.rows]
        # What is held until T is the frames, not the source message; connected and the
        # queue declared already, so the instant pays neither.
        assert all(p.message is None and p.head and p.body for p in held)
        assert publisher._session is not None
        assert publisher._session.declared == {app.conf.task_default_queue}
        run_waves(relay, clock)
    finally:
        publisher.close()
    got = get_all(app, app.conf.task_default_queue)
    ids = [headers_of(m)["id"] for m in got]
    assert sorted(ids) == sorted(str(i) for i in Occurrence.objects.values_list("id", flat=True))
    assert all(m.properties["delivery_mode"] == 2 for m in got)
    lags = sorted(
        (o.enqueued_at - o.available_at).total_seconds()
        for o in Occurrence.objects.all()
        if o.enqueued_at is not None
    )
    assert len(lags) == 400
    assert lags[0] >= 0
    assert lags[-1] < 2.0, lags[-1]
    assert OutboxEntry.objects.filter(sent_at__isnull=True).count() == 0
    assert set(OutboxEntry.objects.values_list("publish_count", flat=True)) == {1}
    waves = [r for r in caplog.records if r.name == "django_app.relay.burst"]
    assert [r.levelno for r in waves] == [logging.INFO]
    assert waves[0].getMessage().startswith("burst relay: 400 row(s) due ")


def test_a_nacked_wave_marks_nothing_and_goes_out_later(app: Celery) -> None:
    clock = SystemClock()
    capped = app.conf.task_queues[1].name
    app.conf.task_default_queue = capped
    at = datetime.now(UTC) + timedelta(seconds=2)
    seed(clock, [(at, 12)])
    publisher = AmqpFastPublisher(app)
    try:
        # 8 of the queue's 12 places taken: the broker nacks the wave's publishes past 4.
        publisher.publish([message(queue=capped) for _ in range(8)])
        relay = BurstRelay(clock=clock, publisher=publisher, node="n1")
        relay.poll()
        assert relay.held() == 12
        with pytest.raises(errors.CoordinationUnavailable, match=r"basic\.nack"):
            run_waves(relay, clock)
        # Accepted means confirmed: the wave rolled back, nothing is marked sent, the
        # claims are given back.
        assert OutboxEntry.objects.filter(sent_at__isnull=True).count() == 12
        assert not Occurrence.objects.filter(state=OccurrenceState.ENQUEUED.value).exists()
        assert set(OutboxEntry.objects.values_list("claimed_by", flat=True)) == {""}
        assert len(get_all(app, capped)) == 12  # 8 + the 4 accepted (drained: room again)
        # The next poll publishes every row (the 4 accepted ones again: at-least-once
        # under the same task ids, which workers fence) and marks them.
        relay.poll()
        run_waves(relay, clock)
    finally:
        publisher.close()
    assert OutboxEntry.objects.filter(sent_at__isnull=True).count() == 0
    ids = sorted(headers_of(m)["id"] for m in get_all(app, capped))
    assert ids == sorted(str(i) for i in Occurrence.objects.values_list("id", flat=True))


class CallSizes(AmqpFastPublisher):
    """Records how many messages each ``publish_prepared`` call of the relay carries."""

    calls: list[int]

    def publish_prepared(self, prepared: Sequence[PreparedAmqpMessage]) -> None:
        self.calls.append(len(prepared))
        super().publish_prepared(prepared)


def test_each_publish_call_fits_the_relay_transactions_idle_bound(app: Celery) -> None:
    """RabbitMQ takes ~5,000-9,000 confirmed messages/s on the test machine: a 5,000-row
    call (the Redis chunk) can leave the wave's transaction idle past claim_grace_seconds
    (2 s), and PostgreSQL then ends the session. The relay publishes the AMQP publisher's
    smaller chunks, with a keepalive between them."""
    clock = SystemClock()
    at = datetime.now(UTC) + timedelta(seconds=3)
    seed(clock, [(at, 2_500)])
    publisher = CallSizes(app)
    publisher.calls = []
    try:
        relay = BurstRelay(clock=clock, publisher=publisher, node="n1")
        relay.poll()
        run_waves(relay, clock)
    finally:
        publisher.close()
    assert sum(publisher.calls) == 2_500
    assert max(publisher.calls) <= AmqpFastPublisher.publish_chunk
    assert OutboxEntry.objects.filter(sent_at__isnull=True).count() == 0
    assert len(get_all(app, app.conf.task_default_queue)) == 2_500
