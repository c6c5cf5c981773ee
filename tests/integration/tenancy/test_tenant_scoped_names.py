"""Every name a tenant chooses is scoped to that tenant (issue 15, item 1).

Concurrency groups: two tenants that both call their group ``reports`` have two groups;
one tenant's running job never takes the other's slot. Schedule idempotency keys: the same
key in two tenants makes two schedules. (Idempotency records of ``@idempotent_task``:
tests/integration/worker/test_idempotency_namespaces.py.)
"""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection

from celery_scheduler import api
from celery_scheduler.core.clock import FrozenClock
from django_app.models import ConcurrencySlot
from django_app.worker import claim
from django_app.worker.claim import ClaimOutcome
from tests.integration.worker_support import make_occurrence, make_schedule

LEASE = timedelta(seconds=30)


def claim_as(occ: Any, clock: FrozenClock, who: str = "w") -> claim.ClaimResult:
    return claim.claim(occ.id, worker=who, clock=clock, lease=LEASE)


@pytest.mark.django_db
def test_same_group_name_in_two_tenants_is_two_groups(
    tenant_factory: Any, frozen_clock: FrozenClock
) -> None:
    acme, globex = tenant_factory("acme"), tenant_factory("globex")
    a = make_occurrence(
        make_schedule(acme, concurrency_limit=1, concurrency_group="reports"), frozen_clock.now()
    )
    b = make_occurrence(
        make_schedule(globex, concurrency_limit=1, concurrency_group="reports"), frozen_clock.now()
    )
    assert claim_as(a, frozen_clock).outcome is ClaimOutcome.CLAIMED
    # Before the fix: DEFERRED, "waiting for a concurrency slot of reports" (acme's slot).
    second = claim_as(b, frozen_clock)
    assert second.outcome is ClaimOutcome.CLAIMED, second.reason
    held = ConcurrencySlot.objects.exclude(owner="").values_list("tenant_id", "key")
    assert sorted(held) == sorted([(acme.pk, "reports"), (globex.pk, "reports")])


@pytest.mark.django_db
def test_a_tenant_group_still_caps_its_own_schedules(
    tenant_factory: Any, frozen_clock: FrozenClock
) -> None:
    acme, globex = tenant_factory("acme"), tenant_factory("globex")
    a1 = make_occurrence(
        make_schedule(acme, concurrency_limit=1, concurrency_group="reports"), frozen_clock.now()
    )
    a2 = make_occurrence(
        make_schedule(acme, concurrency_limit=1, concurrency_group="reports"), frozen_clock.now()
    )
    g = make_occurrence(
        make_schedule(globex, concurrency_limit=1, concurrency_group="reports"), frozen_clock.now()
    )
    assert claim_as(a1, frozen_clock).outcome is ClaimOutcome.CLAIMED
    assert claim_as(a2, frozen_clock).outcome is ClaimOutcome.DEFERRED
    assert claim_as(g, frozen_clock).outcome is ClaimOutcome.CLAIMED


@pytest.mark.django_db
def test_schedule_idempotency_keys_are_per_tenant(
    tenant_factory: Any, frozen_clock: FrozenClock, settings: Any
) -> None:
    settings.CELERY_SCHEDULER = {"validate_task_names": False}
    tenant_factory("acme"), tenant_factory("globex")
    made = [
        api.create_schedule(
            tenant=slug,
            idempotency_key="nightly",
            name=f"{slug} nightly",
            task="billing.ping",
            cron="0 2 * * *",
            clock=frozen_clock,
        )
        for slug in ("acme", "globex")
    ]
    assert made[0].pk != made[1].pk
    assert {s.tenant.slug for s in made} == {"acme", "globex"}


@pytest.mark.concurrent_db
@pytest.mark.django_db(transaction=True)
def test_claim_race_two_tenants_same_group_name_each_gets_its_own_slot(
    tenant_factory: Any, frozen_clock: FrozenClock
) -> None:
    # Eight claimers (four per tenant, each tenant's group "reports" capped at 1) released
    # together: one claim per tenant, the rest wait for their own tenant's slot.
    acme, globex = tenant_factory("acme"), tenant_factory("globex")
    occs = [
        make_occurrence(
            make_schedule(t, concurrency_limit=1, concurrency_group="reports"),
            frozen_clock.now() + timedelta(minutes=i),
        )
        for t in (acme, globex)
        for i in range(4)
    ]
    barrier = threading.Barrier(len(occs))
    results: list[Any] = [None] * len(occs)

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[i] = claim_as(occs[i], frozen_clock, f"w{i}")
        except BaseException as exc:
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(occs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    claimed = Counter(
        occs[i].tenant_id for i, r in enumerate(results) if r.outcome is ClaimOutcome.CLAIMED
    )
    assert all(hasattr(r, "outcome") for r in results), results
    assert claimed == {acme.pk: 1, globex.pk: 1}
    assert Counter(r.outcome for r in results)[ClaimOutcome.DEFERRED] == 6
