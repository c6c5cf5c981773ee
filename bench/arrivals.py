"""The benchmarks' broker-side clock without a consumer: sample the queue length, read later.

    python -m bench.arrivals <broker url> <queue> <expected> <deadline epoch> <out.json>
        [--settle SECONDS] [--interval SECONDS]

Nothing consumes the queue while the beats publish, so no consumer's speed limits the
measurement (``bench.drain`` was the slower instrument at 500,000: the last messages waited
in the list until it read them). The sampler only asks for the queue's length every
``--interval`` seconds (default 0.02): ``LLEN`` on Redis, a passive ``queue.declare``'s
``message_count`` on RabbitMQ, both one cheap round trip. A queue with no consumer keeps
arrival order (Redis: LPUSH at the head, the oldest at the tail; RabbitMQ: FIFO), so the
message at position i (0 = oldest) arrived at the first sample whose length exceeded i: its
timestamp is at most one interval plus one round trip late, never early.

Sampling stops once ``expected`` messages were counted and none came for ``--settle``
seconds (default 10; on Redis also ``expected`` distinct task ids: duplicates count in a
length), or at the deadline. Then the queue is read oldest
first (Redis: LRANGE slices from the tail; RabbitMQ: a no-ack consumer with a large prefetch)
and every message's Celery headers are decoded: task id (``id``), and for this project's
messages ``scheduler_occurrence_id``, ``scheduler_tenant``, ``scheduler_scheduled_for`` and
``scheduler_schedule_id``. The output JSON holds the samples and, per message in arrival
order, ``[arrival epoch, task id, tenant, scheduled_for, schedule_id]``.
"""

from __future__ import annotations

import argparse
import bisect
import json
import re
import time
from collections import deque
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote, urlparse

SLICE = 5000
#: Protocol-2 headers as the Redis transport serialises them (JSON, ``"key": "value"``).
_HEADER = {
    name: re.compile(rb'"' + name.encode() + rb'": (?:"([^"]*)"|null)')
    for name in (
        "id",
        "scheduler_tenant",
        "scheduler_scheduled_for",
        "scheduler_schedule_id",
    )
}
FIELDS = ("id", "scheduler_tenant", "scheduler_scheduled_for", "scheduler_schedule_id")


class RedisQueue:
    """Celery's Redis queue: a list, LPUSHed by kombu (and by our fast publisher)."""

    def __init__(self, url: str, queue: str) -> None:
        import redis

        self.client = redis.Redis.from_url(url)
        self.key = queue

    def prepare(self) -> None:
        """Nothing to declare: the list appears with its first LPUSH."""

    def length(self) -> int:
        return int(self.client.llen(self.key))

    def read(self, count: int) -> Iterator[dict[str, Any]]:
        """The oldest ``count`` messages, oldest first, without removing them."""
        for start in range(0, count, SLICE):
            stop = min(count, start + SLICE)
            # Index -1 is the oldest (LPUSH adds at the head): -(start+1) .. -stop.
            items = self.client.lrange(self.key, -stop, -(start + 1))
            for raw in reversed(items):
                yield _redis_headers(raw)

    def purge(self) -> None:
        self.client.delete(self.key)

    def close(self) -> None:
        self.client.close()


def _redis_headers(raw: bytes) -> dict[str, Any]:
    # A regex over the bytes, not a JSON parse: 500,000 messages of ~1.8 KB each.
    out: dict[str, Any] = {}
    for name, pattern in _HEADER.items():
        match = pattern.search(raw)
        out[name] = match.group(1).decode() if match and match.group(1) is not None else None
    return out


