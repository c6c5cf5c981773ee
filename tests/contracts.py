"""One parametrized fixture per port: every implementation runs each contract test.

A new relay, publisher or materializer is one more ``pytest.param`` here; the contract
suites (``tests/integration/relay/test_relay_contract.py``,
``tests/integration/publishers/test_publisher_contract.py``,
``tests/integration/materialize/test_materializer.py``) pick it up with no other change.
A skip an implementation needs (the set-based statements need PostgreSQL, a broker that
does not answer) is made here, with its reason, so the suites stay free of per-kind branches.

- ``relay``: a factory ``(clock, publisher, node) -> relay`` for each relay the beat runs.
- ``publisher``: a :class:`PublisherCase` for each publisher, on a real broker, with the
  queues of its own (a fresh name per test) and a reader of what the broker holds.
- ``materializer``: the ``materialize_due`` function of each materializer.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import pytest

#: Each relay the beat can run (``django_app.wiring`` picks one per database and broker).
#: The ``postgres`` mark skips the set-based implementations elsewhere at collection (with the
#: suite's usual reason) and lets ``-m postgres`` select them; the fixture says which statements.
RELAYS = ["lookahead", pytest.param("burst", marks=pytest.mark.postgres)]
#: Each publisher the relays can be given, with the broker it is checked on.
PUBLISHERS = ["celery-kombu", "redis-fast", "amqp-fast"]
#: Each materializer ``django_app.wiring.materialize_due`` can choose.
MATERIALIZERS = ["per-schedule", pytest.param("set-based", marks=pytest.mark.postgres)]

RABBITMQ_URL = os.environ.get("TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//")


def _postgres_only(kind: str) -> None:
    from django.db import connection  # deferred (Django is set up by pytest-django first)

    if connection.vendor != "postgresql":
        pytest.skip(f"{kind}: its set-based statements are PostgreSQL only")


class RelayFactory(Protocol):
    @property
    def kind(self) -> str: ...

    def __call__(self, clock: Any, publisher: Any, node: str) -> Any: ...


@dataclass(frozen=True)
class _Relays:
    kind: str

    def __call__(self, clock: Any, publisher: Any, node: str) -> Any:
        # deferred (Django is set up by pytest-django before a fixture runs)
        from django_app.relay.batch import LookaheadRelay
        from django_app.relay.burst import BurstRelay  # deferred (as above)

        cls = BurstRelay if self.kind == "burst" else LookaheadRelay
        return cls(clock=clock, publisher=publisher, node=node)


@pytest.fixture(params=RELAYS)
def relay(request: pytest.FixtureRequest) -> RelayFactory:
    """Makes a relay of each kind: ``relay(clock, publisher, node)``."""
    if request.param == "burst":
        _postgres_only("burst relay")
    return _Relays(request.param)


@dataclass
class PublisherCase:
    """A publisher on a real broker and what that broker holds, read back oldest first.

    ``queue(name)`` is the broker's name of a logical queue (``celery``, ``reports``,
    ``special``); ``ids(name)`` pops that queue's task ids in delivery order.
    """

    kind: str
    app: Any
    publisher: Any
    queue: Callable[[str], str]
    ids: Callable[[str], list[str]]
    headers: Callable[[str], list[dict[str, Any]]]


def _celery_app(url: str, tag: str) -> Any:
    from celery import Celery  # deferred (optional broker clients, only for these fixtures)
    from kombu import Queue  # deferred (as above)

    app = Celery(f"contract-{tag}", broker=url, set_as_current=False)
    app.conf.task_default_queue = f"{tag}-celery"
    app.conf.task_routes = {"reports.*": {"queue": f"{tag}-reports"}}
    app.conf.task_queues = [
        Queue(f"{tag}-celery"),
        Queue(f"{tag}-reports"),
        Queue(f"{tag}-special", queue_arguments={"x-max-priority": 9}),
    ]
    return app


def _redis_case(kind: str, tag: str, url: str) -> Iterator[PublisherCase]:
    import redis  # deferred (optional broker client)

    from celery_scheduler.publishers.celery import CeleryPublisher  # deferred (as above)
    from celery_scheduler.publishers.redis_fast import RedisFastPublisher  # deferred (as above)

    app = _celery_app(url, tag)
    client = redis.Redis.from_url(url)

    def headers(name: str) -> list[dict[str, Any]]:
        key = f"{tag}-{name}"
        raw = client.lrange(key, 0, -1)
        client.delete(key)
        return [json.loads(item)["headers"] for item in reversed(raw)]  # as BRPOP reads

    # A small chunk, so a test batch spans several round trips.
    publisher = (
        RedisFastPublisher(app, chunk_size=7) if kind == "redis-fast" else CeleryPublisher(app)
    )
    yield PublisherCase(
        kind,
        app,
        publisher,
        lambda name: f"{tag}-{name}",
        lambda name: [h["id"] for h in headers(name)],
        headers,
    )
    client.delete(*(f"{tag}-{name}" for name in ("celery", "reports", "special")))
    client.close()
    app.close()


def _amqp_case(tag: str) -> Iterator[PublisherCase]:
    import amqp  # deferred (optional broker client)

    from celery_scheduler.publishers.amqp_fast import AmqpFastPublisher  # deferred (as above)
    from tests.conftest import require_service  # deferred (tests.conftest imports this module)

    parts = urlsplit(RABBITMQ_URL)
    require_service("RabbitMQ", parts.hostname or "127.0.0.1", parts.port or 5672)
    app = _celery_app(RABBITMQ_URL, tag)
    # Declared up front, so reading a queue nothing was sent to finds it empty, not missing.
    with app.connection_for_write() as conn:
        for queue in app.amqp.queues.values():
            queue(conn.default_channel).declare()

    def headers(name: str) -> list[dict[str, Any]]:
        got = []
        with app.connection_for_write() as conn:
            channel = conn.default_channel
            assert isinstance(channel, amqp.Channel), channel
            while (msg := channel.basic_get(f"{tag}-{name}", no_ack=True)) is not None:
                got.append(dict(msg.headers or {}))
        return got

    publisher = AmqpFastPublisher(app, chunk_size=7)  # several confirm rounds per batch
    yield PublisherCase(
        "amqp-fast",
        app,
        publisher,
        lambda name: f"{tag}-{name}",
        lambda name: [h["id"] for h in headers(name)],
        headers,
    )
    publisher.close()
    with app.connection_for_write() as conn:
        for queue in app.amqp.queues.values():
            conn.default_channel.queue_delete(queue.name)
    app.close()


@pytest.fixture(params=PUBLISHERS)
def publisher(request: pytest.FixtureRequest) -> Iterator[PublisherCase]:
    """Each publisher on a real broker: kombu (``CeleryPublisher``) and the Redis fast path
    on Redis (``TEST_REDIS_URL``), the AMQP fast path on RabbitMQ (``TEST_RABBITMQ_URL``).
    Queue names carry a fresh tag, so concurrent runs never read each other's messages."""
    tag = f"cs-contract-{uuid.uuid4().hex[:8]}"
    if request.param == "amqp-fast":
        yield from _amqp_case(tag)
    else:
        url = request.getfixturevalue("redis_url")
        yield from _redis_case(request.param, tag, url)


@pytest.fixture(params=MATERIALIZERS)
def materializer(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """Each materializer's ``materialize_due`` (same keywords, same report)."""
    if request.param == "set-based":
        _postgres_only("set-based materializer")
        from django_app.materialize.set_based import materialize_due_bulk  # deferred (Django)

        return materialize_due_bulk
    from django_app.materialize.per_schedule import materialize_due  # deferred (Django)

    return materialize_due
