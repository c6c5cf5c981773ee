"""The tenant API: create, change quotas (applied at once), list with usage."""

from __future__ import annotations

from datetime import timedelta
from itertools import pairwise
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from celery_scheduler import api, errors
from celery_scheduler.api_types import TenantInfo, as_json
from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.core.enums import OccurrenceState
from celery_scheduler.publishers import RecordingPublisher
from django_app.models import Schedule, Tenant
from django_app.relay.batch import relay_due
from django_app.worker import claim
from django_app.worker.claim import ClaimOutcome
from tests.conftest import is_postgres
from tests.integration.plans import read_by
from tests.integration.tenancy.test_tenant_fairness import NOW, seed
from tests.integration.worker_support import make_occurrence, make_schedule

pytestmark = pytest.mark.django_db


def test_create_get_update_and_list_tenants(frozen_clock: FrozenClock) -> None:
    info = api.create_tenant("acme", name="Acme", max_schedules=10, relay_weight=3)
    assert isinstance(info, TenantInfo)
    assert (info.slug, info.name, info.max_schedules, info.relay_weight) == ("acme", "Acme", 10, 3)
    assert info.max_running is None

    changed = api.update_tenant("acme", max_running=4, max_schedules=None, catchup_rate=30)
    assert (changed.max_running, changed.max_schedules, changed.catchup_rate) == (4, None, 30)
    assert changed.relay_weight == 3  # untouched
    assert api.get_tenant("acme") == changed

    api.create_schedule(name="a", task="billing.ping", cron="* * * * *", tenant="acme",
                        clock=frozen_clock)  # fmt: skip
    s = make_schedule(Tenant.objects.get(slug="acme"))
    make_occurrence(s, frozen_clock.now(), state=OccurrenceState.ENQUEUED)
    assert (
        claim.claim(s.occurrences.get().id, worker="w", clock=frozen_clock).outcome
        is ClaimOutcome.CLAIMED
    )

    usage = {u.tenant.slug: u for u in api.list_tenants(clock=frozen_clock)}
    assert usage["acme"].schedules == 2
    assert usage["acme"].running == 1
    assert usage["acme"].measured_at == frozen_clock.now()
    as_json(usage["acme"])


def test_a_tenant_created_without_a_name_is_named_by_its_slug() -> None:
    """As documented ("default: the slug"). Seen failing: the name was ""."""
    assert api.create_tenant("acme").name == "acme"
    assert Tenant.objects.get(slug="acme").name == "acme"
    assert api.create_tenant("globex", name="Globex Corp").name == "Globex Corp"
    assert api.update_tenant("globex", name="").name == "globex"  # cleared: the default


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"slug": "Not A Slug"}, "slug"),
        ({"slug": ""}, "slug"),
        ({"slug": "acme\n"}, "slug"),  # a $ would match before the final newline
        ({"slug": "ok", "max_schedules": -1}, "max_schedules"),
        ({"slug": "ok", "max_trigger_rate": "10"}, "max_trigger_rate"),
        ({"slug": "ok", "max_running": True}, "max_running"),
        ({"slug": "ok", "catchup_rate": 1.5}, "catchup_rate"),
        ({"slug": "ok", "relay_weight": 0}, "relay_weight"),
        ({"slug": "ok", "relay_weight": 100_000}, "relay_weight"),
        ({"slug": "ok", "name": "x" * 201}, "name"),
    ],
)
def test_bad_tenant_input_names_the_field_and_writes_nothing(kwargs: Any, field: str) -> None:
    slug = kwargs.pop("slug")
    with pytest.raises(errors.ValidationError) as info:
        api.create_tenant(slug, **kwargs)
    assert info.value.field == field
    assert not Tenant.objects.exists()


