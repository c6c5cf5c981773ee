"""The relay reports schedule lag and publish counts in the Prometheus metrics."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from celery_scheduler import api, metrics
from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.errors import CoordinationUnavailable
from celery_scheduler.publishers import OccurrenceMessage, RecordingPublisher
from django_app.relay import relay_due

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


class BrokenPublisher(RecordingPublisher):
    def publish(self, messages: list[OccurrenceMessage]) -> None:  # type: ignore[override]
        raise CoordinationUnavailable("broker down")


def _sample(name: str, **labels: str) -> float:
    value = metrics.registry().get_sample_value(f"celery_scheduler_{name}", labels)
    return value or 0.0


def test_relay_observes_lag_per_tenant_and_counts_publishes() -> None:
    metrics.reset()
    clock = FrozenClock(NOW)
    schedule = api.create_schedule(name="n", task="billing.ping", cron="* * * * *", clock=clock)
    api.run_now(schedule.id, clock=clock)
    clock.advance(timedelta(seconds=2))

    report = relay_due(clock=clock, publisher=RecordingPublisher())

    assert report.published == 1
    assert _sample("published_total") == 1
    assert _sample("schedule_lag_seconds_count", tenant="default") == 1
    assert _sample("schedule_lag_seconds_sum", tenant="default") == pytest.approx(2.0)


def test_relay_counts_broker_failures() -> None:
    metrics.reset()
    clock = FrozenClock(NOW)
    schedule = api.create_schedule(name="n", task="billing.ping", cron="* * * * *", clock=clock)
    api.run_now(schedule.id, clock=clock)

    with pytest.raises(CoordinationUnavailable):
        relay_due(clock=clock, publisher=BrokenPublisher())

    assert _sample("publish_failures_total") == 1
    assert _sample("published_total") == 0
