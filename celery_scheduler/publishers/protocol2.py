"""Celery task protocol 2, rebuilt for the fast publishers (Redis and AMQP).

``app.send_task`` costs about a millisecond per message (routing, retry wrapper, one broker
round trip each). The fast publishers build the *same* message ahead of time and send
batches pipelined; this module is the broker-independent part they share: the protocol-2
headers and body of ``celery.app.amqp.AMQP.as_task_v2`` for the wrapper task
``celery_scheduler.run_occurrence``, the route Celery picks for it, and which routes and
wrapper-task options the fast paths reproduce exactly (the rest goes through kombu).

It imports neither redis-py nor py-amqp: each transport module wraps this in its own
envelope (kombu's virtual-transport JSON for Redis, AMQP frames for RabbitMQ).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

from celery.app.routes import MapRoute
from celery.utils.nodenames import anon_nodename
from celery.utils.saferepr import saferepr
from kombu import serialization
from kombu.entity import maybe_delivery_mode
from kombu.utils.json import JSONEncoder

from celery_scheduler import errors
from celery_scheduler.publishers import RUN_OCCURRENCE_TASK, OccurrenceMessage
from celery_scheduler.publishers.celery import CeleryPublisher

#: Seconds any broker socket wait may last when neither the caller nor the app sets one.
DEFAULT_PUBLISH_TIMEOUT = 5.0

#: Exec options of the wrapper task that change the wire format in ways we do not rebuild.
_UNSUPPORTED_TASK_OPTIONS = ("expires", "compression", "exchange", "routing_key")

_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


class FastPathUnsupported(errors.SchedulerError):
    """The broker or app configuration needs kombu's general publish path."""


