"""The AMQP fast path sends exactly what ``app.send_task`` sends, confirmed by RabbitMQ.

Both publishers publish to the same queues of the test's own RabbitMQ vhost; each message
is read back with ``basic_get`` and compared: body, content type and encoding, every header,
every property, exchange and routing key. Then the failure paths: a nack (a queue capped
with ``x-overflow: reject-publish``), a connection the broker closed, a broker that stops
answering (a proxy that black-holes the confirms) all raise CoordinationUnavailable.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import amqp
import pytest
from celery import Celery
from kombu import Connection, Exchange, Queue

from celery_scheduler import errors
from celery_scheduler.publishers import OccurrenceMessage, RecordingPublisher
from celery_scheduler.publishers.amqp_fast import AmqpFastPublisher, publisher_for
from celery_scheduler.publishers.celery import CeleryPublisher
from celery_scheduler.publishers.default import celery_publisher
from tests.conftest import require_service

WHEN = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)
#: Queues of the tests' own names are declared there and deleted afterwards.
RABBITMQ_URL = os.environ.get("TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//")
pytestmark = pytest.mark.rabbitmq


def rabbitmq_url() -> str:
    require_service("RabbitMQ", "127.0.0.1", 5672)
    return RABBITMQ_URL


def make_app(url: str, tag: str) -> Celery:
    """Queues named after the test (``tag``), so runs never read each other's messages."""
    app = Celery("amqp-fast-test", broker=url, set_as_current=False)
    app.conf.task_default_queue = f"{tag}-celery"
    app.conf.task_routes = {"reports.*": {"queue": f"{tag}-reports"}}
    app.conf.task_queues = [
        Queue(f"{tag}-celery"),
        Queue(f"{tag}-reports"),
        Queue(f"{tag}-special", queue_arguments={"x-max-priority": 9}),
        Queue(f"{tag}-fan", Exchange(f"{tag}-fan", type="topic"), routing_key="fan.#"),
        Queue(
            f"{tag}-capped",
            queue_arguments={"x-max-length": 3, "x-overflow": "reject-publish"},
        ),
    ]
    return app


@pytest.fixture
def tag() -> str:
    return f"cs-fast-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def app(tag: str) -> Iterator[Celery]:
    app = make_app(rabbitmq_url(), tag)
    yield app
    delete_queues(app)
    app.close()


def amqp_channel(conn: Connection) -> amqp.Channel:
    """The connection's default channel: kombu's pyamqp transport gives a py-amqp one."""
    channel = conn.default_channel
    assert isinstance(channel, amqp.Channel), channel
    return channel


def headers_of(msg: amqp.Message) -> dict[str, Any]:
    """A message's application headers (Celery's protocol 2 always sends them)."""
    assert msg.headers is not None, msg.properties
    return msg.headers


def delete_queues(app: Celery) -> None:
    with app.connection_for_write() as conn:
        channel = amqp_channel(conn)
        for queue in app.amqp.queues.values():  # with the exchanges Celery gave them
            channel.queue_delete(queue.name)
            if queue.exchange.name:
                channel.exchange_delete(queue.exchange.name)


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


def get_all(app: Celery, queue: str) -> list[amqp.Message]:
    """Every message waiting in ``queue``, read with basic_get (raw py-amqp messages)."""
    got = []
    with app.connection_for_write() as conn:
        channel = amqp_channel(conn)
        while (msg := channel.basic_get(queue, no_ack=True)) is not None:
            got.append(msg)
    return got


