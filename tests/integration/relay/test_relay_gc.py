"""No collector pause inside a relay transaction.

A relay transaction may be silent for only ``claim_grace_seconds`` before the database ends
its session; a full cyclic collection in a beat holding a prepared burst took long enough,
on a loaded machine, that 500,000-row runs lost waves to
``terminating connection due to idle-in-transaction timeout``. Both relays publish with the
collector off, and turn it back on after.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.publishers import OccurrenceMessage, RecordingPublisher
from django_app.models import Tenant
from django_app.relay.batch import relay_due
from tests.integration.tenancy.test_tenant_fairness import seed

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


class GcWatchingPublisher(RecordingPublisher):
    def __init__(self) -> None:
        super().__init__()
        self.collecting: list[bool] = []

    def publish(self, messages: Sequence[OccurrenceMessage]) -> None:
        self.collecting.append(gc.isenabled())
        super().publish(messages)


@pytest.mark.django_db
def test_the_general_relay_publishes_with_the_collector_off() -> None:
    seed(Tenant.objects.create(slug="a"), [NOW] * 5)
    publisher = GcWatchingPublisher()
    assert gc.isenabled()
    assert relay_due(clock=FrozenClock(NOW), publisher=publisher).published == 5
    assert publisher.collecting
    assert not any(publisher.collecting)
    assert gc.isenabled()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_burst_relay_publishes_a_wave_with_the_collector_off() -> None:
    from django_app.relay.burst import BurstRelay

    seed(Tenant.objects.create(slug="a"), [NOW] * 5)
    clock = FrozenClock(NOW - timedelta(seconds=5))
    publisher = GcWatchingPublisher()
    relay = BurstRelay(clock=clock, publisher=publisher, node="n1")
    assert relay.poll().held == 5
    while (at := relay.next_due_at()) is not None:
        clock.set(max(at, clock.now()))
        relay.publish_held()
    assert len(publisher.sent) == 5
    assert publisher.collecting
    assert not any(publisher.collecting)
    assert gc.isenabled()
