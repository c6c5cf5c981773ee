"""The API records who and why (issue 11 item 6): one AuditEntry per lifecycle call."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from celery_scheduler import api, errors
from celery_scheduler.core.clock import FrozenClock
from django_app.models import AuditEntry, Occurrence, Schedule

pytestmark = pytest.mark.django_db


def trail(schedule: Any) -> list[tuple[str, str, str]]:
    rows = AuditEntry.objects.filter(schedule=schedule).order_by("at", "pk")
    return [(e.action, e.actor, e.reason) for e in rows]


def test_each_call_is_recorded_with_who_and_why(tenant: Any) -> None:
    schedule = api.create_schedule(
        name="nightly", task="billing.ping", cron="0 2 * * *", tenant=tenant,
        actor="deploy-bot", reason="ticket OPS-12",
    )  # fmt: skip
    api.update_schedule(schedule.id, cron="0 3 * * *", actor="alice", reason="move after backup")
    api.pause_schedule(schedule.id, actor="alice", reason="incident 7")
    api.resume_schedule(schedule.id)  # no who/why given: still recorded
    occurrence = api.run_now(schedule.id, actor="bob")
    api.cancel_schedule(schedule.id, actor="carol", reason="replaced by v2 job")
    assert trail(schedule) == [
        ("create", "deploy-bot", "ticket OPS-12"),
        ("update", "alice", "move after backup"),
        ("pause", "alice", "incident 7"),
        ("resume", "", ""),
        ("run_now", "bob", ""),
        ("cancel", "carol", "replaced by v2 job"),
    ]
    entries = AuditEntry.objects.filter(schedule=schedule).order_by("at", "pk")
    assert entries[1].detail == {"version": 2, "fields": ["cron"]}
    assert entries[4].occurrence_id == occurrence.id
    assert {e.tenant_id for e in entries} == {tenant.pk}


@pytest.mark.parametrize(
    ("actor", "reason", "field"),
    [
        ("a\x00b", "", "actor"),
        ("x" * 201, "", "actor"),
        ("", "r" * 2001, "reason"),
        # A lone surrogate cannot be encoded: the change went through, then its entry failed.
        ("", "\udcff", "reason"),
        ("\ud800", "", "actor"),
    ],
)
def test_bad_who_or_why_is_refused_before_anything_changes(
    tenant: Any, actor: str, reason: str, field: str
) -> None:
    schedule = api.create_schedule(name="n", task="billing.ping", interval=60, tenant=tenant)
    with pytest.raises(errors.ValidationError) as caught:
        api.pause_schedule(schedule.id, actor=actor, reason=reason)
    assert caught.value.field == field
    schedule.refresh_from_db()
    assert (schedule.state, schedule.version) == ("ACTIVE", 1)
    assert [a for a, _, _ in trail(schedule)] == ["create"]
    assert Schedule.objects.count() == 1


def test_a_skip_and_a_backfill_are_recorded_with_who_and_why(tenant: Any) -> None:
    clock = FrozenClock(datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC))
    schedule = api.create_schedule(
        name="report", task="billing.ping", cron="*/5 * * * *", tenant=tenant, clock=clock
    )
    api.pause_schedule(schedule.id, clock=clock)
    api.backfill(
        schedule.id, datetime(2026, 3, 1, 11, 0, tzinfo=UTC),
        datetime(2026, 3, 1, 11, 30, tzinfo=UTC), actor="alice", reason="outage OPS-9",
        clock=clock,
    )  # fmt: skip
    api.resume_schedule(schedule.id, clock=clock)
    api.skip_occurrence(schedule.id, note="maintenance window", actor="bob", clock=clock)
    api.skip_occurrence(schedule.id, actor="carol", reason="holiday", clock=clock)
    assert trail(schedule)[-3:] == [
        ("resume", "", ""),
        ("skip", "bob", "maintenance window"),
        ("skip", "carol", "holiday"),
    ]
    entries = {e.action: e for e in AuditEntry.objects.filter(schedule=schedule)}
    assert ("backfill", "alice", "outage OPS-9") in trail(schedule)
    assert entries["backfill"].detail == {
        "start": "2026-03-01T11:00:00+00:00",
        "end": "2026-03-01T11:30:00+00:00",
        "created": 6,
    }
    skipped = [e.detail for e in AuditEntry.objects.filter(schedule=schedule, action="skip")]
    assert skipped == [
        {"scheduled_for": "2026-03-01T12:05:00+00:00"},
        {"scheduled_for": "2026-03-01T12:10:00+00:00"},
    ]


@pytest.mark.parametrize("call", ["skip", "backfill"])
def test_a_skip_or_backfill_with_a_bad_who_changes_nothing(tenant: Any, call: str) -> None:
    clock = FrozenClock(datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC))
    schedule = api.create_schedule(
        name="report", task="billing.ping", cron="*/5 * * * *", tenant=tenant, clock=clock
    )
    api.pause_schedule(schedule.id, clock=clock)
    at, start, end = (
        datetime(2026, 3, 1, h, m, tzinfo=UTC) for h, m in ((12, 5), (11, 0), (11, 30))
    )
    calls = {
        "skip": lambda: api.skip_occurrence(schedule.id, at, actor="a\x00", clock=clock),
        "backfill": lambda: api.backfill(schedule.id, start, end, reason="\udcff", clock=clock),
    }
    with pytest.raises(errors.ValidationError) as caught:
        calls[call]()
    assert caught.value.field == ("actor" if call == "skip" else "reason")
    schedule.refresh_from_db()
    assert schedule.skip_times in (None, [])
    assert not Occurrence.objects.filter(schedule=schedule).exists()
    assert [a for a, _, _ in trail(schedule)] == ["create", "pause"]
