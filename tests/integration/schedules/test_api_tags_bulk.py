"""Tags on schedules, list filtering by tag, and bulk pause/resume/cancel by filter."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from celery_scheduler import api, errors
from celery_scheduler.api_types import BulkOutcome, BulkReport, as_json
from celery_scheduler.core.clock import FrozenClock
from django_app.models import Schedule, ScheduleTag

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(NOW)


@pytest.fixture
def two_tenants(tenant_factory: Any) -> None:
    tenant_factory("a")
    tenant_factory("b")


def make(clock: FrozenClock, **overrides: Any) -> Schedule:
    values: dict[str, Any] = {"name": "job", "task": "billing.ping", "cron": "*/5 * * * *"}
    values.update(overrides)
    return api.create_schedule(clock=clock, **values)


def ids_of(page: Any) -> set[Any]:
    return {s.id for s in page.items}


def test_tags_are_stored_listed_and_replaced(clock: FrozenClock, two_tenants: None) -> None:
    s = make(clock, tenant="a", tags={"team": "billing", "env": "prod"})
    assert api.describe_schedule(s.id, clock=clock).schedule.tags == {
        "env": "prod",
        "team": "billing",
    }
    result = api.update_schedule(s.id, tags={"team": "ops"}, clock=clock)
    assert result.version == 1  # tags are not timing: no new version
    assert api.list_schedules(tenant="a").items[0].tags == {"team": "ops"}


def test_list_by_tag_is_scoped_to_the_tenant(clock: FrozenClock, two_tenants: None) -> None:
    billing = make(clock, tenant="a", tags={"team": "billing", "env": "prod"})
    ops = make(clock, tenant="a", tags={"team": "ops"})
    other = make(clock, tenant="b", tags={"team": "billing"})
    assert ids_of(api.list_schedules(tenant="a", tag="team=billing")) == {billing.id}
    assert ids_of(api.list_schedules(tenant="a", tag="team")) == {billing.id, ops.id}
    assert ids_of(api.list_schedules(tenant="a", tag={"team": "billing", "env": "prod"})) == {
        billing.id
    }
    assert ids_of(api.list_schedules(tenant="a", tag={"team": "billing", "env": "dev"})) == set()
    assert ids_of(api.list_schedules(tag="team=billing")) == {billing.id, other.id}


@pytest.mark.parametrize(
    "tags",
    [
        "team=billing",
        {"": "x"},
        {"team": 3},
        {"a=b": "c"},
        {"k": "v" * 201},
        {f"k{i}": "v" for i in range(51)},
        {"team": "bill\x00ing"},
        {"te\x00am": "billing"},
        {"team": "\ud800"},
        {"a": "1", " a": "2"},  # one key once stripped: one value was dropped silently
    ],
)
def test_bad_tags_name_the_field_and_write_nothing(clock: FrozenClock, tags: Any) -> None:
    with pytest.raises(errors.ValidationError) as info:
        make(clock, tags=tags)
    assert info.value.field == "tags"
    assert not Schedule.objects.exists()
    assert not ScheduleTag.objects.exists()


def test_bulk_pause_reports_what_really_happened(clock: FrozenClock, two_tenants: None) -> None:
    active = make(clock, tenant="a", name="active", tags={"team": "billing"})
    paused = make(clock, tenant="a", name="paused", tags={"team": "billing"})
    canceled = make(clock, tenant="a", name="canceled", tags={"team": "billing"})
    untagged = make(clock, tenant="a", name="untagged")
    other = make(clock, tenant="b", name="other tenant", tags={"team": "billing"})
    api.pause_schedule(paused.id, clock=clock)
    api.cancel_schedule(canceled.id, clock=clock)

    report = api.bulk_pause(
        tenant="a", tag="team=billing", note="billing freeze", actor="ops-bot", clock=clock
    )

    assert isinstance(report, BulkReport)
    outcome = {i.schedule_id: i.outcome for i in report.items}
    assert outcome == {
        active.id: BulkOutcome.CHANGED,
        paused.id: BulkOutcome.UNCHANGED,
        canceled.id: BulkOutcome.REFUSED,
    }
    assert "CANCELED" in report.refused[0].reason
    assert [i.schedule_id for i in report.changed] == [active.id]
    states = dict(Schedule.objects.values_list("id", "state"))
    assert states[active.id] == "PAUSED"
    assert states[untagged.id] == "ACTIVE"
    assert states[other.id] == "ACTIVE"
    assert Schedule.objects.get(pk=active.id).pause_reason == "billing freeze"
    from django_app.models import AuditEntry

    audited = AuditEntry.objects.filter(action="pause", actor="ops-bot")
    assert set(audited.values_list("schedule_id", flat=True)) == {active.id, paused.id}
    assert set(audited.values_list("reason", flat=True)) == {"billing freeze"}
    as_json(report)

    resumed = api.bulk_resume(tenant="a", tag="team=billing", clock=clock)
    assert {i.schedule_id for i in resumed.changed} == {active.id, paused.id}
    assert [i.schedule_id for i in resumed.refused] == [canceled.id]

    gone = api.bulk_cancel(tenant="a", tag="team=billing", clock=clock)
    assert {i.schedule_id for i in gone.changed} == {active.id, paused.id}
    assert [i.schedule_id for i in gone.unchanged] == [canceled.id]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({}, "tenant"),
        ({"tenant": "nobody"}, "tenant"),
        ({"tenant": "a", "tag": "=x"}, "tag"),
        ({"tenant": "a", "state": "NOPE"}, "state"),
        ({"tenant": "a", "note": "x" * 501}, "note"),
        ({"tenant": "a", "tag": "team=\x00"}, "tag"),
        # Given but empty: each would match every schedule of the tenant.
        ({"name_contains": " "}, "name_contains"),
        ({"tenant": "a", "name_contains": ""}, "name_contains"),
        ({"tag": {}}, "tag"),
        ({"tenant": "a", "next_run_after": ""}, "next_run_after"),
        ({"tenant": "a", "state": []}, "state"),
    ],
)
def test_bulk_rejects_bad_filters_and_writes_nothing(
    clock: FrozenClock, two_tenants: None, kwargs: Any, field: str
) -> None:
    make(clock, tenant="a")
    with pytest.raises(errors.ValidationError) as info:
        api.bulk_pause(clock=clock, **kwargs)
    assert info.value.field == field
    assert set(Schedule.objects.values_list("state", flat=True)) == {"ACTIVE"}