def test_duplicate_slug_and_unknown_tenant() -> None:
    api.create_tenant("acme")
    with pytest.raises(errors.ValidationError) as info:
        api.create_tenant("acme")
    assert info.value.field == "slug"
    with pytest.raises(errors.ValidationError) as info:
        api.update_tenant("nobody", max_running=1)
    assert info.value.field == "tenant"
    with pytest.raises(errors.ValidationError) as info:
        api.update_tenant("acme", max_runing=1)  # a typo is not silently ignored
    assert info.value.field == "max_runing"
    with pytest.raises(errors.ValidationError):
        api.update_tenant("acme", max_running=1, relay_weight=0)
    assert Tenant.objects.get(slug="acme").max_running is None  # nothing written


def every_minute_in_acme(clock: FrozenClock) -> dict[str, Any]:
    """create_schedule arguments (all but the name) of a per-minute cron of tenant acme."""
    return {"task": "billing.ping", "cron": "* * * * *", "tenant": "acme", "clock": clock}


def test_max_schedules_change_applies_to_the_next_create(frozen_clock: FrozenClock) -> None:
    api.create_tenant("acme", max_schedules=1)
    make = every_minute_in_acme(frozen_clock)
    api.create_schedule(name="one", **make)
    with pytest.raises(errors.QuotaExceeded):
        api.create_schedule(name="two", **make)
    api.update_tenant("acme", max_schedules=2)
    api.create_schedule(name="two", **make)


def test_max_schedules_of_zero_is_no_limit_on_every_create_path(
    frozen_clock: FrozenClock,
) -> None:
    """0, like None, means no limit (as for the other quotas); it refused every create."""
    api.create_tenant("acme", max_schedules=0)
    make = every_minute_in_acme(frozen_clock)
    api.create_schedule(name="one", **make)
    api.create_schedule(name="two", idempotency_key="k2", **make)
    api.create_schedules([{"name": "three", "task": "billing.ping", "cron": "* * * * *"}],
                         tenant="acme")  # fmt: skip
    api.sync_schedules(
        [{"idempotency_key": "k4", "name": "four", "task": "billing.ping", "cron": "0 * * * *"}],
        tenant="acme",
    )
    assert Schedule.objects.filter(tenant__slug="acme").count() == 4


def test_max_running_change_applies_to_the_next_claim(frozen_clock: FrozenClock) -> None:
    api.create_tenant("acme", max_running=1)
    t = Tenant.objects.get(slug="acme")
    first = make_occurrence(make_schedule(t), frozen_clock.now())
    second = make_occurrence(make_schedule(t), frozen_clock.now())
    assert claim.claim(first.id, worker="w", clock=frozen_clock).claimed
    assert claim.claim(second.id, worker="w", clock=frozen_clock).outcome is (ClaimOutcome.DEFERRED)
    api.update_tenant("acme", max_running=2)
    assert claim.claim(second.id, worker="w", clock=frozen_clock).claimed


def test_trigger_rate_change_applies_to_the_next_relay_pass() -> None:
    api.create_tenant("acme", max_trigger_rate=1)
    t = Tenant.objects.get(slug="acme")
    seed(t, [NOW - timedelta(seconds=1)] * 50)
    clock = FrozenClock(NOW)
    publisher = RecordingPublisher()
    assert relay_due(clock=clock, publisher=publisher).published == 1
    api.update_tenant("acme", max_trigger_rate=40)
    clock.advance(1)
    # At the old rate one second buys one message; at the new one it buys 40.
    assert relay_due(clock=clock, publisher=publisher).published == 40


def test_published_last_minute_counts_the_rows_sent_in_the_last_60_seconds() -> None:
    api.create_tenant("acme")
    api.create_tenant("initech")
    seed(Tenant.objects.get(slug="acme"), [NOW - timedelta(seconds=1)] * 7)
    seed(Tenant.objects.get(slug="initech"), [NOW - timedelta(seconds=1)] * 2)
    clock = FrozenClock(NOW)
    assert relay_due(clock=clock, publisher=RecordingPublisher()).published == 9

    def published() -> dict[str, int]:
        return {u.tenant.slug: u.published_last_minute for u in api.list_tenants(clock=clock)
                if u.tenant.slug in ("acme", "initech")}  # fmt: skip

    assert published() == {"acme": 7, "initech": 2}
    clock.advance(59)
    assert published() == {"acme": 7, "initech": 2}
    clock.advance(2)
    assert published() == {"acme": 0, "initech": 0}


