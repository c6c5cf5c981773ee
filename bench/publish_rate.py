"""Publish rate of ``send_task`` (CeleryPublisher) vs the Redis fast path, one process.

    python -m bench.publish_rate [--count 10000] [--redis redis://127.0.0.1:6379/8]
        [--amqp amqp://guest:guest@127.0.0.1:5672/bench]

Prints messages/s for: the kombu path, the fast path end to end (prepare + push), and its
two halves (prepare ahead of time; pipelined push of prepared messages). With ``--amqp``
also the kombu path (``CeleryPublisher``, what the relay uses on RabbitMQ) into that
broker's default queue, without and with publisher confirms (``confirm_publish``: each
publish returns only after the broker's ack, i.e. the persistent message is on disk).
"""

from __future__ import annotations

import argparse
import time
import uuid
from datetime import UTC, datetime

import redis
from celery import Celery

from celery_scheduler.publishers import OccurrenceMessage
from celery_scheduler.publishers.celery import CeleryPublisher
from celery_scheduler.publishers.redis_fast import RedisFastPublisher


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
    return f"{count / seconds:>10,.0f} msg/s ({seconds:.2f} s)"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/8")
    parser.add_argument("--amqp", default="", help="also measure RabbitMQ at this URL")
    args = parser.parse_args()
    client = redis.Redis.from_url(args.redis)
    app = Celery("publish-rate", broker=args.redis, set_as_current=False)
    app.conf.task_serializer = "json"

    client.flushdb()
    batch = messages(args.count)
    started = time.perf_counter()
    CeleryPublisher(app).publish(batch)
    kombu_s = time.perf_counter() - started
    assert client.llen("celery") == args.count

    fast = RedisFastPublisher(app)
    fast.publish(messages(10))  # declare the queue once, as a running relay has
    client.flushdb()
    batch = messages(args.count)
    started = time.perf_counter()
    fast.publish(batch)
    end_to_end_s = time.perf_counter() - started
    assert client.llen("celery") == args.count

    client.flushdb()
    batch = messages(args.count)
    started = time.perf_counter()
    prepared = fast.prepare(batch)
    prepare_s = time.perf_counter() - started
    started = time.perf_counter()
    fast.publish_prepared(prepared)
    push_s = time.perf_counter() - started
    assert client.llen("celery") == args.count
    client.flushdb()

    print(f"{args.count} messages, one process, Redis {args.redis}")
    print(f"  send_task (kombu)             {rate(args.count, kombu_s)}")
    print(f"  fast path, prepare + push     {rate(args.count, end_to_end_s)}")
    print(f"  fast path, prepare only       {rate(args.count, prepare_s)}")
    print(f"  fast path, push prepared      {rate(args.count, push_s)}")
    print(f"  speed-up at the due instant   {kombu_s / push_s:.0f}x (push prepared vs send_task)")
    app.close()
    if args.amqp:
        amqp_rates(args.amqp, args.count)


def amqp_rates(url: str, count: int) -> None:
    from bench.arrivals import open_queue

    print(f"{count} messages, one process, RabbitMQ {url} (durable queue, persistent messages)")
    for confirm in (False, True):
        app = Celery("publish-rate", broker=url, set_as_current=False)
        app.conf.task_serializer = "json"
        app.conf.broker_transport_options = {"confirm_publish": confirm}
        queue = open_queue(url)
        queue.purge()
        queue.prepare()
        CeleryPublisher(app).publish(messages(10))  # connect and declare once
        started = time.perf_counter()
        CeleryPublisher(app).publish(messages(count))
        seconds = time.perf_counter() - started
        while queue.length() < count + 10:  # without confirms: wait until all are queued
            time.sleep(0.01)
        queued_s = time.perf_counter() - started
        queue.purge()
        queue.close()
        label = "with confirms   " if confirm else "without confirms"
        print(f"  send_task (kombu), {label} {rate(count, seconds)}; all queued after "
              f"{queued_s:.2f} s")  # fmt: skip
        app.close()


if __name__ == "__main__":
    main()
