"""Redis fast path: prepared Celery messages, one pipelined LPUSH batch per publish.

``app.send_task`` costs about a millisecond per message (routing, retry wrapper, a Redis
round trip each), which caps one relay near a thousand messages a second. This publisher
builds the *same* bytes kombu's Redis transport would LPUSH (Celery task protocol 2 from
``celery.app.amqp.AMQP.as_task_v2``, the envelope of ``kombu.transport.virtual.Channel``
``prepare_message`` + ``_inplace_augment_message``, list naming of
``kombu.transport.redis.Channel._q_for_pri``), can do so ahead of the due time
(:meth:`RedisFastPublisher.prepare`), and sends a whole batch with one non-transactional
pipeline (:meth:`RedisFastPublisher.publish_prepared`).

Only what the fast path reproduces exactly goes through it: queues on a direct exchange
published via the anonymous exchange (Celery's default for direct routes), no queue
``expires``, no compression, no per-message ``expires``. Every other message goes through
the fallback publisher (kombu), so choosing this publisher never changes what a worker
receives. :func:`publisher_for` picks it for ``redis://`` / ``rediss://`` brokers.
"""

from __future__ import annotations

import base64
import logging
import threading
import uuid
from bisect import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from celery_scheduler import errors
from celery_scheduler.publishers import (
    REDIS_SCHEMES,
    OccurrenceMessage,
    PreparingPublisher,
    Publisher,
)
from celery_scheduler.publishers.celery import CeleryPublisher
from celery_scheduler.publishers.protocol2 import (
    DEFAULT_PUBLISH_TIMEOUT,
    FastPathUnsupported,
    Route,
    TaskMessages,
    bounded_transport_options,
    broker_timeout,
    celery_saferepr,
    kombu_json,
)

__all__ = [
    "DEFAULT_PUBLISH_TIMEOUT",
    "FAST_SCHEMES",
    "KOMBU_PRIORITY_STEPS",
    "KOMBU_REDIS_SEP",
    "FastPathUnsupported",
    "PreparedMessage",
    "RedisFastPublisher",
    "bounded_transport_options",
    "broker_timeout",
    "celery_saferepr",
    "is_fast_broker",
    "publisher_for",
]

logger = logging.getLogger(__name__)

#: kombu.transport.redis defaults (Channel.sep, PRIORITY_STEPS).
KOMBU_REDIS_SEP = "\x06\x16"
KOMBU_PRIORITY_STEPS = (0, 3, 6, 9)
FAST_SCHEMES = REDIS_SCHEMES


@dataclass(frozen=True, slots=True)
class PreparedMessage:
    """One message ready to LPUSH: ``key`` is the Redis list, ``payload`` the JSON bytes,
    ``queue`` the kombu queue (declared before the first push to it).

    A burst relay holds hundreds of thousands of these until their instant, so only what
    the push needs is kept (``key`` and ``queue`` are shared strings): about the payload's
    size each. ``key`` is ``None`` when the route needs kombu; then ``message`` is kept for
    the fallback publisher (and ``payload`` is empty).
    """

    key: str | None
    payload: bytes
    queue: str = ""
    message: OccurrenceMessage | None = None


def is_fast_broker(url: object) -> bool:
    return isinstance(url, str) and url.startswith(FAST_SCHEMES) and ";" not in url


