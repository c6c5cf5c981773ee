"""Idempotency records are namespaced by tenant and task name (issue 9, hole 2).

Two tenants that both use ``invoice:{customer}:{period}`` with the same numbers must each
get their own invoice and their own stored result; two tasks of one tenant with the same
key both run; only the same tenant + task + key dedupes. Scheduled runs go through the real
worker wrapper (``django_app.tasks.execute``), which takes the tenant from the occurrence.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery

from celery_scheduler import idempotent_task
from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.tasks import current_idempotency_key
from django_app.models import IdempotencyRecord, Occurrence
from django_app.tasks import execute
from example_project.billing.models import Invoice
from tests.integration.threads import run_threads
from tests.integration.worker_support import make_occurrence, make_schedule

app = Celery("idempotency-namespace-tests", set_as_current=False)
app.conf.task_always_eager = True


def _invoice_key(customer: str, period: str) -> str:
    return f"invoice:{customer}:{period}"


@idempotent_task(app=app, name="ns.invoice", key=_invoice_key)
def invoice(customer: str, period: str) -> dict[str, Any]:
    row = Invoice.objects.create(customer=customer, period=period)
    return {"invoice_id": row.pk, "key": current_idempotency_key()}


@idempotent_task(app=app, name="ns.credit_note", key=_invoice_key)
def credit_note(customer: str, period: str) -> dict[str, Any]:
    row = Invoice.objects.create(customer=customer, period=f"credit:{period}")
    return {"invoice_id": row.pk, "key": current_idempotency_key()}


def run(occ: Occurrence, clock: FrozenClock) -> dict[str, Any]:
    schedule = occ.schedule
    return execute(
        app, str(occ.id), schedule.task, schedule.args, schedule.kwargs,
        worker_name="w", clock=clock, lease=timedelta(seconds=30),
    )  # fmt: skip


def scheduled(tenant: Any, task: str, clock: FrozenClock, minutes: int = 0) -> Occurrence:
    schedule = make_schedule(tenant, task=task, args=["42", "2026-03"])
    return make_occurrence(schedule, clock.now() + timedelta(minutes=minutes))


@pytest.mark.django_db
def test_two_tenants_same_key_both_effects_happen_each_gets_its_own_result(
    tenant_factory: Any, frozen_clock: FrozenClock
) -> None:
    acme, globex = tenant_factory("acme"), tenant_factory("globex")
    first = run(scheduled(acme, "ns.invoice", frozen_clock), frozen_clock)
    second = run(scheduled(globex, "ns.invoice", frozen_clock), frozen_clock)
    assert first["outcome"] == second["outcome"] == "SUCCEEDED"
    assert Invoice.objects.filter(customer="42", period="2026-03").count() == 2
    assert first["result"]["invoice_id"] != second["result"]["invoice_id"]
    stored = set()
    for r in IdempotencyRecord.objects.filter(key="invoice:42:2026-03"):
        assert r.result is not None
        stored.add((r.tenant_id, r.result["invoice_id"]))
    assert stored == {
        (acme.pk, first["result"]["invoice_id"]),
        (globex.pk, second["result"]["invoice_id"]),
    }


@pytest.mark.django_db
def test_same_tenant_different_task_names_both_run(tenant: Any, frozen_clock: FrozenClock) -> None:
    a = run(scheduled(tenant, "ns.invoice", frozen_clock), frozen_clock)
    b = run(scheduled(tenant, "ns.credit_note", frozen_clock), frozen_clock)
    assert a["result"]["invoice_id"] != b["result"]["invoice_id"]
    assert Invoice.objects.filter(customer="42").count() == 2
    assert IdempotencyRecord.objects.filter(key="invoice:42:2026-03").count() == 2


@pytest.mark.django_db
def test_same_tenant_task_and_key_dedupes_across_occurrences(
    tenant: Any, frozen_clock: FrozenClock
) -> None:
    first = run(scheduled(tenant, "ns.invoice", frozen_clock), frozen_clock)
    again = run(scheduled(tenant, "ns.invoice", frozen_clock, minutes=1), frozen_clock)
    assert first["outcome"] == again["outcome"] == "SUCCEEDED"
    assert again["result"] == first["result"]
    assert Invoice.objects.filter(customer="42", period="2026-03").count() == 1


@pytest.mark.django_db
def test_a_duplicate_is_logged_with_the_tenant_slug(
    tenant_factory: Any, frozen_clock: FrozenClock, caplog: pytest.LogCaptureFixture
) -> None:
    globex = tenant_factory("globex")
    run(scheduled(globex, "ns.invoice", frozen_clock), frozen_clock)
    with caplog.at_level("INFO", logger="celery_scheduler.idempotency"):
        run(scheduled(globex, "ns.invoice", frozen_clock, minutes=1), frozen_clock)
    [line] = [r.getMessage() for r in caplog.records if "already done" in r.getMessage()]
    assert "(tenant globex)" in line, line  # the slug, not the row id


@pytest.mark.django_db
def test_outside_the_scheduler_the_default_namespace_is_used(
    tenant: Any, frozen_clock: FrozenClock
) -> None:
    # A direct call has no tenant: it uses the default namespace (tenant NULL), which is
    # separate from every tenant's, and dedupes within it.
    direct = invoice("42", "2026-03")
    assert invoice("42", "2026-03") == direct
    scheduled_run = run(scheduled(tenant, "ns.invoice", frozen_clock), frozen_clock)
    assert scheduled_run["result"]["invoice_id"] != direct["invoice_id"]
    assert IdempotencyRecord.objects.get(tenant__isnull=True).result == direct
    assert Invoice.objects.filter(customer="42", period="2026-03").count() == 2


@pytest.mark.concurrent_db
@pytest.mark.django_db(transaction=True)
def test_concurrent_runs_dedupe_per_namespace_on_postgres(
    tenant_factory: Any, frozen_clock: FrozenClock
) -> None:
    # Six occurrences (three per tenant, different schedules and ids), same business key,
    # released together: exactly one invoice per tenant, and every run of a tenant returns
    # that tenant's invoice.
    acme, globex = tenant_factory("acme"), tenant_factory("globex")
    occs = [
        scheduled(t, "ns.invoice", frozen_clock, minutes=i)
        for t in (acme, globex)
        for i in range(3)
    ]
    results: dict[str, Any] = {}

    def deliver(occ: Occurrence) -> Callable[[], None]:
        return lambda: results.__setitem__(str(occ.id), run(occ, frozen_clock))

    assert run_threads(*(deliver(o) for o in occs)) == []
    assert all(isinstance(r, dict) and r["outcome"] == "SUCCEEDED" for r in results.values())
    per_tenant = {
        t.pk: {results[str(o.id)]["result"]["invoice_id"] for o in occs if o.tenant_id == t.pk}
        for t in (acme, globex)
    }
    assert all(len(ids) == 1 for ids in per_tenant.values()), per_tenant
    assert Invoice.objects.filter(customer="42", period="2026-03").count() == 2
    assert per_tenant[acme.pk] != per_tenant[globex.pk]