@pytest.mark.parametrize(
    ("fields", "queue"),
    [
        ({}, "celery"),
        ({"task": "reports.daily"}, "reports"),
        ({"queue": "{tag}-special"}, "special"),
        ({"priority": 5}, "celery"),
        ({"queue": "{tag}-special", "priority": 9}, "special"),
    ],
    ids=["default-queue", "routed", "custom-queue", "priority-5", "custom-queue-priority-9"],
)
def test_message_equals_send_task_field_by_field(
    app: Celery, tag: str, fields: dict[str, Any], queue: str
) -> None:
    fields = {k: v.format(tag=tag) if isinstance(v, str) else v for k, v in fields.items()}
    sent = message(**fields)
    CeleryPublisher(app).publish([sent])
    (reference,) = get_all(app, f"{tag}-{queue}")
    fallback = RecordingPublisher()
    fast_publisher = AmqpFastPublisher(app, fallback=fallback)
    try:
        fast_publisher.publish([sent])
    finally:
        fast_publisher.close()
    assert fallback.sent == []  # the fast path built it, kombu did not
    (fast,) = get_all(app, f"{tag}-{queue}")

    assert fast.body == reference.body
    assert set(fast.properties) == set(reference.properties)
    for name, value in reference.properties.items():
        if name != "application_headers":
            assert fast.properties[name] == value, f"property {name}"
    headers, expected = headers_of(fast), headers_of(reference)
    assert set(headers) == set(expected)
    for name, value in expected.items():
        assert headers[name] == value, f"header {name}"
    for name in ("exchange", "routing_key", "redelivered"):
        assert fast.delivery_info[name] == reference.delivery_info[name], name
    assert fast.delivery_info["exchange"] == ""
    assert fast.properties["delivery_mode"] == 2  # persistent
    assert fast.properties["priority"] == sent.priority
    assert headers["id"] == fast.properties["correlation_id"] == sent.occurrence_id
    assert headers["shadow"] == sent.task


def test_amqp_only_one_connection_confirms_every_message_across_chunks(
    app: Celery, tag: str
) -> None:
    """The AMQP fast path's own promise: one connection's confirms count each message of
    every batch (order and routing of a batch: ``test_publisher_contract.py``)."""
    publisher = AmqpFastPublisher(app, chunk_size=7)
    try:
        publisher.publish(
            [message(args=(i,)) for i in range(50)] + [message("reports.x") for _ in range(3)]
        )
        publisher.publish([message()])  # the same connection, delivery tags continue
        assert publisher._session is not None
        assert publisher._session.confirms.confirmed == 54
    finally:
        publisher.close()
    assert len(get_all(app, f"{tag}-celery")) == 51
    assert len(get_all(app, f"{tag}-reports")) == 3


def test_large_body_is_split_into_frames(app: Celery, tag: str) -> None:
    big = message(kwargs={"blob": "x" * 300_000})  # > frame_max (131072)
    publisher = AmqpFastPublisher(app)
    try:
        publisher.publish([big])
    finally:
        publisher.close()
    (got,) = get_all(app, f"{tag}-celery")
    assert headers_of(got)["id"] == big.occurrence_id
    body = got.body if isinstance(got.body, bytes) else got.body.encode()
    assert b"x" * 300_000 in body


def test_routes_the_fast_path_cannot_reproduce_go_through_the_fallback(
    app: Celery, tag: str
) -> None:
    fallback = RecordingPublisher()
    publisher = AmqpFastPublisher(app, fallback=fallback)
    topic, plain = message(queue=f"{tag}-fan"), message()
    try:
        publisher.publish([topic, plain])
    finally:
        publisher.close()
    assert fallback.task_ids == [topic.occurrence_id]
    assert [headers_of(m)["id"] for m in get_all(app, f"{tag}-celery")] == [plain.occurrence_id]


def test_publisher_for_picks_the_fast_path_for_amqp_brokers(app: Celery) -> None:
    assert isinstance(publisher_for(app), AmqpFastPublisher)
    assert isinstance(celery_publisher(app), AmqpFastPublisher)
    for url in ("pyamqp://guest@127.0.0.1//", "amqps://guest@127.0.0.1//"):
        other = Celery("amqp", broker=url, set_as_current=False)
        assert isinstance(celery_publisher(other), AmqpFastPublisher), url
        other.close()
    for url in ("amqp://a//;amqp://b//", "memory://"):  # a failover list: kombu picks
        other = Celery("amqp", broker=url, set_as_current=False)
        assert isinstance(celery_publisher(other), CeleryPublisher), url
        other.close()


# -- failures: nothing may count as accepted ----------------------------------------------


def test_a_nack_raises_coordination_unavailable(app: Celery, tag: str) -> None:
    publisher = AmqpFastPublisher(app)
    capped = [message(queue=f"{tag}-capped") for _ in range(5)]
    try:
        with pytest.raises(errors.CoordinationUnavailable, match=r"basic\.nack"):
            publisher.publish(capped)
        assert publisher._session is None  # dropped: the next call starts afresh
        publisher.publish([message()])  # and works
    finally:
        publisher.close()
    assert len(get_all(app, f"{tag}-capped")) == 3
    assert len(get_all(app, f"{tag}-celery")) == 1


