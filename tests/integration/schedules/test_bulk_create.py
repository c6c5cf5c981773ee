"""create_schedules: validated like single creates, all or nothing, idempotent, and a schedule
created in bulk is indistinguishable from one created singly (the differential test)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from celery_scheduler import api, errors
from celery_scheduler.api_types import as_json
from celery_scheduler.core import ids
from celery_scheduler.core.clock import FrozenClock
from django_app import conf
from django_app.models import AuditEntry, Schedule, ScheduleTag, ScheduleVersion, Tenant
from django_app.schedules import bulk_create, validation

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC)
CLOCK = FrozenClock(NOW)

#: Every kind of trigger and most settings, so the differential test covers each code path.
ITEMS: list[dict[str, Any]] = [
    {"name": "plain", "task": "billing.ping", "cron": "*/5 * * * *"},
    {
        "name": "berlin", "task": "billing.ping", "cron": "30  2 * * *",
        "timezone": "Europe/Berlin", "misfire_policy": "fire_once", "max_lateness": 600,
        "overlap_policy": "SKIP_IF_RUNNING", "idempotency_key": "berlin",
        "tags": {"team": "billing", "env": "prod"}, "max_runs": 5,
    },
    {"name": "every 90 s", "task": "billing.ping", "interval": 90, "args": [1, "two"]},
    {
        "name": "anchored", "task": "billing.ping", "interval": timedelta(hours=1),
        "start_at": NOW + timedelta(minutes=7), "end_at": NOW + timedelta(days=3),
        "kwargs": {"customer": "c-1", "nested": {"a": [1, 2]}}, "queue": "slow",
        "priority": 7, "pause_after_failures": 3, "idempotency_key": "anchored",
    },
    {
        "name": "once", "task": "billing.ping", "run_at": NOW + timedelta(hours=5),
        "max_attempts": 4, "deadline": 600, "concurrency_limit": 2,
        "concurrency_group": "reports", "flexible_window": 30,
    },
    {
        "name": "catch up", "task": "billing.ping", "cron": "@hourly",
        "misfire_policy": "CATCH_UP", "catchup_cap": 3,
    },
]  # fmt: skip

#: Columns that differ between any two schedules (identity, wall-clock stamps).
_IDENTITY = {"id", "tenant", "tenant_id", "shard", "created_at", "updated_at"}


@pytest.fixture
def tenants() -> tuple[Tenant, Tenant]:
    return Tenant.objects.create(slug="single"), Tenant.objects.create(slug="bulk")


def _columns(schedule: Schedule) -> dict[str, Any]:
    return {
        f.attname: getattr(schedule, f.attname)
        for f in Schedule._meta.concrete_fields
        if f.attname not in _IDENTITY
    }


def _by_name(tenant: Tenant) -> dict[str, Schedule]:
    return {s.name: s for s in Schedule.objects.filter(tenant=tenant)}


def test_a_schedule_created_in_bulk_is_indistinguishable_from_one_created_singly(
    tenants: tuple[Tenant, Tenant],
) -> None:
    single, bulk = tenants
    for item in ITEMS:
        api.create_schedule(**item, tenant="single", clock=CLOCK, actor="me", reason="why")
    report = api.create_schedules(ITEMS, tenant="bulk", clock=CLOCK, actor="me", reason="why")
    assert (report.created, report.existing) == (len(ITEMS), 0)
    names = dict(Schedule.objects.filter(tenant=bulk).values_list("id", "name"))
    assert [names[i] for i in report.schedule_ids] == [i["name"] for i in ITEMS]

    one, many = _by_name(single), _by_name(bulk)
    assert set(one) == set(many) == {i["name"] for i in ITEMS}
    shard_count = conf.get().shard_count
    for name in one:
        a, b = one[name], many[name]
        assert _columns(a) == _columns(b), name
        assert b.shard == ids.shard_for(b.id, shard_count)
        # The stored row reads back the same, too (JSON columns, time zones).
        a.refresh_from_db()
        b.refresh_from_db()
        assert _columns(a) == _columns(b), name
        assert b.next_run_at is not None
        assert b.created_at is not None

        def version_rows(s: Schedule) -> list[Mapping[str, Any]]:
            return list(
                ScheduleVersion.objects.filter(schedule=s).values(
                    "version", "kind", "cron", "timezone", "interval_seconds", "run_at",
                    "start_at", "end_at", "valid_from", "valid_to",
                )
            )  # fmt: skip

        assert version_rows(a) == version_rows(b), name
        assert len(version_rows(b)) == 1
        assert list(ScheduleTag.objects.filter(schedule=a).values_list("key", "value")) == list(
            ScheduleTag.objects.filter(schedule=b).values_list("key", "value")
        )
        assert set(ScheduleTag.objects.filter(schedule=b).values_list("tenant_id", flat=True)) <= {
            bulk.pk
        }

        def audit_rows(s: Schedule) -> list[tuple[Any, ...]]:
            return list(
                AuditEntry.objects.filter(schedule=s).values_list(
                    "at", "action", "actor", "reason", "detail", "occurrence_id"
                )
            )

        assert audit_rows(a) == audit_rows(b), name
        assert len(audit_rows(b)) == 1
        assert AuditEntry.objects.filter(schedule=b).get().tenant_id == bulk.pk
    # A description of each reads the same (settings, next fire times, version, counters).
    for name in one:
        da = as_json(api.describe_schedule(one[name].id, clock=CLOCK))
        db = as_json(api.describe_schedule(many[name].id, clock=CLOCK))
        for described in (da, db):
            for key in ("id", "tenant", "created_at", "updated_at"):
                del described["schedule"][key]
        assert da == db, name


def test_the_spec_digest_is_the_one_asdict_gave() -> None:
    """content_hash no longer deep-copies the spec: the digest of stored schedules holds."""
    from django_app.schedules import validation

    spec = validation.validate(now=NOW, **{k: v for k, v in ITEMS[3].items()
                                           if k in validation.INPUT_FIELDS})  # fmt: skip
    values = dataclasses.asdict(spec)
    # The DST policy (migration 0018) is left out at its defaults, so the digests of
    # schedules stored before it hold too.
    assert (values.pop("dst_gap"), values.pop("dst_fold")) == ("SKIP", "FIRST")
    payload = json.dumps(values, sort_keys=True, default=str, separators=(",", ":"))
    assert spec.content_hash() == hashlib.sha256(payload.encode()).hexdigest()


@pytest.mark.parametrize(
    ("bad", "error", "field", "message"),
    [
        ({"cron": "61 * * * *"}, errors.InvalidCronExpression, "items[2].cron", "minute"),
        ({"task": "billing.pong"}, errors.UnknownTask, "items[2].task", "billing.ping"),
        ({"kwargs": [1]}, errors.InvalidArguments, "items[2].kwargs", "object"),
        ({"max_runs": 0}, errors.InvalidPolicy, "items[2].max_runs", "between"),
        ({"tenant": "other"}, errors.ValidationError, "items[2].tenant", "once per call"),
        ({"idempotency_key": ""}, errors.ValidationError, "items[2].idempotency_key", "required"),
    ],
)
def test_a_bad_item_names_its_index_and_field_and_nothing_is_written(
    tenants: Any, bad: dict[str, Any], error: type[Exception], field: str, message: str
) -> None:
    items = [dict(ITEMS[0], name=f"s{i}") for i in range(5)]
    items[2].update(bad)
    with pytest.raises(error) as caught:
        api.create_schedules(items, tenant="bulk", clock=CLOCK)
    assert type(caught.value) is error
    assert caught.value.field == field  # type: ignore[attr-defined]
    assert str(caught.value).startswith("items[2]: ")
    assert message in str(caught.value)
    assert not Schedule.objects.exists()
    assert not ScheduleVersion.objects.exists()
    assert not AuditEntry.objects.exists()


def test_values_shared_by_items_are_checked_once_per_batch(
    tenants: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The registry lookup and the cron parse run once per distinct value, not per item."""
    from celery_scheduler.core import timemath  # deferred (test-only spy on a core class)

    calls = {"task": 0, "cron": 0}
    real_task, real_cron = validation.is_registered_task, timemath.CronTrigger.__post_init__

    def task(name: str) -> bool:
        calls["task"] += 1
        return real_task(name)

    def cron(self: Any) -> None:
        calls["cron"] += 1
        real_cron(self)

    monkeypatch.setattr(validation, "is_registered_task", task)
    monkeypatch.setattr(timemath.CronTrigger, "__post_init__", cron)
    items = [dict(ITEMS[0], name=f"s{i}") for i in range(20)]
    api.create_schedules(items, tenant="bulk", clock=CLOCK)
    assert calls["task"] == 1
    # One parse while validating; the first fire (cached per expression) may build one more.
    assert calls["cron"] <= 2


