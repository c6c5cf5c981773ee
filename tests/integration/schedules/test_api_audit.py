"""The API records who and why (issue 11 item 6): one AuditEntry per lifecycle call."""

from __future__ import annotations

from typing import Any

import pytest

from celery_scheduler import api, errors
from django_app.models import AuditEntry, Schedule

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