@dataclass(frozen=True, slots=True)
class Route:
    """Where Celery sends a message: ``key`` is the queue name when the fast path
    reproduces the route (a direct exchange, published via the anonymous exchange with
    the queue name as routing key), ``None`` when only kombu does."""

    queue: str
    key: str | None  # None: not reproducible here, use the fallback
    delivery_mode: int | None
    #: The priority ``task_routes`` gives the task (below the schedule's and the task's).
    priority: int | None = None


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

    saferepr streams token by token, which is most of a message's preparation cost
    (bench/README.md, "Publish rate"). For JSON-like values whose text fits in ``maxsize``
    nothing is truncated and the text has a simple closed form; anything else goes through
    saferepr itself.
    """
    try:
        text = _plain_repr(value, 0, maxlevels)
    except _NotPlain:
        return str(saferepr(value, maxsize, maxlevels=maxlevels))
    if len(text) < maxsize:
        return text
    return str(saferepr(value, maxsize, maxlevels=maxlevels))


def kombu_json(value: Any) -> str:
    """kombu.utils.json.dumps; its encoder class only matters for non-JSON types, and
    passing it turns off the C encoder, so it is the fallback here."""
    try:
        return json.dumps(value)
    except TypeError:
        return json.dumps(value, cls=JSONEncoder)


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


class TaskMessages:
    """Builds the protocol-2 parts of ``send_task(run_occurrence, ...)`` for one app.

    ``path`` names the fast path in errors ("Redis", "AMQP"). Raises
    :class:`FastPathUnsupported` when the wrapper task sets options the fast paths do not
    rebuild. ``headers`` and ``body`` are pure CPU and may run in any thread.
    """

    def __init__(self, app: Any, *, timeout: float, path: str) -> None:
        self.app = app
        self.path = path
        self.serializer = app.conf.task_serializer
        self._default_delivery_mode = app.conf.task_default_delivery_mode
        self._forced_delivery_mode: Any = None  # set by _wrapper_exec_options
        self.wrapper_options = self._wrapper_exec_options()
        self._router = CeleryPublisher(app, timeout=timeout)
        self._routes: dict[tuple[str, str], Route] = {}
        self._local = threading.local()
        self.origin = anon_nodename()
        # Celery settings are slow attribute look-ups: read them once.
        maxlevels = app.conf.task_repr_maxlevels
        self._argsrepr = saferepr((), app.amqp.argsrepr_maxsize, maxlevels=maxlevels)
        self._repr_limits = (app.amqp.kwargsrepr_maxsize, maxlevels)
        self._timelimit = (
            self.wrapper_options.get("time_limit"),
            self.wrapper_options.get("soft_time_limit"),
        )

    # -- message parts --------------------------------------------------------------------

    def priority(self, message: OccurrenceMessage) -> int:
        """The schedule's priority, else the user task's own (as its apply_async would use),
        else its route's (``task_routes``), else the wrapper's: as ``CeleryPublisher``."""
        return int(
            message.priority
            or getattr(self.app.tasks.get(message.task), "priority", None)
            or self.route(message).priority
            or self.wrapper_options.get("priority")
            or 0
        )

    def headers(self, message: OccurrenceMessage, kwargs: dict[str, Any]) -> dict[str, Any]:
        """``as_task_v2``'s headers, updated with the scheduler's (``send_task(headers=)``)."""
        task_id = message.task_id
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
            "retries": message.retries,
            "timelimit": list(self._timelimit),
            "root_id": task_id,
            "parent_id": None,
            "argsrepr": self._argsrepr,
            "kwargsrepr": celery_saferepr(kwargs, *self._repr_limits),
            "origin": self.origin,
            "ignore_result": None,
            "replaced_task_nesting": 0,
            "stamped_headers": None,
            "stamps": {},
        }
        headers.update(message.headers())
        return headers

    def body(self, kwargs: dict[str, Any]) -> tuple[str, str, bytes]:
        """``(content_type, content_encoding, body bytes)`` as kombu serialises them."""
        if self.serializer == "json":
            return "application/json", "utf-8", kombu_json(((), kwargs, _EMBED)).encode()
        content_type, content_encoding, data = serialization.dumps(
            ((), kwargs, _EMBED), serializer=self.serializer
        )
        if isinstance(data, bytes):
            return content_type, content_encoding, data
        return content_type, content_encoding, data.encode(content_encoding or "utf-8")

    def thread_oid(self) -> str:
        # app.thread_oid is a per-thread uuid behind a slow property: keep it per thread.
        oid: str | None = getattr(self._local, "oid", None)
        if oid is None:
            oid = self._local.oid = self.app.thread_oid
        return oid

    # -- routing --------------------------------------------------------------------------

    def route(self, message: OccurrenceMessage) -> Route:
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

        return all(isinstance(r, MapRoute) for r in self.app.amqp.routes)

    def _resolve_route(self, message: OccurrenceMessage) -> Route:
        options = self._router.route_for(message)
        queue = options.get("queue")
        if isinstance(queue, str):
            # A schedule's explicit queue comes as a name; send_task_message looks it up
            # the same way (``amqp.queues[name]``, created if missing when Celery may).
            try:
                queue = self.app.amqp.queues[queue]
            except KeyError:  # task_create_missing_queues off: kombu raises its own error
                return Route(
                    queue=queue, key=None, delivery_mode=None, priority=options.get("priority")
                )
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
        return Route(
            queue=name or "", key=name if reproducible else None, delivery_mode=mode,
            priority=options.get("priority"),
        )  # fmt: skip

    def _wrapper_exec_options(self) -> dict[str, Any]:
        task = self.app.tasks.get(RUN_OCCURRENCE_TASK) if self.app.finalized else None
        if task is None:
            task = self.app._tasks.get(RUN_OCCURRENCE_TASK)
        if task is None:
            return {}
        found = {k: v for k, v in task._get_exec_options().items() if v is not None}
        bad = [k for k in _UNSUPPORTED_TASK_OPTIONS if found.get(k)]
        if found.get("serializer") and found["serializer"] != self.serializer:
            bad.append("serializer")
        if found.get("delivery_mode"):
            self._forced_delivery_mode = found["delivery_mode"]
        if bad:
            raise FastPathUnsupported(
                f"{RUN_OCCURRENCE_TASK} sets {bad}: the {self.path} fast path does not rebuild them"
            )
        return found
