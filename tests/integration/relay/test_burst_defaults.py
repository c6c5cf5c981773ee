"""Which paths run by default: set-based materializer and burst relay on PostgreSQL + Redis
or RabbitMQ."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from celery import Celery
from django.test import override_settings

from celery_scheduler.beat import DatabaseScheduler
from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.publishers import RecordingPublisher
from django_app import conf

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
REDIS = "redis://127.0.0.1:6379/9"
AMQP = "amqp://guest:guest@127.0.0.1:5672//"


@pytest.mark.parametrize(
    ("setting", "vendor", "expected"),
    [
        ({}, "postgresql", True),
        ({}, "sqlite", False),
        ({"bulk_materialize": "auto"}, "postgresql", True),
        ({"bulk_materialize": False}, "postgresql", False),
        ({"bulk_materialize": 0}, "postgresql", False),
        ({"bulk_materialize": "0"}, "postgresql", False),
        ({"bulk_materialize": True}, "sqlite", False),  # PostgreSQL SQL: never elsewhere
    ],
)
def test_bulk_materialize_default_is_on_for_postgresql_only(
    setting: dict[str, Any], vendor: str, expected: bool
) -> None:
    with override_settings(CELERY_SCHEDULER=setting):
        assert conf.bulk_materialize_enabled(vendor) is expected


@pytest.mark.parametrize(
    ("setting", "vendor", "broker", "expected"),
    [
        ({}, "postgresql", REDIS, True),
        ({}, "postgresql", "rediss://h:6380/0", True),
        ({}, "postgresql", AMQP, True),
        ({}, "postgresql", "pyamqp://guest@127.0.0.1//", True),
        ({}, "postgresql", "amqps://guest@rabbit:5671//", True),
        ({}, "postgresql", f"{AMQP};amqp://guest@other:5672//", False),  # failover list
        ({}, "postgresql", "sqla+sqlite:///broker.db", False),
        ({}, "sqlite", AMQP, False),
        ({}, "postgresql", f"{REDIS};redis://other:6379/9", False),  # failover list
        ({}, "sqlite", REDIS, False),
        ({"burst_relay": True}, "postgresql", "sqla+sqlite:///broker.db", True),
        ({"burst_relay": False}, "postgresql", AMQP, False),
        ({"burst_relay": 1}, "sqlite", REDIS, False),
        ({"burst_relay": False}, "postgresql", REDIS, False),
    ],
)
def test_burst_relay_default_is_on_for_postgresql_with_redis_or_rabbitmq(
    setting: dict[str, Any], vendor: str, broker: str, expected: bool
) -> None:
    with override_settings(CELERY_SCHEDULER=setting):
        assert conf.burst_relay_enabled(vendor, broker) is expected


def test_a_nonsense_switch_value_is_refused() -> None:
    with override_settings(CELERY_SCHEDULER={"burst_relay": "sometimes"}):
        with pytest.raises(ValueError, match="burst_relay"):
            conf.burst_relay_enabled("postgresql", REDIS)


@pytest.fixture
def redis_app() -> Iterator[Celery]:
    app = Celery("defaults-test", set_as_current=False, broker=REDIS)
    yield app
    app.close()


@pytest.mark.django_db
def test_beat_picks_the_relay_for_its_database_and_broker(redis_app: Celery) -> None:
    from django.db import connection

    beat = DatabaseScheduler(app=redis_app, clock=FrozenClock(NOW), publisher=RecordingPublisher())
    relay = beat._relay_or_create()
    expected = "BurstRelay" if connection.vendor == "postgresql" else "LookaheadRelay"
    assert type(relay).__name__ == expected
    beat._relay = None
    with override_settings(CELERY_SCHEDULER={"burst_relay": False}):
        assert type(beat._relay_or_create()).__name__ == "LookaheadRelay"
    beat.close()
