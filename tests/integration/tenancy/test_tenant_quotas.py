"""Per-tenant trigger rate (relay) and running concurrency (worker claim)."""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import timedelta
from functools import partial
from typing import Any

import pytest

from celery_scheduler import metrics
from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.core.enums import OccurrenceState
from celery_scheduler.publishers import RecordingPublisher
from django_app.models import Attempt, Occurrence, OutboxEntry, Tenant
from django_app.relay.batch import relay_due
from django_app.worker import claim
from django_app.worker.claim import ClaimOutcome
from tests.integration.tenancy.test_tenant_fairness import NOW, seed
from tests.integration.worker_support import make_occurrence, make_schedule


@pytest.fixture(autouse=True)
def fresh_state() -> None:
    metrics.reset()  # (the trigger-rate buckets are database rows: each test starts empty)


def throttled(slug: str) -> float:
    return metrics.get_metrics().value("celery_scheduler_tenant_throttled_total", tenant=slug) or 0


def sent_by_tenant(publisher: RecordingPublisher) -> Counter[str]:
    return Counter(m.tenant for m in publisher.sent)


@pytest.mark.django_db
def test_trigger_rate_caps_a_tenant_and_leaves_the_rest_for_later(settings: Any) -> None:
    settings.CELERY_SCHEDULER = {"batch_size": 500}
    a = Tenant.objects.create(slug="limited", max_trigger_rate=100)
    b = Tenant.objects.create(slug="free")
    a_ids = seed(a, [NOW - timedelta(minutes=5) + timedelta(milliseconds=i) for i in range(1000)])
    seed(b, [NOW] * 200)
    clock = FrozenClock(NOW)
    publisher = RecordingPublisher()

    first = relay_due(clock=clock, publisher=publisher)

    # One second of burst for A; B is not held back by A's backlog or A's limit.
    assert sent_by_tenant(publisher) == {"limited": 100, "free": 200}
    assert first.throttled == throttled("limited") == 200  # A's fair share of batch 1 - 100
    assert first.published == 300
    waiting = OutboxEntry.objects.filter(tenant=a, sent_at__isnull=True)
    assert waiting.count() == 900
    assert not waiting.exclude(claimed_by="").exists()  # claims given back
    assert set(waiting.values_list("available_at", flat=True)) <= {
        NOW - timedelta(minutes=5) + timedelta(milliseconds=i) for i in range(1000)
    }  # unchanged

    clock.advance(0.5)
    relay_due(clock=clock, publisher=publisher)
    assert sent_by_tenant(publisher)["limited"] == 150
    clock.advance(60)
    relay_due(clock=clock, publisher=publisher)
    assert sent_by_tenant(publisher)["limited"] == 250  # the bucket holds one second at most

    # A's own order held across the throttled passes.
    by_occurrence = dict(OutboxEntry.objects.values_list("occurrence_id", "id"))
    order = [by_occurrence[uuid.UUID(m.task_id)] for m in publisher.sent if m.tenant == "limited"]
    assert order == a_ids[:250]


@pytest.mark.django_db
def test_a_tenant_without_a_rate_is_never_throttled(settings: Any) -> None:
    settings.CELERY_SCHEDULER = {"batch_size": 100}
    t = Tenant.objects.create(slug="zero", max_trigger_rate=0)
    seed(t, [NOW] * 250)
    publisher = RecordingPublisher()
    report = relay_due(clock=FrozenClock(NOW), publisher=publisher)
    assert (report.published, report.throttled, throttled("zero")) == (250, 0, 0)


def _claim(occ: Occurrence, clock: FrozenClock, who: str) -> claim.ClaimResult:
    return claim.claim(occ.id, worker=who, clock=clock, lease=timedelta(seconds=30))


@pytest.mark.django_db
def test_max_running_defers_without_burning_an_attempt(frozen_clock: FrozenClock) -> None:
    t = Tenant.objects.create(slug="capped", max_running=1)
    first = make_occurrence(make_schedule(t), frozen_clock.now())
    second = make_occurrence(make_schedule(t), frozen_clock.now())

    assert _claim(first, frozen_clock, "w1").outcome is ClaimOutcome.CLAIMED
    held = _claim(second, frozen_clock, "w2")

    assert held.outcome is ClaimOutcome.DEFERRED
    assert held.retry_at == frozen_clock.now() + claim.DEFER
    assert "max_running 1" in held.reason
    second.refresh_from_db()
    assert (second.state, second.attempt_count) == (OccurrenceState.ENQUEUED, 0)
    assert not Attempt.objects.filter(occurrence=second).exists()
    outbox = OutboxEntry.objects.get(occurrence=second)
    assert (outbox.sent_at, outbox.available_at) == (None, held.retry_at)
    assert throttled("capped") == 1

    # A RUNNING occurrence whose lease expired holds no place.
    frozen_clock.advance(31)
    assert _claim(second, frozen_clock, "w2").outcome is ClaimOutcome.CLAIMED


@pytest.mark.django_db
def test_other_tenants_and_unlimited_tenants_are_not_counted(frozen_clock: FrozenClock) -> None:
    capped = Tenant.objects.create(slug="capped", max_running=1)
    free = Tenant.objects.create(slug="free")
    for _ in range(3):
        occ = make_occurrence(make_schedule(free), frozen_clock.now())
        assert _claim(occ, frozen_clock, "w").outcome is ClaimOutcome.CLAIMED
    occ = make_occurrence(make_schedule(capped), frozen_clock.now())
    assert _claim(occ, frozen_clock, "w").outcome is ClaimOutcome.CLAIMED


@pytest.mark.concurrent_db
@pytest.mark.django_db(transaction=True)
def test_racing_claims_start_exactly_max_running(frozen_clock: FrozenClock) -> None:
    from tests.integration.worker.test_worker_races import race

    t = Tenant.objects.create(slug="raced", max_running=2)
    # One schedule each: only the tenant row serialises these claims.
    occs = [make_occurrence(make_schedule(t), frozen_clock.now()) for _ in range(12)]
    results = race([partial(_claim, o, frozen_clock, "w") for o in occs])
    assert Counter(getattr(r, "outcome", repr(r)) for r in results) == {
        ClaimOutcome.CLAIMED: 2,
        ClaimOutcome.DEFERRED: 10,
    }
    assert Occurrence.objects.filter(tenant=t, state=OccurrenceState.RUNNING).count() == 2