@pytest.mark.parametrize(
    ("bad", "error", "field"),
    [
        ({"task": "no.such.task"}, errors.UnknownTask, "items[3].task"),
        ({"cron": "61 * * * *"}, errors.InvalidCronExpression, "items[3].cron"),
        ({"timezone": "Mars/Base"}, errors.UnknownTimeZone, "items[3].timezone"),
        ({"interval": True}, errors.ValidationError, "items[3].interval"),
    ],
)
def test_a_value_refused_after_others_were_accepted_still_names_its_item(
    tenants: Any, bad: dict[str, Any], error: type[Exception], field: str
) -> None:
    """What the batch memo keeps for accepted values never lets a refused one through."""
    items = [dict(ITEMS[2 if "interval" in bad else 0], name=f"s{i}") for i in range(6)]
    items[3].update(bad)
    items[5].update(bad)  # refused again the second time: only accepted values are kept
    with pytest.raises(error) as caught:
        api.create_schedules(items, tenant="bulk", clock=CLOCK)
    assert caught.value.field == field  # type: ignore[attr-defined]
    assert not Schedule.objects.exists()


def test_a_bad_item_after_many_chunks_rolls_everything_back(
    tenants: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rows of earlier chunks were already sent: the transaction takes them back."""
    monkeypatch.setattr(bulk_create, "CHUNK", 7)
    items = [dict(ITEMS[0], name=f"s{i}", tags={"n": str(i)}) for i in range(40)]
    items[33]["cron"] = "* * *"
    with pytest.raises(errors.InvalidCronExpression, match=r"^items\[33\]: "):
        api.create_schedules(items, tenant="bulk", clock=CLOCK)
    assert not Schedule.objects.exists()
    assert not ScheduleTag.objects.exists()
    del items[33]
    report = api.create_schedules(items, tenant="bulk", clock=CLOCK)
    assert report.created == 39 == Schedule.objects.count() == ScheduleVersion.objects.count()
    assert ScheduleTag.objects.count() == 39 == AuditEntry.objects.count()
    assert [s.name for s in Schedule.objects.filter(pk__in=report.schedule_ids)] != []
    got = dict(Schedule.objects.values_list("id", "name"))
    assert [got[i] for i in report.schedule_ids] == [i["name"] for i in items]
    # The audit entries are in item order too (on PostgreSQL the server builds them).
    audited = list(AuditEntry.objects.order_by("id").values_list("schedule_id", flat=True))
    assert audited == report.schedule_ids


def test_idempotency_keys_replay_and_conflict_as_in_single_create(tenants: Any) -> None:
    items = [dict(ITEMS[0], name=f"s{i}", idempotency_key=f"k{i}") for i in range(4)]
    first = api.create_schedules(items, tenant="bulk", clock=CLOCK)
    again = api.create_schedules(items, tenant="bulk", clock=CLOCK)
    assert (again.created, again.existing) == (0, 4)
    assert again.schedule_ids == first.schedule_ids
    # A single create with the same key and content returns the bulk-made schedule...
    single = api.create_schedule(**items[1], tenant="bulk", clock=CLOCK)
    assert single.id == first.schedule_ids[1]
    # ...and with other content it is the single create's conflict, in bulk too.
    changed = dict(items[1], cron="*/7 * * * *")
    with pytest.raises(errors.IdempotencyConflict) as one:
        api.create_schedule(**changed, tenant="bulk", clock=CLOCK)
    with pytest.raises(errors.IdempotencyConflict) as many:
        api.create_schedules([dict(ITEMS[0], name="new"), changed], tenant="bulk", clock=CLOCK)
    assert str(many.value) == f"items[1]: {one.value}"
    assert Schedule.objects.count() == 4  # the good item of the refused batch is not there


def test_a_keyed_one_off_replayed_after_its_run_at_returns_its_schedule(tenants: Any) -> None:
    item = {"name": "launch", "task": "billing.ping", "run_at": NOW + timedelta(minutes=1),
            "idempotency_key": "launch"}  # fmt: skip
    first = api.create_schedules([item], tenant="bulk", clock=CLOCK)
    later = FrozenClock(NOW + timedelta(hours=1))
    again = api.create_schedules([item], tenant="bulk", clock=later)
    assert (again.schedule_ids, again.created, again.existing) == (first.schedule_ids, 0, 1)
    with pytest.raises(errors.InvalidTiming, match=r"^items\[1\]: run_at .* beyond max_lateness"):
        api.create_schedules([item, dict(item, idempotency_key="new")], tenant="bulk", clock=later)
    assert Schedule.objects.count() == 1


def test_a_key_repeated_in_one_call(tenants: Any) -> None:
    item = dict(ITEMS[0], idempotency_key="same")
    report = api.create_schedules([item, dict(item)], tenant="bulk", clock=CLOCK)
    assert (report.created, report.existing) == (1, 1)
    assert report.schedule_ids[0] == report.schedule_ids[1]
    with pytest.raises(errors.IdempotencyConflict, match=r"^items\[1\]: .*'other'"):
        api.create_schedules(
            [dict(item, idempotency_key="other"), dict(item, idempotency_key="other", name="x")],
            tenant="bulk",
            clock=CLOCK,
        )
    assert Schedule.objects.count() == 1


def test_the_quota_counts_the_whole_batch(tenants: Any) -> None:
    Tenant.objects.filter(slug="bulk").update(max_schedules=3)
    api.create_schedule(**ITEMS[0], tenant="bulk", clock=CLOCK)
    items = [dict(ITEMS[0], name=f"s{i}") for i in range(3)]
    with pytest.raises(errors.QuotaExceeded, match="adds 3"):
        api.create_schedules(items, tenant="bulk", clock=CLOCK)
    assert Schedule.objects.count() == 1
    assert api.create_schedules(items[:2], tenant="bulk", clock=CLOCK).created == 2


def test_an_unknown_tenant_and_an_empty_batch(tenants: Any) -> None:
    with pytest.raises(errors.ValidationError) as caught:
        api.create_schedules([ITEMS[0]], tenant="nobody", clock=CLOCK)
    assert caught.value.field == "tenant"
    report = api.create_schedules([], tenant="bulk", clock=CLOCK)
    assert (report.schedule_ids, report.created, report.existing) == ([], 0, 0)


def test_bulk_created_schedules_materialize_like_single_ones(tenants: Any) -> None:
    """The beat's view: due by shard and cursor, the same fire times as a single create's."""
    single, bulk = tenants
    api.create_schedule(**ITEMS[2], tenant="single", clock=CLOCK)
    api.create_schedules([ITEMS[2]], tenant="bulk", clock=CLOCK)
    a, b = Schedule.objects.get(tenant=single), Schedule.objects.get(tenant=bulk)
    spec_a, spec_b = validation.spec_of(a), validation.spec_of(b)
    assert spec_a == spec_b
    assert spec_b.start_at == NOW
    assert a.next_run_at == b.next_run_at == NOW
