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
import json
import logging
import threading
import uuid
from bisect import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from celery.utils.nodenames import anon_nodename
from celery.utils.saferepr import saferepr
from kombu import serialization
from kombu.entity import maybe_delivery_mode
from kombu.utils.json import JSONEncoder

from celery_scheduler import errors
from celery_scheduler.publishers import (
    REDIS_SCHEMES,
    RUN_OCCURRENCE_TASK,
    OccurrenceMessage,
    Publisher,
)
from celery_scheduler.publishers.celery import CeleryPublisher

logger = logging.getLogger(__name__)

#: kombu.transport.redis defaults (Channel.sep, PRIORITY_STEPS).
KOMBU_REDIS_SEP = "\x06\x16"
KOMBU_PRIORITY_STEPS = (0, 3, 6, 9)
FAST_SCHEMES = REDIS_SCHEMES
#: Seconds any broker socket wait may last when neither the caller nor the app sets one.
DEFAULT_PUBLISH_TIMEOUT = 5.0

#: Exec options of the wrapper task that change the wire format in ways we do not rebuild.
_UNSUPPORTED_TASK_OPTIONS = ("expires", "compression", "exchange", "routing_key")

_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


class FastPathUnsupported(errors.SchedulerError):
    """The broker or app configuration needs kombu's general publish path."""


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


@dataclass(frozen=True, slots=True)
class _Route:
    queue: str
    key: str | None  # None: not reproducible here, use the fallback
    delivery_mode: int | None


class _NotPlain(Exception):
    pass


def _plain_repr(value: Any, depth: int, maxlevels: int) -> str:
    """celery.utils.saferepr's text for JSON-like values, when nothing gets truncated."""
    kind = type(value)
    if kind is str:
        return "'" + value.replace("'", "\\'") + "'"
    if value is None:
        return "None"
    if kind in (bool, int, float):
        return str(value)  # saferepr renders numbers.Number with str()
    if kind is list or kind is dict:
        opening, closing = ("[", "]") if kind is list else ("{", "}")
        if maxlevels and depth >= maxlevels:
            return f"{opening}...{closing}"
        if kind is list:
            items = [_plain_repr(v, depth + 1, maxlevels) for v in value]
        else:
            items = []
            for k, v in value.items():
                if type(k) is not str:
                    raise _NotPlain
                items.append(
                    _plain_repr(k, 0, maxlevels) + ": " + _plain_repr(v, depth + 1, maxlevels)
                )
        return opening + ", ".join(items) + closing
    raise _NotPlain


def celery_saferepr(value: Any, maxsize: int, maxlevels: int) -> str:
    """Exactly ``celery.utils.saferepr.saferepr(value, maxsize, maxlevels=maxlevels)``.

    saferepr streams token by token (~0.2 ms for our kwargs, most of the preparation
    cost). For JSON-like values whose text fits in ``maxsize`` nothing is truncated and
    the text has a simple closed form; anything else goes through saferepr itself.
    """
    try:
        text = _plain_repr(value, 0, maxlevels)
    except _NotPlain:
        return str(saferepr(value, maxsize, maxlevels=maxlevels))
    if len(text) < maxsize:
        return text
    return str(saferepr(value, maxsize, maxlevels=maxlevels))


def _kombu_json(value: Any) -> str:
    """kombu.utils.json.dumps; its encoder class only matters for non-JSON types, and
    passing it turns off the C encoder, so it is the fallback here."""
    try:
        return json.dumps(value)
    except TypeError:
        return json.dumps(value, cls=JSONEncoder)


def is_fast_broker(url: object) -> bool:
    return isinstance(url, str) and url.startswith(FAST_SCHEMES) and ";" not in url


