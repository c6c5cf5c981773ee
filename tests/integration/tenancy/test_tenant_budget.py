"""Tenant rates are the tenant's, across shards, calls and relay processes (issue 9, hole 4).

With an injected clock: the catch-up slots of a tenant continue from one materializer call
(one shard) to the next, on the per-schedule and the set-based path; the trigger-rate
bucket is one for the tenant whatever relay process takes from it, on the polling path and
the burst relay. The same with real beat processes: tests/acceptance/test_tenant_rates.py.
"""

from __future__ import annotations

import importlib
import uuid
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from django.test import override_settings

from celery_scheduler import metrics
from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.core.enums import OccurrenceState
from celery_scheduler.publishers import RecordingPublisher
from django_app.models import Occurrence, OutboxEntry, Schedule, ScheduleCursor, Tenant
from django_app.relay.batch import relay_due
from django_app.tenancy import quotas
from django_app.wiring import materialize_due
from tests.integration.tenancy.test_tenant_fairness import NOW, seed

MINUTE = timedelta(minutes=1)


def fresh_process() -> None:
    """Drop every in-process state of the quota code, as a second relay process has none."""
    importlib.reload(quotas)


def late_schedule(tenant: Tenant, shard: int, *, cap: int = 3) -> Schedule:
    return Schedule.objects.create(  # type: ignore[misc]  # next_run_at: a property
        tenant=tenant, name=f"late-{uuid.uuid4().hex[:6]}", task="billing.ping", kind="CRON",
        cron="* * * * *", shard=shard, next_run_at=NOW - 10 * MINUTE,
        misfire_policy="CATCH_UP", catchup_cap=cap, max_lateness_seconds=60,
    )  # fmt: skip


def releases(tenant: Tenant) -> list[Any]:
    """``available_at`` of the tenant's late firing occurrences, in order."""
    late = Occurrence.objects.filter(
        tenant=tenant, state=OccurrenceState.SCHEDULED.value, scheduled_for__lt=NOW - MINUTE
    )
    return sorted(late.values_list("available_at", flat=True))


@pytest.mark.django_db
@pytest.mark.parametrize("bulk", [0, 1], ids=["per-schedule", "bulk-where-postgres"])
def test_catch_up_slots_continue_across_shard_calls(bulk: int) -> None:
    slow = Tenant.objects.create(slug="slow", catchup_rate=2)  # one release every 30 s
    other = Tenant.objects.create(slug="other", catchup_rate=60)
    for shard in range(3):
        late_schedule(slow, shard)
    late_schedule(other, 0)
    clock = FrozenClock(NOW)
    with override_settings(CELERY_SCHEDULER={"bulk_materialize": bulk}):
        for shard in range(3):  # what beat does: one call per shard
            materialize_due(clock=clock, shards=[shard], horizon=timedelta(0))
        step = timedelta(seconds=30)
        assert releases(slow) == [NOW + i * step for i in range(9)]
        # Another tenant's slots are its own.
        assert releases(other) == [NOW + i * timedelta(seconds=1) for i in range(3)]

        # A later call (another node, the clock moved on) continues after the last slot.
        later = late_schedule(slow, 5, cap=1)
        clock.advance(45)
        materialize_due(clock=clock, shards=[5], horizon=timedelta(0))
        late = Occurrence.objects.get(schedule=later, scheduled_for=NOW - MINUTE)
        assert late.available_at == NOW + 9 * step
    from django_app.models import TenantBudget

    budget = TenantBudget.objects.get(tenant=slow, kind=TenantBudget.CATCHUP)
    assert budget.at == NOW + 10 * step


@pytest.mark.django_db
def test_catch_up_slots_start_now_once_the_reserved_ones_passed() -> None:
    slow = Tenant.objects.create(slug="slow", catchup_rate=6)
    late_schedule(slow, 0, cap=2)
    clock = FrozenClock(NOW)
    materialize_due(clock=clock, shards=[0], horizon=timedelta(0))
    clock.advance(3600)
    s = late_schedule(slow, 1, cap=2)
    ScheduleCursor.objects.filter(pk=s.id).update(next_run_at=clock.now() - 10 * MINUTE)
    materialize_due(clock=clock, shards=[1], horizon=timedelta(0))
    mine = Occurrence.objects.filter(schedule=s, state=OccurrenceState.SCHEDULED.value)
    late = sorted(mine.filter(scheduled_for__lt=clock.now() - MINUTE).values_list(
        "available_at", flat=True
    ))  # fmt: skip
    assert late == [clock.now(), clock.now() + timedelta(seconds=10)]