def test_catchup_rate_change_applies_to_the_next_materializer_pass() -> None:
    from django_app.models import Occurrence
    from django_app.wiring import materialize_due

    api.create_tenant("acme", catchup_rate=1)
    clock = FrozenClock(NOW)
    late: dict[str, Any] = {
        "task": "billing.ping", "cron": "* * * * *", "misfire_policy": "CATCH_UP",
        "catchup_cap": 3, "max_lateness": 1, "tenant": "acme", "clock": clock,
    }  # fmt: skip
    first = api.create_schedule(name="first", **late)
    clock.advance(timedelta(minutes=3))
    materialize_due(clock=clock, horizon=timedelta(0))

    def spacing(schedule: Any) -> set[float]:
        # The late ones, held back by the catch-up rate (on-time ones are not paced).
        rows = Occurrence.objects.filter(schedule=schedule, state="SCHEDULED")
        times = sorted(at for t, at in rows.values_list("scheduled_for", "available_at") if at > t)
        assert len(times) == 3
        return {(b - a).total_seconds() for a, b in pairwise(times)}

    assert spacing(first) == {60.0}
    api.update_tenant("acme", catchup_rate=60)
    second = api.create_schedule(name="second", **late)
    clock.advance(timedelta(minutes=3))
    materialize_due(clock=clock, horizon=timedelta(0))
    assert spacing(second) == {1.0}


def test_the_catchup_backlog_counts_the_backfills_the_catchup_rate_paces() -> None:
    """A backfill is released at the tenant's catchup_rate like a CATCH_UP schedule's late
    runs; the usage's catchup_backlog (what that rate paces) left it out (0 of 6)."""
    api.create_tenant("acme", catchup_rate=1)
    clock = FrozenClock(NOW)
    schedule = api.create_schedule(
        name="report", task="billing.ping", cron="*/5 * * * *", tenant="acme", clock=clock
    )
    api.pause_schedule(schedule.id, clock=clock)
    report = api.backfill(
        schedule.id, NOW - timedelta(hours=1), NOW - timedelta(minutes=30), clock=clock
    )
    assert len(report.created) == 6
    (usage,) = api.list_tenants(tenant="acme", clock=clock)
    assert usage.catchup_backlog == 6


def test_one_tenants_usage_is_its_row_of_the_list_read_from_its_own_rows() -> None:
    """The HTTP API's tenant views ask for one tenant: what they read does not grow with
    the other tenants' schedules (seen failing with the whole list read and filtered)."""
    api.create_tenant("small")
    api.create_tenant("large")
    items = [{"name": f"l{n}", "task": "billing.ping", "cron": "* * * * *"} for n in range(300)]
    api.create_schedules(items, tenant="large")
    seed(Tenant.objects.get(slug="large"), [NOW - timedelta(seconds=1)] * 200)
    seed(Tenant.objects.get(slug="small"), [NOW - timedelta(seconds=1)] * 3)
    clock = FrozenClock(NOW)
    everyone = {u.tenant.slug: u for u in api.list_tenants(clock=clock)}
    with CaptureQueriesContext(connection) as captured:
        (small,) = api.list_tenants(tenant="small", clock=clock)
    assert small == everyone["small"]
    assert (small.schedules, everyone["large"].schedules) == (1, 301)
    with pytest.raises(errors.ValidationError) as unknown:
        api.list_tenants(tenant="nobody")
    assert unknown.value.field == "tenant"
    if not is_postgres():
        return  # the plan check below reads PostgreSQL's plans
    # The unsent rows the backlog starts from are every tenant's (no index by tenant: they
    # are what is due, not history); the schedules and occurrences read are its own.
    read = read_by(captured.captured_queries, ("django_app_schedule", "django_app_occurrence"))
    assert read < 20, read