class AmqpQueue:
    """Celery's default queue on RabbitMQ (classic, durable, bound to the ``celery`` exchange)."""

    def __init__(self, url: str, queue: str) -> None:
        import amqp

        parsed = urlparse(url)
        vhost = unquote(parsed.path[1:]) if parsed.path not in ("", "/") else "/"
        self.conn = amqp.Connection(
            host=f"{parsed.hostname or '127.0.0.1'}:{parsed.port or 5672}",
            userid=unquote(parsed.username or "guest"),
            password=unquote(parsed.password or "guest"),
            virtual_host=vhost,
        )
        self.conn.connect()
        self.channel = self.conn.channel()
        self.queue = queue

    def prepare(self) -> None:
        """Declare what Celery declares for its default queue, so the length exists from t0."""
        self.channel.exchange_declare(self.queue, "direct", durable=True, auto_delete=False)
        self.channel.queue_declare(self.queue, durable=True, auto_delete=False)
        self.channel.queue_bind(self.queue, self.queue, self.queue)

    def length(self) -> int:
        return int(self.channel.queue_declare(self.queue, passive=True).message_count)

    def read(self, count: int) -> Iterator[dict[str, Any]]:
        got: deque[dict[str, Any]] = deque()

        def on_message(message: Any) -> None:
            headers = message.properties.get("application_headers") or {}
            got.append({name: _text(headers.get(name)) for name in FIELDS})

        self.channel.basic_qos(0, 10000, False)
        tag = self.channel.basic_consume(self.queue, callback=on_message, no_ack=True)
        seen = 0
        while seen < count:
            try:
                self.conn.drain_events(timeout=5)
            except TimeoutError:
                break
            while got:
                seen += 1
                yield got.popleft()
        self.channel.basic_cancel(tag)

    def purge(self) -> None:
        try:
            self.channel.queue_delete(self.queue)
        except Exception:  # the queue may not exist yet: a 404 closes the channel
            self.channel = self.conn.channel()

    def close(self) -> None:
        self.conn.close()


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def open_queue(url: str, queue: str = "celery") -> RedisQueue | AmqpQueue:
    if url.startswith(("redis://", "rediss://")):
        return RedisQueue(url, queue)
    if url.startswith(("amqp://", "pyamqp://")):
        return AmqpQueue(url, queue)
    raise SystemExit(f"unsupported broker {url!r}: redis:// or amqp://")


def sample(
    q: RedisQueue | AmqpQueue,
    *,
    expected: int,
    deadline: float,
    settle: float,
    interval: float,
) -> list[tuple[float, int]]:
    """(epoch, length) at every change of the length, until settled or the deadline.

    Settled: at least ``expected`` messages and no new one for ``settle`` seconds. A length
    counts duplicates too, so on Redis (readable without consuming) the distinct task ids
    are also checked: fewer than ``expected`` keeps sampling until the deadline.
    """
    samples: list[tuple[float, int]] = []
    last, changed, checked = -1, time.time(), -1
    while True:
        length = q.length()
        now = time.time()
        if length != last:
            samples.append((now, length))
            last, changed = length, now
        if now >= deadline:
            return samples
        if length >= expected and now - changed >= settle and length != checked:
            checked = length
            if not isinstance(q, RedisQueue) or distinct(q, length) >= expected:
                return samples
        time.sleep(interval)


def distinct(q: RedisQueue, length: int) -> int:
    return len({h["id"] for h in q.read(length)})


def arrival_times(samples: list[tuple[float, int]], count: int, read_at: float) -> list[float]:
    """Arrival of the i-th oldest message: the first sample whose length exceeded i."""
    lengths = [n for _, n in samples]
    times = []
    for i in range(count):
        j = bisect.bisect_right(lengths, i)
        times.append(samples[j][0] if j < len(samples) else read_at)
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url")
    parser.add_argument("queue")
    parser.add_argument("expected", type=int)
    parser.add_argument("deadline", type=float)
    parser.add_argument("out")
    parser.add_argument("--settle", type=float, default=10.0)
    parser.add_argument("--interval", type=float, default=0.02)
    args = parser.parse_args(argv)
    q = open_queue(args.url, args.queue)
    q.prepare()
    samples = sample(
        q,
        expected=args.expected,
        deadline=args.deadline,
        settle=args.settle,
        interval=args.interval,
    )
    read_at = time.time()
    final = q.length()
    headers = list(q.read(final))
    times = arrival_times(samples, len(headers), read_at)
    messages = [
        [
            t,
            h["id"],
            h["scheduler_tenant"],
            h["scheduler_scheduled_for"],
            h["scheduler_schedule_id"],
        ]
        for t, h in zip(times, headers, strict=True)
    ]
    q.close()
    with open(args.out, "w") as fh:
        json.dump({"samples": samples, "length_at_read": final, "messages": messages}, fh)


if __name__ == "__main__":
    main()
