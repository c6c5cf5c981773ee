"""The beat loop and its shard leases: what an outage is called, and renewal during waves."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from celery import Celery
from django.db import OperationalError

from celery_scheduler.beat import DatabaseScheduler
from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.publishers import RecordingPublisher
from django_app.cluster.shards import ShardLeaser

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("beat-leases-test", set_as_current=False)
    yield app
    app.close()


@pytest.mark.django_db
def test_a_database_outage_in_the_shard_leaser_is_logged_as_a_database_outage(
    app: Celery, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def down(self: ShardLeaser) -> Any:
        raise OperationalError("connection refused")

    monkeypatch.setattr(ShardLeaser, "_refresh", down)
    s = DatabaseScheduler(app=app, clock=FrozenClock(NOW), publisher=RecordingPublisher())
    with caplog.at_level(logging.ERROR, logger="celery_scheduler.beat"):
        assert s.tick() == 0.5
    messages = [r.getMessage() for r in caplog.records if r.name == "celery_scheduler.beat"]
    assert any("database unavailable" in m for m in messages), messages
    assert not any("broker" in m for m in messages), messages
    s.close()