class RedisFastPublisher(PreparingPublisher):
    """Implements :class:`celery_scheduler.publishers.Publisher` for Redis brokers.

    ``chunk_size`` bounds the commands per pipeline round trip (memory on both sides).
    Thread-safe for concurrent ``publish`` calls (redis-py's pool hands each its own
    connection); ``prepare`` is pure CPU and may run in any thread.
    """

    def __init__(
        self,
        app: Any,
        *,
        client: redis.Redis | None = None,
        fallback: Publisher | None = None,
        chunk_size: int = 5_000,
        timeout: float | None = None,
    ) -> None:
        url = app.conf.broker_write_url or app.conf.broker_url
        if not is_fast_broker(url):
            raise FastPathUnsupported(
                f"the Redis fast path needs a single redis:// or rediss:// broker URL, got {url!r}"
            )
        options = dict(app.conf.broker_transport_options or {})
        self.app = app
        self.chunk_size = chunk_size
        # A hung Redis must fail the push (the relay's transaction then rolls back and its
        # row locks go), not hold it forever: every socket wait is bounded.
        self.timeout = broker_timeout(app, timeout)
        self.client = (
            client
            if client is not None
            else redis.Redis.from_url(
                url, socket_timeout=self.timeout, socket_connect_timeout=self.timeout
            )
        )
        self.fallback: Publisher = (
            fallback if fallback is not None else CeleryPublisher(app, timeout=self.timeout)
        )
        self._keyprefix = str(options.get("global_keyprefix", ""))
        self._sep = str(options.get("sep", KOMBU_REDIS_SEP))  # kombu: a transport option too
        self._steps = tuple(options.get("priority_steps", KOMBU_PRIORITY_STEPS))
        self._body_encoding = options.get("body_encoding", "base64")
        if self._body_encoding != "base64":
            raise FastPathUnsupported(f"body_encoding {self._body_encoding!r} is not rebuilt here")
        self.messages = TaskMessages(app, timeout=self.timeout, path="Redis")
        self._keys: dict[tuple[str, int], str] = {}
        self._declared: set[str] = set()
        self._lock = threading.Lock()

    # -- preparation (pure CPU, may run ahead of the due time) --------------------------

    def prepare(self, messages: Iterable[OccurrenceMessage]) -> list[PreparedMessage]:
        """Build the exact Redis payloads; cheap enough to run while claiming ahead."""
        return [self._prepare_one(message) for message in messages]

    def _prepare_one(self, message: OccurrenceMessage) -> PreparedMessage:
        route = self.messages.route(message)
        if route.key is None:
            return PreparedMessage(None, b"", route.queue, message)
        priority = self.messages.priority(message)
        envelope = self.envelope(message, route=route, priority=priority)
        payload = kombu_json(envelope).encode()
        return PreparedMessage(self._list_key(route.key, priority), payload, route.queue)

    def envelope(
        self, message: OccurrenceMessage, *, route: Route | None = None, priority: int = 0
    ) -> dict[str, Any]:
        """The dict kombu's Redis channel would JSON-dump for this message (field by field)."""
        route = route or self.messages.route(message)
        task_id = message.task_id
        kwargs = message.task_kwargs()
        content_type, content_encoding, body = self.messages.body(kwargs)
        return {
            "body": base64.b64encode(body).decode(),
            "content-encoding": content_encoding,
            "content-type": content_type,
            "headers": self.messages.headers(message, kwargs),
            "properties": {
                "correlation_id": task_id,
                "reply_to": self.messages.thread_oid(),
                "delivery_mode": route.delivery_mode,
                "delivery_info": {"exchange": "", "routing_key": route.queue},
                "priority": priority,
                "body_encoding": self._body_encoding,
                "delivery_tag": str(uuid.uuid4()),
            },
        }

    # -- publishing ---------------------------------------------------------------------

    def publish(self, messages: Sequence[OccurrenceMessage]) -> None:
        if messages:
            self.publish_prepared(self.prepare(messages))

    def publish_prepared(self, prepared: Sequence[PreparedMessage]) -> None:
        """LPUSH every prepared message (pipelined); the rest through the fallback."""
        fast = [p for p in prepared if p.key is not None]
        slow = [p.message for p in prepared if p.key is None and p.message is not None]
        if fast:
            self._declare(fast)
            try:
                for start in range(0, len(fast), self.chunk_size):
                    self._push(fast[start : start + self.chunk_size])
            except redis.RedisError as exc:
                raise errors.CoordinationUnavailable(
                    f"Redis did not accept a batch of {len(fast)} prepared message(s): "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
        if slow:
            self.fallback.publish(slow)

    def _push(self, chunk: Sequence[PreparedMessage]) -> None:
        # One multi-value LPUSH per list: LPUSH k a b c leaves a next for BRPOP, so the
        # consumer order is the batch order, as with one LPUSH per message.
        by_key: dict[str, list[bytes]] = {}
        for item in chunk:
            by_key.setdefault(item.key, []).append(item.payload)  # type: ignore[arg-type]
        pipe = self.client.pipeline(transaction=False)
        for key, payloads in by_key.items():
            pipe.lpush(key, *payloads)
        pipe.execute()

    # -- routing ------------------------------------------------------------------------

    def _list_key(self, queue: str, priority: int) -> str:
        # kombu.transport.redis.Channel._q_for_pri + GlobalKeyPrefixMixin. Cached: one
        # shared string per list instead of one per held message.
        key = self._keys.get((queue, priority))
        if key is None:
            step = self._steps[bisect(self._steps, max(0, min(int(priority), 9))) - 1]
            name = f"{queue}{self._sep}{step}" if step else queue
            key = self._keys[(queue, priority)] = f"{self._keyprefix}{name}"
        return key

    def declare(self, prepared: Sequence[PreparedMessage]) -> None:
        """Declare the queues of ``prepared`` now (a relay holding them calls this ahead of
        their time, so the first push at the instant pays no kombu connection)."""
        self._declare([p for p in prepared if p.key is not None])

    def _declare(self, fast: Sequence[PreparedMessage]) -> None:
        """Declare each queue once, with kombu itself, as ``send_task`` would."""
        needed = {p.queue for p in fast} - self._declared
        if not needed:
            return
        with self._lock:
            needed -= self._declared
            if not needed:
                return
            try:
                with self.app.connection_for_write(
                    connect_timeout=self.timeout,
                    transport_options=bounded_transport_options(self.app, self.timeout),
                ) as conn:
                    channel = conn.default_channel
                    for name in needed:
                        self.app.amqp.queues[name](channel).declare()
            except Exception as exc:
                raise errors.CoordinationUnavailable(
                    f"could not declare queue(s) {sorted(needed)} on the broker: {exc}"
                ) from exc
            self._declared |= needed


def publisher_for(app: Any, **kwargs: Any) -> Publisher:
    """The fastest publisher that writes exactly what kombu would for ``app``'s broker."""
    url = app.conf.broker_write_url or app.conf.broker_url
    if is_fast_broker(url):
        try:
            return RedisFastPublisher(app, **kwargs)
        except FastPathUnsupported as exc:
            logger.info("Redis fast path off, publishing through kombu: %s", exc)
    return CeleryPublisher(app, timeout=kwargs.get("timeout"))
