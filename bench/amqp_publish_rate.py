"""Publish rate on RabbitMQ: ``send_task`` (CeleryPublisher) vs the AMQP fast path.

    python -m bench.amqp_publish_rate [--count 100000] [--kombu-count 5000] \\
        [--broker amqp://guest:guest@127.0.0.1:5672/bench]

One process, persistent messages (``--transient``: not) to a durable classic queue of the
run's own (deleted afterwards; ``--queue-version 2``: RabbitMQ's CQv2 storage).
Prints messages/s for: the kombu path (``--kombu-count`` messages, without and with
kombu's ``confirm_publish``), the fast path's preparation (done ahead of the due time by the
burst relay), its pipelined confirmed publish of the prepared messages (what happens at the
instant; with the publisher's own CPU time), and the fast path end to end (prepare +
publish). Every count is checked on the queue afterwards.
"""

from __future__ import annotations

import argparse
import time
import uuid
from datetime import UTC, datetime

from celery import Celery
from kombu import Queue

from celery_scheduler.publishers import OccurrenceMessage
from celery_scheduler.publishers.amqp_fast import AmqpFastPublisher
from celery_scheduler.publishers.celery import CeleryPublisher


def messages(count: int) -> list[OccurrenceMessage]:
    at = datetime.now(UTC)
    return [
        OccurrenceMessage(
            occurrence_id=str(uuid.uuid4()),
            schedule_id=str(uuid.uuid4()),
            schedule_version=1,
            scheduled_for=at,
            tenant="bench",
            task="billing.ping",
            args=(i,),
        )
        for i in range(count)
    ]


def rate(count: int, seconds: float) -> str:
    return f"{count / seconds:>10,.0f} msg/s ({count:,} in {seconds:.2f} s)"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--kombu-count", type=int, default=5_000)
    parser.add_argument(
        "--chunk",
        type=int,
        default=AmqpFastPublisher.publish_chunk,
        help="messages written before their confirms are awaited (the burst relay's chunk)",
    )
    parser.add_argument("--broker", default="amqp://guest:guest@127.0.0.1:5672/bench")
    parser.add_argument(
        "--transient", action="store_true", help="delivery_mode 1 (where RabbitMQ's time goes)"
    )
    parser.add_argument(
        "--queue-version", type=int, choices=(1, 2), help="x-queue-version of the classic queue"
    )
    args = parser.parse_args()
    queue = f"cs-bench-{uuid.uuid4().hex[:8]}"
    queue_arguments = {"x-queue-version": args.queue_version} if args.queue_version else None
    app = Celery("amqp-publish-rate", broker=args.broker, set_as_current=False)
    app.conf.task_default_queue = queue
    app.conf.task_queues = [Queue(queue, queue_arguments=queue_arguments)]
    if args.transient:
        app.conf.task_default_delivery_mode = "transient"

    def drain() -> int:
        with app.connection_for_write() as conn:
            return int(conn.default_channel.queue_purge(queue) or 0)

    fast = AmqpFastPublisher(app, timeout=30, chunk_size=args.chunk)
    try:
        fast.publish(messages(10))  # connect and declare once, as a running relay has
        drain()

        batch = messages(args.kombu_count)
        started = time.perf_counter()
        CeleryPublisher(app).publish(batch)
        kombu_s = time.perf_counter() - started
        assert drain() == args.kombu_count

        # kombu with publisher confirms (transport option confirm_publish): what "accepted
        # means durable" costs on kombu's path, a round trip per message.
        confirming = Celery("amqp-publish-rate-confirm", broker=args.broker, set_as_current=False)
        confirming.conf.task_default_queue = queue
        confirming.conf.task_queues = app.conf.task_queues
        confirming.conf.task_default_delivery_mode = app.conf.task_default_delivery_mode
        confirming.conf.broker_transport_options = {"confirm_publish": True}
        batch = messages(args.kombu_count)
        started = time.perf_counter()
        CeleryPublisher(confirming).publish(batch)
        kombu_confirm_s = time.perf_counter() - started
        confirming.close()
        assert drain() == args.kombu_count

        batch = messages(args.count)
        started = time.perf_counter()
        prepared = fast.prepare(batch)
        prepare_s = time.perf_counter() - started
        started, cpu = time.perf_counter(), time.process_time()
        fast.publish_prepared(prepared)
        publish_s = time.perf_counter() - started
        publish_cpu = time.process_time() - cpu
        assert drain() == args.count

        batch = messages(args.count)
        started = time.perf_counter()
        fast.publish(batch)
        end_to_end_s = time.perf_counter() - started
        assert drain() == args.count
    finally:
        fast.close()
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(queue)
            conn.default_channel.exchange_delete(queue)
        app.close()

    kombu_rate = args.kombu_count / kombu_s
    mode = "transient" if args.transient else "persistent"
    version = f", x-queue-version {args.queue_version}" if args.queue_version else ""
    print(
        f"RabbitMQ {args.broker}, {mode} messages, durable queue{version}, one process, "
        f"chunks of {args.chunk:,}"
    )
    print(f"  send_task (kombu)                  {rate(args.kombu_count, kombu_s)}")
    print(f"  send_task, kombu confirm_publish   {rate(args.kombu_count, kombu_confirm_s)}")
    print(f"  fast path, prepare only            {rate(args.count, prepare_s)}")
    print(f"  fast path, publish prepared        {rate(args.count, publish_s)}")
    print(
        f"    of which the publisher's CPU     {publish_cpu:.2f} s (the rest: waiting on RabbitMQ)"
    )
    print(f"  fast path, prepare + publish       {rate(args.count, end_to_end_s)}")
    print(
        f"  speed-up at the due instant        {args.count / publish_s / kombu_rate:.0f}x "
        "(publish prepared vs send_task)"
    )


if __name__ == "__main__":
    main()
