"""The PostgreSQL single create: one statement, the same rows as the step-by-step path, and
the same answers under races (real threads, each with its own connection)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection, models
from django.forms.models import model_to_dict
from django.test.utils import CaptureQueriesContext

from celery_scheduler import api, errors
from celery_scheduler.core import ids
from celery_scheduler.core.clock import FrozenClock
from django_app import conf
from django_app.models import AuditEntry, Schedule, ScheduleTag, ScheduleVersion, Tenant
from django_app.schedules import lifecycle
from tests.integration.schedules.test_lifecycle_races import run_threads

pytestmark = pytest.mark.postgres

CLOCK = FrozenClock(datetime(2026, 3, 1, 12, 0, 7, 123456, tzinfo=UTC))

#: Inputs that touch every kind of column: cron in a zone, interval, one-off, JSON payloads
#: with nesting and non-ASCII text, tags, extras, policies, bounds.
INPUTS: list[dict[str, Any]] = [
    {"name": "nightly", "task": "billing.ping", "cron": "30 2 * * 1-5",
     "timezone": "Europe/Berlin", "idempotency_key": "k1", "tags": {"team": "a", "env": "p"},
     "args": [1, "zwei", {"drei": [3.5, None, True]}], "kwargs": {"ünï": "côdé", "n": 2},
     "max_runs": 7, "pause_after_failures": 3, "misfire_policy": "CATCH_UP",
     "catchup_cap": 4, "max_lateness": 120, "overlap_policy": "QUEUE_ONE"},
    {"name": "every 90 s", "task": "billing.ping", "interval": 90, "queue": "q1",
     "priority": 9, "flexible_window": 30, "concurrency_limit": 2,
     "concurrency_group": "g", "max_attempts": 5, "deadline": 600},
    {"name": "once", "task": "billing.ping", "run_at": CLOCK.now() + timedelta(hours=3),
     "idempotency_key": "k3"},
    {"name": "bounded", "task": "billing.ping", "cron": "@hourly", "timezone": "Asia/Tokyo",
     "start_at": CLOCK.now() + timedelta(days=1), "end_at": CLOCK.now() + timedelta(days=9)},
]  # fmt: skip


@pytest.fixture
def step_by_step(monkeypatch: pytest.MonkeyPatch) -> Callable[[bool], None]:
    def use(on: bool) -> None:
        monkeypatch.setattr(lifecycle, "ONE_STATEMENT_CREATE", not on)

    return use


def _row(obj: models.Model, *ignored: str) -> dict[str, Any]:
    fields = [f.name for f in obj._meta.concrete_fields if f.name not in ignored]
    return model_to_dict(obj, fields=fields)


def _written(schedule_id: Any) -> dict[str, Any]:
    """Every row a create wrote for one schedule, without ids and the tenant."""
    schedule = Schedule.objects.get(pk=schedule_id)
    return {
        "schedule": _row(schedule, "id", "tenant", "shard", "created_at", "updated_at"),
        "versions": [
            _row(v, "id", "schedule") for v in ScheduleVersion.objects.filter(schedule=schedule)
        ],
        "tags": [
            _row(t, "id", "schedule", "tenant")
            for t in ScheduleTag.objects.filter(schedule=schedule).order_by("key")
        ],
        "audit": [
            _row(a, "id", "schedule", "tenant")
            for a in AuditEntry.objects.filter(schedule=schedule).order_by("id")
        ],
    }


@pytest.mark.django_db
@pytest.mark.parametrize("values", INPUTS, ids=[i["name"] for i in INPUTS])
def test_both_paths_write_the_same_rows(
    values: dict[str, Any], tenant_factory: Any, step_by_step: Callable[[bool], None]
) -> None:
    fast, slow = tenant_factory("fast"), tenant_factory("slow")
    audit: dict[str, Any] = {"actor": "ops@example.com", "reason": "ticket 42"}
    created = api.create_schedule(**values, **audit, tenant="fast", clock=CLOCK)
    step_by_step(True)
    expected = api.create_schedule(**values, **audit, tenant="slow", clock=CLOCK)
    assert _written(created.id) == _written(expected.id)
    # The returned instance is the row as stored (nothing left for a refresh to change).
    stored = Schedule.objects.get(pk=created.id)
    assert _row(created) == _row(stored)
    assert (created.tenant_id, stored.tenant_id) == (fast.pk, fast.pk)
    assert expected.tenant_id == slow.pk
    assert created.created_at == stored.created_at
    assert stored.shard == ids.shard_for(stored.id, conf.get().shard_count)


@pytest.mark.django_db
def test_a_create_is_one_statement(tenant: Tenant) -> None:
    """The tenant lock, key lookup, quota count and the four inserts are one statement."""
    values = {**INPUTS[0], "actor": "ops", "reason": "r"}
    api.create_schedule(name="warm", task="billing.ping", cron="* * * * *", tenant="acme")
    with CaptureQueriesContext(connection) as captured:
        created = api.create_schedule(**values, tenant="acme", clock=CLOCK)
    assert len(captured.captured_queries) == 1, [q["sql"] for q in captured]
    with CaptureQueriesContext(connection) as replay:
        assert api.create_schedule(**values, tenant="acme", clock=CLOCK).id == created.id
    assert len(replay.captured_queries) == 2  # the call, then the replayed row's read
    assert AuditEntry.objects.filter(schedule=created).count() == 2


@pytest.mark.django_db
def test_refusals_write_nothing(tenant_factory: Any) -> None:
    tenant_factory("full", max_schedules=1)
    api.create_schedule(name="a", task="billing.ping", cron="* * * * *", tenant="full",
                        idempotency_key="a", clock=CLOCK)  # fmt: skip
    before = (Schedule.objects.count(), ScheduleVersion.objects.count(),
              AuditEntry.objects.count())  # fmt: skip
    with pytest.raises(errors.QuotaExceeded, match=r"'full' already has 1 schedules \(max_sche"):
        api.create_schedule(name="b", task="billing.ping", cron="* * * * *", tenant="full")
    with pytest.raises(errors.IdempotencyConflict, match="idempotency key 'a' was already"):
        api.create_schedule(name="other", task="billing.ping", cron="* * * * *",
                            tenant="full", idempotency_key="a", clock=CLOCK)  # fmt: skip
    with pytest.raises(errors.ValidationError, match="Unknown tenant 'nobody'"):
        api.create_schedule(name="c", task="billing.ping", cron="* * * * *", tenant="nobody")
    after = (Schedule.objects.count(), ScheduleVersion.objects.count(),
             AuditEntry.objects.count())  # fmt: skip
    assert after == before
    # A replay is not a new schedule: it is answered over quota, too.
    replayed = api.create_schedule(name="a", task="billing.ping", cron="* * * * *",
                                   tenant="full", idempotency_key="a", clock=CLOCK)  # fmt: skip
    assert Schedule.objects.filter(tenant__slug="full").count() == 1
    assert replayed.idempotency_key == "a"


@pytest.mark.django_db
def test_the_default_tenant_is_created_on_first_use() -> None:
    created = api.create_schedule(name="a", task="billing.ping", cron="* * * * *")
    assert created.tenant.slug == "default"
    assert Tenant.objects.filter(slug="default").count() == 1


@pytest.mark.concurrent_db
@pytest.mark.django_db(transaction=True)
def test_racing_creates_of_one_key_make_one_schedule() -> None:
    Tenant.objects.create(slug="race")
    ids: list[Any] = []

    def create() -> None:
        ids.append(api.create_schedule(name="n", task="billing.ping", cron="* * * * *",
                                       tenant="race", idempotency_key="same").id)  # fmt: skip

    assert run_threads(*[create] * 8) == []
    assert len(ids) == 8
    assert len(set(ids)) == 1
    assert Schedule.objects.filter(tenant__slug="race").count() == 1
    assert AuditEntry.objects.filter(schedule_id=ids[0]).count() == 8


@pytest.mark.concurrent_db
@pytest.mark.django_db(transaction=True)
def test_racing_creates_keep_to_the_quota() -> None:
    """The count and the insert are atomic per tenant: 8 at once into 3 free places."""
    Tenant.objects.create(slug="quota", max_schedules=3)
    refused: list[str] = []

    def create(n: int) -> Callable[[], None]:
        def run() -> None:
            try:
                api.create_schedule(name=f"n{n}", task="billing.ping", cron="* * * * *",
                                    tenant="quota")  # fmt: skip
            except errors.QuotaExceeded:
                refused.append(str(n))

        return run

    assert run_threads(*[create(n) for n in range(8)]) == []
    assert Schedule.objects.filter(tenant__slug="quota").count() == 3
    assert len(refused) == 5