class RedisFastPublisher:
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
        self._router = CeleryPublisher(app, timeout=self.timeout)
        self._keyprefix = str(options.get("global_keyprefix", ""))
        self._sep = str(options.get("sep", KOMBU_REDIS_SEP))  # kombu: a transport option too
        self._steps = tuple(options.get("priority_steps", KOMBU_PRIORITY_STEPS))
        self._body_encoding = options.get("body_encoding", "base64")
        if self._body_encoding != "base64":
            raise FastPathUnsupported(f"body_encoding {self._body_encoding!r} is not rebuilt here")
        self._serializer = app.conf.task_serializer
        self._default_delivery_mode = app.conf.task_default_delivery_mode
        self._forced_delivery_mode: Any = None  # set by _wrapper_exec_options
        self._wrapper_options = self._wrapper_exec_options()
        self._routes: dict[tuple[str, str], _Route] = {}
        self._keys: dict[tuple[str, int], str] = {}
        self._declared: set[str] = set()
        self._lock = threading.Lock()
        self._local = threading.local()
        self._origin = anon_nodename()
        # Celery settings are slow attribute look-ups: read them once.
        maxlevels = app.conf.task_repr_maxlevels
        self._argsrepr = saferepr((), app.amqp.argsrepr_maxsize, maxlevels=maxlevels)
        self._repr_limits = (app.amqp.kwargsrepr_maxsize, maxlevels)
        self._timelimit = (
            self._wrapper_options.get("time_limit"),
            self._wrapper_options.get("soft_time_limit"),
        )

    # -- preparation (pure CPU, may run ahead of the due time) --------------------------

    def prepare(self, messages: Iterable[OccurrenceMessage]) -> list[PreparedMessage]:
        """Build the exact Redis payloads; cheap enough to run while claiming ahead."""
        return [self._prepare_one(message) for message in messages]

    def _prepare_one(self, message: OccurrenceMessage) -> PreparedMessage:
        route = self._route(message)
        if route.key is None:
            return PreparedMessage(None, b"", route.queue, message)
        priority = int(message.priority or self._wrapper_options.get("priority") or 0)
        envelope = self.envelope(message, route=route, priority=priority)
        payload = _kombu_json(envelope).encode()
        return PreparedMessage(self._list_key(route.key, priority), payload, route.queue)

    def envelope(
        self, message: OccurrenceMessage, *, route: _Route | None = None, priority: int = 0
    ) -> dict[str, Any]:
        """The dict kombu's Redis channel would JSON-dump for this message (field by field)."""
        route = route or self._route(message)
        task_id = message.task_id
        kwargs = message.task_kwargs()
        headers: dict[str, Any] = {
            "lang": "py",
            "task": RUN_OCCURRENCE_TASK,
            "id": task_id,
            # Worker logs, events and Flower name the user's task, not the wrapper.
            "shadow": message.task,
            "eta": None,
            "expires": None,
            "group": None,
            "group_index": None,
            "retries": 0,
            "timelimit": list(self._timelimit),
            "root_id": task_id,
            "parent_id": None,
            "argsrepr": self._argsrepr,
            "kwargsrepr": celery_saferepr(kwargs, *self._repr_limits),
            "origin": self._origin,
            "ignore_result": None,
            "replaced_task_nesting": 0,
            "stamped_headers": None,
            "stamps": {},
        }
        headers.update(message.headers())
        if self._serializer == "json":
            content_type, content_encoding = "application/json", "utf-8"
            body = _kombu_json(((), kwargs, _EMBED))
        else:
            content_type, content_encoding, body = serialization.dumps(
                ((), kwargs, _EMBED), serializer=self._serializer
            )
        body = base64.b64encode(body if isinstance(body, bytes) else body.encode()).decode()
        return {
            "body": body,
            "content-encoding": content_encoding,
            "content-type": content_type,
            "headers": headers,
            "properties": {
                "correlation_id": task_id,
                "reply_to": self._thread_oid(),
                "delivery_mode": route.delivery_mode,
                "delivery_info": {"exchange": "", "routing_key": route.queue},
                "priority": priority,
                "body_encoding": self._body_encoding,
                "delivery_tag": str(uuid.uuid4()),
            },
        }

    def _thread_oid(self) -> str:
        # app.thread_oid is a per-thread uuid behind a slow property: keep it per thread.
        oid: str | None = getattr(self._local, "oid", None)
        if oid is None:
            oid = self._local.oid = self.app.thread_oid
        return oid

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

    def _route(self, message: OccurrenceMessage) -> _Route:
        cache_key = (message.task, message.queue)
        route = self._routes.get(cache_key)
        if route is None:
            route = self._resolve_route(message)
            if self._routes_are_static():
                self._routes[cache_key] = route
        return route

    def _routes_are_static(self) -> bool:
        # Dict/glob routes depend on the task name only; a router function may look at
        # args, so its answer is not cached.
        from celery.app.routes import MapRoute

        return all(isinstance(r, MapRoute) for r in self.app.amqp.routes)

    def _resolve_route(self, message: OccurrenceMessage) -> _Route:
        options = self._router.route_for(message)
        queue = options.get("queue")
        name = getattr(queue, "name", None)
        exchange = getattr(queue, "exchange", None)
        # Celery: an explicit delivery_mode (the task's) wins over the exchange's.
        mode = maybe_delivery_mode(
            self._forced_delivery_mode
            or getattr(exchange, "delivery_mode", None)
            or self._default_delivery_mode
        )
        reproducible = (
            name is not None
            and getattr(exchange, "type", "direct") == "direct"
            and not (options.get("exchange") and options.get("routing_key"))
            and not getattr(queue, "expires", None)
            and not any(options.get(k) for k in ("expires", "compression"))
        )
        return _Route(queue=name or "", key=name if reproducible else None, delivery_mode=mode)

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

    def _wrapper_exec_options(self) -> dict[str, Any]:
        task = self.app.tasks.get(RUN_OCCURRENCE_TASK) if self.app.finalized else None
        if task is None:
            task = self.app._tasks.get(RUN_OCCURRENCE_TASK)
        if task is None:
            return {}
        found = {k: v for k, v in task._get_exec_options().items() if v is not None}
        bad = [k for k in _UNSUPPORTED_TASK_OPTIONS if found.get(k)]
        if found.get("serializer") and found["serializer"] != self._serializer:
            bad.append("serializer")
        if found.get("delivery_mode"):
            self._forced_delivery_mode = found["delivery_mode"]
        if bad:
            raise FastPathUnsupported(
                f"{RUN_OCCURRENCE_TASK} sets {bad}: the Redis fast path does not rebuild them"
            )
        return found


def broker_timeout(app: Any, timeout: float | None) -> float:
    """``timeout`` if given, else the broker's own ``socket_timeout``, else the default."""
    if timeout is not None:
        return float(timeout)
    options = app.conf.broker_transport_options or {}
    return float(options.get("socket_timeout") or DEFAULT_PUBLISH_TIMEOUT)


def bounded_transport_options(app: Any, timeout: float) -> dict[str, Any]:
    """The app's kombu transport options, with socket timeouts where it sets none."""
    options = dict(app.conf.broker_transport_options or {})
    options.setdefault("socket_timeout", timeout)
    options.setdefault("socket_connect_timeout", timeout)
    return options


def publisher_for(app: Any, **kwargs: Any) -> Publisher:
    """The fastest publisher that writes exactly what kombu would for ``app``'s broker."""
    url = app.conf.broker_write_url or app.conf.broker_url
    if is_fast_broker(url):
        try:
            return RedisFastPublisher(app, **kwargs)
        except FastPathUnsupported as exc:
            logger.info("Redis fast path off, publishing through kombu: %s", exc)
    return CeleryPublisher(app, timeout=kwargs.get("timeout"))