def test_a_queue_deleted_behind_its_back_fails_the_chunk(app: Celery, tag: str) -> None:
    publisher = AmqpFastPublisher(app)
    try:
        publisher.publish([message()])
        with app.connection_for_write() as conn:
            amqp_channel(conn).queue_delete(f"{tag}-celery")
        # Declared once per connection: the message is unroutable, returned, not confirmed
        # as if it were stored.
        with pytest.raises(errors.CoordinationUnavailable, match="unroutable"):
            publisher.publish([message()])
        publisher.publish([message()])  # a new connection declares the queue again
    finally:
        publisher.close()
    assert len(get_all(app, f"{tag}-celery")) == 1


def close_broker_connection(port: int) -> None:
    """Have RabbitMQ itself close the client connection from local ``port`` (ours only)."""
    listed = subprocess.run(
        ["rabbitmqctl", "-q", "list_connections", "pid", "peer_port"],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    pids = [
        fields[0]
        for line in listed.stdout.splitlines()
        if len(fields := line.split("\t")) == 2 and fields[1] == str(port)
    ]
    assert len(pids) == 1, listed.stdout
    subprocess.run(
        ["rabbitmqctl", "close_connection", pids[0], "test: the broker went away"],
        capture_output=True, timeout=30, check=True,
    )  # fmt: skip


def test_a_connection_closed_by_the_broker_is_replaced_on_the_next_call(
    app: Celery, tag: str
) -> None:
    if shutil.which("rabbitmqctl") is None:
        pytest.skip("needs rabbitmqctl to have the broker close a connection")
    publisher = AmqpFastPublisher(app)
    try:
        publisher.publish([message()])
        old = publisher._session
        assert old is not None
        sock = old.raw.sock
        assert sock is not None  # connected: it just published
        close_broker_connection(sock.getsockname()[1])
        time.sleep(0.5)  # the close frame reaches the idle socket
        publisher.publish([message()])  # detected before writing: no failure, no loss
        assert publisher._session is not old
    finally:
        publisher.close()
    assert len(get_all(app, f"{tag}-celery")) == 2


class BlackHole:
    """A TCP proxy to RabbitMQ that, once ``swallow`` is set, stops passing the broker's
    frames back: the publish is written, the confirms never arrive."""

    def __init__(self, port: int = 5672) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.upstream = port
        self.swallow = threading.Event()
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            broker = socket.create_connection(("127.0.0.1", self.upstream))
            self.sockets += [client, broker]
            threading.Thread(target=self._pipe, args=(client, broker, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(broker, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, from_broker: bool) -> None:
        try:
            while data := src.recv(65536):
                if not (from_broker and self.swallow.is_set()):
                    dst.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        self.server.close()
        for sock in self.sockets:
            sock.close()


def test_no_confirm_within_the_timeout_raises_coordination_unavailable(tag: str) -> None:
    url = urlsplit(rabbitmq_url())
    proxy = BlackHole(url.port or 5672)
    app = make_app(url._replace(netloc=f"guest:guest@127.0.0.1:{proxy.port}").geturl(), tag)
    publisher = AmqpFastPublisher(app, timeout=1.0)
    try:
        publisher.publish([message()])  # connected and declared through the proxy
        proxy.swallow.set()
        started = time.monotonic()
        with pytest.raises(errors.CoordinationUnavailable, match="within 1s"):
            publisher.publish([message(), message()])
        assert time.monotonic() - started < 3
        assert publisher._session is None
    finally:
        publisher.close()
        proxy.close()
        app.close()
    direct = make_app(rabbitmq_url(), tag)
    get_all(direct, f"{tag}-celery")
    delete_queues(direct)
    direct.close()


def test_an_unreachable_broker_raises_coordination_unavailable(tag: str) -> None:
    app = make_app("amqp://guest:guest@127.0.0.1:1//", tag)
    publisher = AmqpFastPublisher(app, timeout=1.0)
    with pytest.raises(errors.CoordinationUnavailable, match="did not accept a batch of 2"):
        publisher.publish([message(), message()])
    app.close()
