"""Tenant-fair relay batches on SQLite and PostgreSQL, against the pure reference.

The SQL (window function) must give the order of ``core.fairness.fair_order``, and the
relay must publish batch after batch as ``core.fairness.next_batch`` says. The storm test is
the acceptance scenario "one tenant's catch-up storm while others keep their SLO", in
relay batches instead of seconds (the clock is frozen).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection, transaction

from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.core.enums import OccurrenceState
from celery_scheduler.core.fairness import DueRow, fair_order, next_batch
from celery_scheduler.publishers import RecordingPublisher
from django_app.models import Occurrence, OutboxEntry, Schedule, Tenant
from django_app.relay.batch import LookaheadRelay, _due_rows, relay_due
from django_app.tenancy import quotas

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
pytestmark = pytest.mark.django_db


def seed(tenant: Tenant, times: Sequence[datetime], priorities: Sequence[int] = ()) -> list[int]:
    """Due outbox rows of ``tenant`` at ``times`` (bulk: a storm is thousands of rows)."""
    schedule = Schedule.objects.create(
        tenant=tenant, name=f"s-{uuid.uuid4().hex[:6]}", task="billing.ping", kind="CRON",
        cron="* * * * *",
    )  # fmt: skip
    occs = Occurrence.objects.bulk_create(
        Occurrence(
            id=uuid.uuid4(),
            schedule=schedule,
            schedule_version=1,
            tenant=tenant,
            scheduled_for=NOW - timedelta(days=1, microseconds=i),
            available_at=at,
            state=OccurrenceState.SCHEDULED.value,
        )
        for i, at in enumerate(times)
    )
    rows = OutboxEntry.objects.bulk_create(
        OutboxEntry(
            occurrence=o,
            tenant=tenant,
            available_at=o.available_at,
            priority=priorities[i] if priorities else 0,
        )
        for i, o in enumerate(occs)
    )
    return [row.id for row in rows]


def reference_rows() -> list[DueRow[int]]:
    return [
        DueRow(id=i, tenant=t, available_at=at, priority=p)
        for i, t, at, p in OutboxEntry.objects.filter(sent_at__isnull=True).values_list(
            "id", "tenant_id", "available_at", "priority"
        )
    ]


def weights() -> dict[int, int]:
    return dict(Tenant.objects.values_list("id", "relay_weight"))


def random_workload(seed_value: int) -> None:
    rng = random.Random(seed_value)
    for n in range(rng.randint(1, 5)):
        tenant = Tenant.objects.create(slug=f"t{n}", relay_weight=rng.randint(0, 5))
        count = rng.choice([0, 1, 7, 40, 150])
        # Few distinct instants and priorities: plenty of ties for the id tie-break.
        times = [NOW - timedelta(seconds=rng.choice([0, 1, 60, 600])) for _ in range(count)]
        seed(tenant, times, [rng.randint(0, 2) for _ in range(count)])


def published_outbox_ids(publisher: RecordingPublisher) -> list[int]:
    by_occurrence = dict(OutboxEntry.objects.values_list("occurrence_id", "id"))
    return [by_occurrence[uuid.UUID(task_id)] for task_id in publisher.task_ids]


@pytest.mark.parametrize("seed_value", range(8))
def test_sql_order_is_the_reference_fair_order(seed_value: int) -> None:
    random_workload(seed_value)
    expected = [row.id for row in fair_order(reference_rows(), weights())]
    candidates = _due_rows(NOW, "me", None)
    total = len(expected) + 1
    with transaction.atomic():
        plain = quotas.take_fair_batch(
            candidates, total, lock=False, now=NOW, until=NOW, token="me"
        )
        assert plain == expected
        if connection.vendor == "postgresql":
            locked = quotas.take_fair_batch(
                candidates, total, lock=True, now=NOW, until=NOW, token="me"
            )
            assert locked == expected


@pytest.mark.parametrize("seed_value", range(8))
def test_relay_publishes_batch_after_batch_as_the_heap_reference(
    seed_value: int, settings: Any
) -> None:
    random_workload(seed_value)
    settings.CELERY_SCHEDULER = {"batch_size": 13}
    rows = reference_rows()
    queues: dict[int, list[DueRow[int]]] = {}
    for row in sorted(rows, key=DueRow.own_key):
        queues.setdefault(row.tenant, []).append(row)
    expected: list[int] = []
    while any(queues.values()):
        batch = next_batch(queues, weights(), 13)
        expected += [row.id for row in batch]
        taken = {row.id for row in batch}
        queues = {t: [r for r in q if r.id not in taken] for t, q in queues.items()}

    publisher = RecordingPublisher()
    report = relay_due(clock=FrozenClock(NOW), publisher=publisher)

    assert report.published == len(rows)
    assert published_outbox_ids(publisher) == expected


def test_catch_up_storm_does_not_delay_a_strict_tenant(settings: Any) -> None:
    """5,000 catch-up rows of A, 50 strict rows of B, 1,000 of C (weight 2), batches of 500."""
    settings.CELERY_SCHEDULER = {"batch_size": 500}
    a = Tenant.objects.create(slug="storm", relay_weight=1)
    b = Tenant.objects.create(slug="strict", relay_weight=1)
    c = Tenant.objects.create(slug="heavy", relay_weight=2)
    # A's backlog is older than everything else: plain time order serves it first.
    a_ids = seed(
        a, [NOW - timedelta(minutes=10) + timedelta(milliseconds=100 * i) for i in range(5000)]
    )
    c_ids = seed(c, [NOW - timedelta(seconds=1)] * 1000)
    b_ids = seed(b, [NOW] * 50)

    publisher = RecordingPublisher()
    report = relay_due(clock=FrozenClock(NOW), publisher=publisher)

    order = published_outbox_ids(publisher)
    assert report.published == len(order) == 6050
    batch_of = {outbox_id: i // 500 for i, outbox_id in enumerate(order)}
    first = order[:500]
    # Every strict row goes out in the first batch; the rest of it is split 1:2 (A:C).
    assert max(batch_of[i] for i in b_ids) == 0
    assert (sum(i in set(a_ids) for i in first), sum(i in set(c_ids) for i in first)) == (150, 300)
    # Each tenant's own order is kept.
    assert [i for i in order if i in set(a_ids)] == a_ids
    assert [i for i in order if i in set(c_ids)] == c_ids
    # The contrast: plain (available_at, -priority, id) order would publish B in batch 12,
    # after the whole storm and C.
    plain = sorted(reference_rows_all(), key=DueRow.own_key)
    plain_batch = {row.id: i // 500 for i, row in enumerate(plain)}
    assert min(plain_batch[i] for i in b_ids) == 12 == max(plain_batch[i] for i in b_ids)


def reference_rows_all() -> list[DueRow[int]]:
    return [
        DueRow(id=i, tenant=t, available_at=at, priority=p)
        for i, t, at, p in OutboxEntry.objects.values_list(
            "id", "tenant_id", "available_at", "priority"
        )
    ]


def test_claim_ahead_takes_a_fair_batch_of_the_coming_window(settings: Any) -> None:
    settings.CELERY_SCHEDULER = {"batch_size": 20}
    a = Tenant.objects.create(slug="storm")
    b = Tenant.objects.create(slug="strict")
    seed(a, [NOW + timedelta(milliseconds=100 + i) for i in range(100)])
    b_ids = seed(b, [NOW + timedelta(seconds=2)] * 5)
    relay = LookaheadRelay(
        clock=FrozenClock(NOW), publisher=RecordingPublisher(), lookahead=timedelta(seconds=3)
    )

    assert relay.poll().held == 20

    held = set(OutboxEntry.objects.filter(claimed_by=relay.token).values_list("id", flat=True))
    assert set(b_ids) <= held  # in time order B would wait behind all 100 of A's rows
    relay.close()
