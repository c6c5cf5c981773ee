"""describe_schedule and list_schedules: the read half of the management API."""

from __future__ import annotations

import base64
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from celery_scheduler import api, errors
from celery_scheduler.api_types import ScheduleDescription, as_json
from celery_scheduler.core import ids
from celery_scheduler.core.clock import FrozenClock
from django_app.models import Attempt, Occurrence, OutboxEntry, Schedule
from django_app.schedules import reads

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(NOW)


def make(clock: FrozenClock, **overrides: Any) -> Schedule:
    values: dict[str, Any] = {"name": "report", "task": "billing.ping", "cron": "*/5 * * * *"}
    values.update(overrides)
    return api.create_schedule(clock=clock, **values)


def occ(schedule: Schedule, at: datetime, state: str, **fields: Any) -> Occurrence:
    o = Occurrence.objects.create(
        id=ids.occurrence_id(schedule.id, schedule.version, at),
        schedule=schedule,
        schedule_version=schedule.version,
        tenant_id=schedule.tenant_id,
        scheduled_for=at,
        available_at=at,
        state=state,
        **fields,
    )
    OutboxEntry.objects.create(
        occurrence=o, tenant_id=schedule.tenant_id, shard=schedule.shard, available_at=at
    )
    return o


def test_describe_gives_state_versions_next_times_recent_and_counters(clock: FrozenClock) -> None:
    s = make(clock, timezone="Europe/Berlin", max_lateness=60)
    base = datetime(2026, 3, 1, 11, 0, tzinfo=UTC)
    occ(s, base, "SUCCEEDED", attempt_count=2, enqueued_at=base + timedelta(seconds=3),
        started_at=base, finished_at=base)  # fmt: skip
    dead = occ(s, base + timedelta(minutes=5), "DEAD", attempt_count=3, started_at=base,
               last_error="boom")  # fmt: skip
    occ(s, base + timedelta(minutes=10), "MISSED")
    occ(s, base + timedelta(minutes=15), "SKIPPED_OVERLAP")
    for n, outcome in ((1, "RETRY"), (2, "FAILED")):
        Attempt.objects.create(occurrence=dead, number=n, fencing_token=n, started_at=base,
                               outcome=outcome)  # fmt: skip

    d = api.describe_schedule(s.id, next_count=3, last_count=2, clock=clock)

    assert isinstance(d, ScheduleDescription)
    assert d.schedule.state == "ACTIVE"
    assert d.schedule.state_reason == ""
    assert d.current_version is not None
    assert d.current_version.version == 1
    assert [t.utc for t in d.next_fire_times] == [
        datetime(2026, 3, 1, 12, 5, tzinfo=UTC),
        datetime(2026, 3, 1, 12, 10, tzinfo=UTC),
        datetime(2026, 3, 1, 12, 15, tzinfo=UTC),
    ]
    assert d.next_fire_times[0].local.utcoffset() == timedelta(hours=1)  # Berlin in March
    assert [o.state for o in d.recent] == ["SKIPPED_OVERLAP", "MISSED"]
    assert d.counters.runs == 2
    assert d.counters.succeeded == 1
    assert d.counters.dead == 1
    assert d.counters.missed == 1
    assert d.counters.skipped_overlap == 1
    assert d.counters.failures == 2
    assert d.settings["cron"] == "*/5 * * * *"
    assert d.settings["max_lateness"] == 60
    full = api.describe_schedule(s.id, last_count=10, clock=clock)
    first = full.recent[-1]
    assert (first.attempts, first.lag_seconds, first.origin) == (2, 3.0, "scheduled")
    # Each run links to the Celery task id its deliveries carry (AsyncResult, Flower).
    assert [o.task_id for o in d.recent] == [str(o.id) for o in d.recent]
    assert as_json(d)["recent"][0]["task_id"] == str(d.recent[0].id)  # every field renders


def test_describe_paused_shows_the_note_and_no_next_times(clock: FrozenClock) -> None:
    s = make(clock)
    api.pause_schedule(s.id, note="waiting for the vendor fix", clock=clock)
    d = api.describe_schedule(s.id, clock=clock)
    assert d.schedule.state == "PAUSED"
    assert d.schedule.state_reason == "waiting for the vendor fix"
    assert d.paused_at == NOW
    assert d.next_fire_times == []
    api.resume_schedule(s.id, clock=clock)
    d = api.describe_schedule(s.id, clock=clock)
    assert d.schedule.state_reason == ""
    assert d.paused_at is None


