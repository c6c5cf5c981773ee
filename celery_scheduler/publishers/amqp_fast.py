"""AMQP (RabbitMQ) fast path: prepared Celery messages, pipelined publishes with confirms.

``app.send_task`` pays per message on RabbitMQ (routing, retry wrapper, kombu's producer, one
socket write each), far too slow for a burst (bench/README.md, "AMQP fast path"). This
publisher builds, ahead of the due time (:meth:`AmqpFastPublisher.prepare`), the *same*
AMQP message kombu's pyamqp transport sends for ``send_task("celery_scheduler.run_occurrence",
...)``: the protocol-2 headers and body of :mod:`celery_scheduler.publishers.protocol2`
(shared with the Redis fast path), content type and encoding, ``correlation_id``,
``reply_to``, ``delivery_mode``, ``priority``, published to the anonymous exchange with the
queue name as routing key (Celery's route for a direct exchange). The method and content
header frames are serialised at preparation with py-amqp's own encoder, so at the instant
:meth:`AmqpFastPublisher.publish_prepared` only frames the bodies and writes a whole chunk
with one socket write.

**Accepted means durable.** The channel is in publisher-confirm mode (``confirm.select``):
a chunk is written without waiting per message, then the broker's ``basic.ack`` frames
(``multiple`` or not) are read until every delivery tag of the chunk is confirmed. For a
persistent message on a durable queue RabbitMQ confirms only once the message is written to
disk (or, for quorum queues, to a majority). A ``basic.nack``, a ``basic.return`` (the
message is published ``mandatory``: a queue deleted behind our back must not swallow it
while the broker still confirms), a closed channel or connection, or no confirm within the
timeout raise :class:`celery_scheduler.errors.CoordinationUnavailable`: the relay marks
nothing and the rows are published again later (at-least-once, same task ids). After any
failure the connection is dropped; the next call connects afresh.

Why confirms and not AMQP transactions: ``tx.select`` + one ``tx.commit`` per chunk also
gives a durable acknowledgement per chunk, but RabbitMQ's transactions are its slow path
(the commit is synchronous, and a transaction is not atomic across queues anyway); confirms
with the prepared frames written in one write per chunk measured fastest (bench/README.md,
"AMQP fast path"). py-amqp's own confirm mode (``confirm_publish``) waits for each ack in
turn, a round trip per message: it is not used here.

Only what the fast path reproduces exactly goes through it (the same routes as the Redis
fast path: a direct exchange via the anonymous exchange, no queue ``expires``, no
compression); every other message goes through the fallback publisher (kombu), so choosing
this publisher never changes what a worker receives. :func:`publisher_for` picks it for
``amqp://``, ``pyamqp://`` and ``amqps://`` brokers (one URL, kombu's pyamqp transport).
Like the Redis fast path it does not send Celery's ``before/after_task_publish`` signals.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from struct import pack
from typing import Any

import amqp
from amqp import spec
from amqp.exceptions import AMQPError
from amqp.serialization import dumps as amqp_dumps
from kombu.exceptions import KombuError

from celery_scheduler import errors
from celery_scheduler.publishers import (
    AMQP_SCHEMES,
    OccurrenceMessage,
    PreparingPublisher,
    Publisher,
)
from celery_scheduler.publishers.celery import CeleryPublisher
from celery_scheduler.publishers.protocol2 import (
    FastPathUnsupported,
    Route,
    TaskMessages,
    bounded_transport_options,
    broker_timeout,
)

logger = logging.getLogger(__name__)

#: The channel every prepared frame is addressed to: claimed first on each new connection.
CHANNEL_ID = 1
_FRAME_END = b"\xce"
_BASIC_CLASS = spec.Basic.Publish[0]

_ERRORS: tuple[type[BaseException], ...] = (AMQPError, KombuError, OSError)


@dataclass(frozen=True, slots=True)
class PreparedAmqpMessage:
    """One message ready to write: ``head`` is its ``basic.publish`` method frame and
    content header frame (channel :data:`CHANNEL_ID`), ``body`` the body bytes (framed at
    publish time, by the connection's negotiated ``frame_max``), ``queue`` the kombu queue
    (declared before the first publish to it).

    A burst relay holds hundreds of thousands of these until their instant: about the
    message's size each. ``head`` is empty when the route needs kombu; then ``message`` is
    kept for the fallback publisher.
    """

    head: bytes
    body: bytes
    queue: str = ""
    message: OccurrenceMessage | None = None


def is_fast_broker(url: object) -> bool:
    return isinstance(url, str) and url.startswith(AMQP_SCHEMES) and ";" not in url


class _Confirms:
    """Delivery tags the broker confirmed on the channel (``basic.ack``/``basic.nack``)."""

    def __init__(self) -> None:
        self.published = 0  # last delivery tag used: tags count publishes from 1
        self.confirmed = 0  # every tag up to this one is acked
        self.singles: set[int] = set()  # acked one by one above ``confirmed``
        self.nacked: int | None = None
        self.returned: str | None = None

    def ack(self, delivery_tag: int, multiple: bool) -> None:
        if multiple:
            if delivery_tag > self.confirmed:
                self.confirmed = delivery_tag
                self.singles = {t for t in self.singles if t > delivery_tag}
        else:
            self.singles.add(delivery_tag)
        while self.confirmed + 1 in self.singles:
            self.confirmed += 1
            self.singles.discard(self.confirmed)

    def nack(self, delivery_tag: int, multiple: bool) -> None:
        self.nacked = delivery_tag if self.nacked is None else min(self.nacked, delivery_tag)

    def returned_message(self, exc: Any, exchange: str, routing_key: str, message: Any) -> None:
        self.returned = f"{exc} (exchange {exchange!r}, routing key {routing_key!r})"


class _Session:
    """One kombu connection (for the URL, TLS, login and queue declarations as Celery
    does them), its py-amqp connection and our confirm-mode channel."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.raw: amqp.Connection = conn.connection
        if CHANNEL_ID in self.raw.channels:  # pragma: no cover - kombu opens none on connect
            raise FastPathUnsupported(f"channel {CHANNEL_ID} is taken on a fresh connection")
        self.channel = self.raw.channel(CHANNEL_ID)
        self.confirms = _Confirms()
        self.channel.events["basic_ack"].add(self.confirms.ack)
        self.channel.events["basic_nack"].add(self.confirms.nack)
        self.channel.events["basic_return"].add(self.confirms.returned_message)
        self.channel.confirm_select()
        self.declared: set[str] = set()

    def close(self, *, graceful: bool) -> None:
        """``graceful``: the AMQP close handshake; else the socket is just dropped (after a
        failure the broker may not answer, and waiting for it would stretch the bound)."""
        try:
            if graceful:
                self.conn.release()
            else:
                self.conn.collect()
        except Exception:  # a dead connection may fail to close; it is dropped anyway
            logger.debug("closing the AMQP fast-path connection failed", exc_info=True)


class AmqpFastPublisher(PreparingPublisher):
    """Implements :class:`celery_scheduler.publishers.Publisher` for RabbitMQ (pyamqp).

    ``chunk_size`` bounds the messages written before their confirms are awaited (memory
    on both sides). One connection and channel, kept open between calls: ``publish`` calls
    are serialised by a lock; ``prepare`` is pure CPU and may run in any thread.
    ``timeout`` bounds every socket wait and the wait for a chunk's confirms (seconds;
    default: the broker's ``socket_timeout`` option, else 5).
    """

    #: Messages per ``publish_prepared`` call of the burst relay (it reads this attribute):
    #: every call must return within the wave transaction's idle bound
    #: (``claim_grace_seconds``, 2 s by default). RabbitMQ confirms persistent messages far
    #: slower than Redis takes them (bench/README.md, "AMQP fast path"), so the Redis chunk
    #: of 5,000 could take longer; 1,000 costs one confirm round trip and one keepalive
    #: statement more per 1,000.
    publish_chunk = 1_000

    def __init__(
        self,
        app: Any,
        *,
        fallback: Publisher | None = None,
        chunk_size: int = 5_000,
        timeout: float | None = None,
    ) -> None:
        url = app.conf.broker_write_url or app.conf.broker_url
        if not is_fast_broker(url):
            raise FastPathUnsupported(
                f"the AMQP fast path needs a single amqp://, pyamqp:// or amqps:// broker URL, "
                f"got {url!r}"
            )
        # deferred (optional dependency): kombu's pyamqp transport needs the amqp extra
        from kombu.transport.pyamqp import Transport

        probe = app.connection_for_write()
        try:
            transport = probe.transport  # the class only: no network
            if not isinstance(transport, Transport):
                raise FastPathUnsupported(f"{url!r} does not use kombu's pyamqp transport")
        finally:
            probe.release()
        self.app = app
        self.chunk_size = chunk_size
        self.timeout = broker_timeout(app, timeout)
        self.fallback: Publisher = (
            fallback if fallback is not None else CeleryPublisher(app, timeout=self.timeout)
        )
        self.messages = TaskMessages(app, timeout=self.timeout, path="AMQP")
        self._methods: dict[str, bytes] = {}
        self._session: _Session | None = None
        self._lock = threading.Lock()

    # -- preparation (pure CPU, may run ahead of the due time) --------------------------

    def prepare(self, messages: Iterable[OccurrenceMessage]) -> list[PreparedAmqpMessage]:
        """Build the exact AMQP frames; cheap enough to run while claiming ahead."""
        return [self._prepare_one(message) for message in messages]

    def _prepare_one(self, message: OccurrenceMessage) -> PreparedAmqpMessage:
        route = self.messages.route(message)
        if route.key is None:
            return PreparedAmqpMessage(b"", b"", route.queue, message)
        amqp_message = self.amqp_message(message, route=route)
        body: bytes = amqp_message.body
        header = pack(">HHQ", _BASIC_CLASS, 0, len(body)) + amqp_message._serialize_properties()
        head = self._method_frame(route.key) + _frame(2, header)
        return PreparedAmqpMessage(head, body, route.queue)

    def amqp_message(self, message: OccurrenceMessage, *, route: Route | None = None) -> Any:
        """The ``amqp.Message`` kombu's pyamqp channel builds for ``send_task`` (its
        ``prepare_message``: body, priority, content type/encoding, application headers,
        and ``correlation_id``, ``reply_to``, ``delivery_mode`` from Celery)."""
        route = route or self.messages.route(message)
        kwargs = message.task_kwargs()
        content_type, content_encoding, body = self.messages.body(kwargs)
        return amqp.Message(
            body,
            priority=self.messages.priority(message),
            content_type=content_type,
            content_encoding=content_encoding,
            application_headers=self.messages.headers(message, kwargs),
            correlation_id=message.task_id,
            reply_to=self.messages.thread_oid(),
            delivery_mode=route.delivery_mode,
        )

    def _method_frame(self, queue: str) -> bytes:
        # basic.publish(exchange="", routing_key=queue, mandatory, immediate=False), one
        # shared bytes object per queue. ``mandatory`` is the one bit that differs from
        # kombu's publish (the message itself is the same): an unroutable message is
        # returned, and fails the chunk, instead of being confirmed and dropped.
        frame = self._methods.get(queue)
        if frame is None:
            args = amqp_dumps("Bssbb", (0, "", queue, True, False))
            frame = self._methods[queue] = _frame(1, pack(">HH", *spec.Basic.Publish) + args)
        return frame

    # -- publishing ---------------------------------------------------------------------

    def publish(self, messages: Sequence[OccurrenceMessage]) -> None:
        if messages:
            self.publish_prepared(self.prepare(messages))

    def publish_prepared(self, prepared: Sequence[PreparedAmqpMessage]) -> None:
        """Write every prepared message (pipelined, confirmed per chunk); the rest through
        the fallback. Returns once the broker confirmed all of them."""
        fast = [p for p in prepared if p.head]
        slow = [p.message for p in prepared if not p.head and p.message is not None]
        if fast:
            with self._lock:
                try:
                    session = self._declare_locked({p.queue for p in fast})
                    for start in range(0, len(fast), self.chunk_size):
                        self._send(session, fast[start : start + self.chunk_size])
                except errors.CoordinationUnavailable:
                    self._reset()
                    raise
                except _ERRORS as exc:
                    self._reset()
                    raise errors.CoordinationUnavailable(
                        f"RabbitMQ did not accept a batch of {len(fast)} prepared message(s): "
                        f"{type(exc).__name__}: {exc}"
                    ) from exc
        if slow:
            self.fallback.publish(slow)

    def _send(self, session: _Session, chunk: Sequence[PreparedAmqpMessage]) -> None:
        raw, confirms = session.raw, session.confirms
        limit = raw.frame_max - 8  # frame header (7 bytes) and frame end
        parts: list[bytes] = []
        append = parts.append
        for item in chunk:
            append(item.head)
            body = item.body
            if len(body) <= limit:
                append(pack(">BHI", 3, CHANNEL_ID, len(body)))
                append(body)
                append(_FRAME_END)
            else:
                for offset in range(0, len(body), limit):
                    append(_frame(3, body[offset : offset + limit]))
        last = confirms.published + len(chunk)
        confirms.published = last
        with raw.transport.having_timeout(self.timeout):
            raw.transport.write(b"".join(parts))
        deadline = time.monotonic() + self.timeout
        while confirms.confirmed < last:
            if confirms.nacked is not None or confirms.returned is not None:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise errors.CoordinationUnavailable(
                    f"RabbitMQ confirmed {confirms.confirmed - (last - len(chunk))} of "
                    f"{len(chunk)} message(s) within {self.timeout:g}s"
                )
            try:
                raw.drain_events(timeout=remaining)
            except TimeoutError:
                continue  # the deadline check above raises
        if confirms.nacked is not None:
            raise errors.CoordinationUnavailable(
                f"RabbitMQ refused (basic.nack) delivery tag {confirms.nacked} of a chunk of "
                f"{len(chunk)} message(s)"
            )
        if confirms.returned is not None:
            raise errors.CoordinationUnavailable(
                f"RabbitMQ returned an unroutable message: {confirms.returned}"
            )

    # -- connection and queues ------------------------------------------------------------

    def declare(self, prepared: Sequence[PreparedAmqpMessage]) -> None:
        """Connect and declare the queues of ``prepared`` now (a relay holding them calls
        this ahead of their time, so the first publish at the instant pays neither)."""
        queues = {p.queue for p in prepared if p.head}
        if not queues:
            return
        with self._lock:
            try:
                self._declare_locked(queues)
            except errors.CoordinationUnavailable:
                self._reset()
                raise
            except _ERRORS as exc:
                self._reset()
                raise errors.CoordinationUnavailable(
                    f"could not declare queue(s) {sorted(queues)} on the broker: {exc}"
                ) from exc

    def _declare_locked(self, queues: set[str]) -> _Session:
        """The live session with ``queues`` declared on it (each once per connection, with
        kombu's own ``Queue.declare``: exchange, queue arguments, binding, as ``send_task``
        declares them)."""
        session = self._connected()
        needed = queues - session.declared
        if needed:
            channel = session.conn.default_channel
            for name in sorted(needed):
                self.app.amqp.queues[name](channel).declare()
            session.declared |= needed
        return session

    def _connected(self) -> _Session:
        session = self._session
        if session is not None:
            try:
                # Read what arrived while idle (nothing, usually): a connection the broker
                # closed (restart, management close) fails here, before anything is written.
                session.raw.drain_events(timeout=0)
            except TimeoutError:
                return session
            except _ERRORS:
                logger.info("AMQP fast path: the broker closed the idle connection; reconnecting")
                self._reset()
            else:  # pragma: no cover - an unexpected frame while idle: start afresh
                self._reset()
        options = bounded_transport_options(self.app, self.timeout)
        options.setdefault("read_timeout", self.timeout)
        options.setdefault("write_timeout", self.timeout)
        conn = self.app.connection_for_write(
            connect_timeout=self.timeout, transport_options=options, heartbeat=0
        )
        try:
            conn.connect()
            session = _Session(conn)
        except BaseException:
            conn.release()
            raise
        self._session = session
        return session

    def _reset(self, *, graceful: bool = False) -> None:
        session, self._session = self._session, None
        if session is not None:
            session.close(graceful=graceful)

    def close(self) -> None:
        """Close the connection (the next publish opens a new one)."""
        with self._lock:
            self._reset(graceful=True)


def _frame(kind: int, payload: bytes) -> bytes:
    return pack(">BHI", kind, CHANNEL_ID, len(payload)) + payload + _FRAME_END


def publisher_for(app: Any, **kwargs: Any) -> Publisher:
    """The fastest publisher that sends exactly what kombu would for ``app``'s broker."""
    url = app.conf.broker_write_url or app.conf.broker_url
    if is_fast_broker(url):
        try:
            return AmqpFastPublisher(app, **kwargs)
        except FastPathUnsupported as exc:
            logger.info("AMQP fast path off, publishing through kombu: %s", exc)
    return CeleryPublisher(app, timeout=kwargs.get("timeout"))