@pytest.mark.django_db
def test_trigger_rate_is_one_bucket_for_every_relay_process(settings: Any) -> None:
    settings.CELERY_SCHEDULER = {"batch_size": 500}
    metrics.reset()
    rated = Tenant.objects.create(slug="rated", max_trigger_rate=10)
    free = Tenant.objects.create(slug="free")
    rated_ids = seed(rated, [NOW - MINUTE + timedelta(milliseconds=i) for i in range(100)])
    seed(free, [NOW] * 20)
    clock = FrozenClock(NOW)
    publisher = RecordingPublisher()

    def sent() -> Counter[str]:
        return Counter(m.tenant for m in publisher.sent)

    relay_due(clock=clock, publisher=publisher, node="beat-1")
    assert sent() == {"rated": 10, "free": 20}
    fresh_process()
    second = relay_due(clock=clock, publisher=publisher, node="beat-2")
    assert sent()["rated"] == 10  # the other process finds the tenant's bucket empty
    assert second.published == 0
    clock.advance(0.5)
    fresh_process()
    relay_due(clock=clock, publisher=publisher, node="beat-3")
    assert sent()["rated"] == 15
    clock.advance(60)
    relay_due(clock=clock, publisher=publisher, node="beat-1")
    assert sent()["rated"] == 25  # one second of burst, not a minute's worth
    # Never dropped: the rest waits unsent and unclaimed, in the tenant's own order.
    waiting = OutboxEntry.objects.filter(tenant=rated, sent_at__isnull=True)
    assert waiting.count() == 75
    assert not waiting.exclude(claimed_by="").exists()
    by_occurrence = dict(OutboxEntry.objects.values_list("occurrence_id", "id"))
    order = [by_occurrence[uuid.UUID(m.task_id)] for m in publisher.sent if m.tenant == "rated"]
    assert order == rated_ids[:25]
    assert metrics.get_metrics().value(
        "celery_scheduler_tenant_throttled_total", tenant="rated"
    ) == sum([90, 85, 75])  # (beat-2 left the empty tenant out of its selection)


@pytest.mark.django_db
def test_a_rolled_back_batch_takes_no_tokens() -> None:
    from django.db import transaction

    from django_app.tenancy import budget

    rated = Tenant.objects.create(slug="rated", max_trigger_rate=4)

    class Boom(Exception):
        pass

    def take_then_fail() -> None:
        with transaction.atomic():
            assert budget.take_trigger({rated.id: 4}, {rated.id: 4}, NOW) == {rated.id: 4}
            raise Boom

    with pytest.raises(Boom):
        take_then_fail()
    with transaction.atomic():
        assert budget.take_trigger({rated.id: 9}, {rated.id: 4}, NOW) == {rated.id: 4}


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_burst_wave_takes_the_tenants_tokens_and_leaves_the_rest() -> None:
    from django_app.relay.burst import BurstRelay
    from tests.integration.relay.test_burst import drive
    from tests.integration.relay.test_burst import seed as seed_burst
    from tests.integration.relay.test_relay_contract import TimedPublisher

    metrics.reset()
    clock = FrozenClock(NOW - timedelta(seconds=20))
    seed_burst(clock, [(NOW, 20)])
    Tenant.objects.filter(slug="default").update(max_trigger_rate=5)
    free = Tenant.objects.create(slug="free")
    seed(free, [NOW] * 10)
    OutboxEntry.objects.filter(tenant=free).update(shard=0)
    first = TimedPublisher(clock)
    relay = BurstRelay(clock=clock, publisher=first, node="n1", lookahead=timedelta(30))
    assert relay.poll().held == 30
    drive(relay, clock)
    assert Counter(m.tenant for m in first.sent) == {"default": 5, "free": 10}
    assert all(at >= NOW for at, _, _ in first.calls)
    left = OutboxEntry.objects.filter(tenant__slug="default", sent_at__isnull=True)
    assert left.count() == 15
    assert not left.exclude(claimed_by="").exists()  # claims given back for the polling path
    assert (
        metrics.get_metrics().value("celery_scheduler_tenant_throttled_total", tenant="default")
        == 15
    )

    # Another relay process at the same instant finds the bucket empty; a second later, 5.
    second = RecordingPublisher()
    fresh_process()
    other = BurstRelay(clock=clock, publisher=second, node="n2", lookahead=timedelta(30))
    assert other.poll().published == 0
    clock.set(NOW + timedelta(seconds=1))
    assert other.poll().published == 5
    assert Counter(m.tenant for m in second.sent) == {"default": 5}