def test_describe_is_scoped_to_the_tenant(clock: FrozenClock, tenant_factory: Any) -> None:
    tenant_factory("a")
    tenant_factory("b")
    s = make(clock, tenant="a")
    assert api.describe_schedule(s.id, tenant="a", clock=clock).schedule.tenant == "a"
    with pytest.raises(errors.ScheduleNotFound):
        api.describe_schedule(s.id, tenant="b", clock=clock)
    with pytest.raises(errors.ScheduleNotFound):
        api.describe_schedule("not-a-uuid", clock=clock)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"next_count": 0}, "next_count"),
        ({"next_count": 10_000}, "next_count"),
        ({"last_count": -1}, "last_count"),
        ({"last_count": "3"}, "last_count"),
    ],
)
def test_describe_rejects_bad_counts(clock: FrozenClock, kwargs: Any, field: str) -> None:
    s = make(clock)
    with pytest.raises(errors.ValidationError) as info:
        api.describe_schedule(s.id, clock=clock, **kwargs)
    assert info.value.field == field


def test_list_filters_and_keyset_pages(clock: FrozenClock, tenant_factory: Any) -> None:
    tenant_factory("a")
    tenant_factory("b")
    made = []
    for i in range(7):
        clock.advance(timedelta(seconds=1))
        made.append(make(clock, tenant="a", name=f"job {i}", task="billing.ping"))
    other = make(clock, tenant="b", name="job b", task="billing.create_invoice")
    api.pause_schedule(made[2].id, clock=clock)

    seen: list[uuid.UUID] = []
    cursor = None
    while True:
        page = api.list_schedules(tenant="a", limit=3, after=cursor)
        seen.extend(s.id for s in page.items)
        assert len(page.items) <= 3
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == [s.id for s in sorted(made, key=lambda s: (s.created_at, s.id))]

    assert [s.id for s in api.list_schedules(tenant="a", state="PAUSED").items] == [made[2].id]
    assert [s.id for s in api.list_schedules(task="billing.create_invoice").items] == [other.id]
    assert [s.id for s in api.list_schedules(name_contains="JOB B").items] == [other.id]
    everything = api.list_schedules(limit=100).items
    assert {s.tenant for s in everything} == {"a", "b"}


def test_list_by_next_run(clock: FrozenClock) -> None:
    early = make(clock, name="early", cron="1 13 * * *")
    late = make(clock, name="late", cron="1 20 * * *")
    cut = datetime(2026, 3, 1, 15, 0, tzinfo=UTC)
    assert [s.id for s in api.list_schedules(next_run_before=cut).items] == [early.id]
    assert [s.id for s in api.list_schedules(next_run_after=cut).items] == [late.id]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"state": "SLEEPING"}, "state"),
        ({"limit": 0}, "limit"),
        ({"limit": 5000}, "limit"),
        ({"after": "garbage"}, "after"),
        ({"tenant": "nobody"}, "tenant"),
        ({"next_run_before": datetime(2026, 1, 1)}, "next_run_before"),
        ({"tag": "=x"}, "tag"),
    ],
)
def test_list_rejects_bad_filters(kwargs: Any, field: str) -> None:
    with pytest.raises(errors.ValidationError) as info:
        api.list_schedules(**kwargs)
    assert info.value.field == field


def test_list_refuses_another_lists_cursor_and_keeps_taking_its_older_ones(
    clock: FrozenClock,
) -> None:
    made = [make(clock, name=f"r{i}") for i in range(3)]
    first = api.list_schedules(limit=1)
    assert first.next_cursor is not None
    theirs = reads.encode_cursor(NOW, made[0].id, reads.occurrence_list(made[0].id))
    with pytest.raises(errors.ValidationError, match="occurrence list") as info:
        api.list_schedules(after=theirs)
    assert info.value.field == "after"
    # A cursor handed out before cursors named their list: [created_at, id].
    last = Schedule.objects.get(pk=first.items[0].id)
    raw = json.dumps([last.created_at.isoformat(), str(last.id)]).encode()
    older = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    assert (
        api.list_schedules(after=older).items == api.list_schedules(after=first.next_cursor).items
    )


def test_describe_counts_remaining_runs_and_truncates_next_times(clock: FrozenClock) -> None:
    s = make(clock, max_runs=2)
    d = api.describe_schedule(s.id, next_count=5, clock=clock)
    assert d.schedule.max_runs == 2
    assert d.schedule.remaining_runs == 2
    assert len(d.next_fire_times) == 2


def test_keyset_pages_handle_equal_created_at(clock: FrozenClock) -> None:
    made = [make(clock, name=f"tie {i}") for i in range(16)]
    Schedule.objects.update(created_at=NOW)  # bulk imports share one timestamp
    seen: list[uuid.UUID] = []
    cursor = None
    while True:
        page = api.list_schedules(limit=2, after=cursor)
        seen.extend(s.id for s in page.items)
        cursor = page.next_cursor
        if cursor is None:
            break
    # Ties break on id in the database's own order, which the cursor's comparison uses too:
    # MariaDB's native UUID type does not sort as the uuid text (nor as Python's uuid order),
    # so the pages are judged against one ORDER BY, and every row comes exactly once.
    in_db_order = list(Schedule.objects.order_by("created_at", "id").values_list("id", flat=True))
    assert seen == in_db_order
    assert sorted(seen) == sorted(s.id for s in made)
