"""sync_schedules: a declarative upsert by idempotency key, on the bulk create and the normal
update path, reporting created/updated/unchanged/stopped/pruned."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from celery_scheduler import api, errors
from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.core.enums import ScheduleState
from django_app.models import AuditEntry, Schedule, ScheduleTag, ScheduleVersion, Tenant

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC)


def _items() -> list[dict[str, Any]]:
    return [
        {"idempotency_key": "report", "name": "report", "task": "billing.ping",
         "cron": "0 * * * *", "queue": "reports", "tags": {"team": "a"}},
        {"idempotency_key": "poll", "name": "poll", "task": "billing.ping", "interval": 60},
        {"idempotency_key": "once", "name": "once", "task": "billing.ping",
         "run_at": NOW + timedelta(days=1)},
    ]  # fmt: skip


@pytest.fixture
def acme() -> Tenant:
    return Tenant.objects.create(slug="acme")


def _sync(items: list[dict[str, Any]], at: datetime = NOW, **kw: Any) -> Any:
    return api.sync_schedules(items, tenant="acme", clock=FrozenClock(at), **kw)


def test_first_sync_creates_then_the_same_items_are_unchanged(acme: Tenant) -> None:
    report = _sync(_items())
    assert report.created == ["report", "poll", "once"]
    assert report.updated == report.unchanged == report.pruned == report.stopped == []
    assert set(Schedule.objects.values_list("source", flat=True)) == {"sync"}
    versions, audit = ScheduleVersion.objects.count(), AuditEntry.objects.count()
    # An hour later: nothing to do, and the interval keeps its creation anchor.
    again = _sync(_items(), at=NOW + timedelta(hours=1, seconds=17))
    assert again.unchanged == ["report", "poll", "once"]
    assert again.created == again.updated == []
    assert ScheduleVersion.objects.count() == versions
    assert AuditEntry.objects.count() == audit
    assert Schedule.objects.get(name="poll").start_at == NOW
    assert set(Schedule.objects.values_list("version", flat=True)) == {1}


def test_a_sync_after_a_one_offs_run_at_leaves_it_and_refuses_a_new_late_one(
    acme: Tenant,
) -> None:
    """The same declared items two days on: the one-off's time has passed, which is no
    reason to refuse the whole sync; a new one-off already late is refused, naming it."""
    _sync(_items())
    later = NOW + timedelta(days=2)
    assert _sync(_items(), at=later).unchanged == ["report", "poll", "once"]
    late = {"idempotency_key": "late", "name": "late", "task": "billing.ping",
            "run_at": NOW + timedelta(days=1)}  # fmt: skip
    with pytest.raises(errors.InvalidTiming, match=r"^items\[3\]: run_at .* beyond max_lateness"):
        _sync([*_items(), late], at=later)
    assert Schedule.objects.count() == 3


def test_changed_items_go_through_update_schedule(acme: Tenant) -> None:
    _sync(_items())
    items = _items()
    items[0]["cron"] = "30 * * * *"  # timing: a new version, replanned
    del items[0]["queue"]  # left out: back to the default
    items[1]["tags"] = {"new": "tag"}  # tags only: in place, no new version
    later = NOW + timedelta(minutes=5)
    report = _sync(items, at=later)
    assert report.updated == ["report", "poll"]
    assert report.unchanged == ["once"]
    report_row = Schedule.objects.get(name="report")
    assert (report_row.version, report_row.cron, report_row.queue) == (2, "30 * * * *", "")
    assert report_row.next_run_at == datetime(2026, 3, 1, 12, 30, tzinfo=UTC)
    assert ScheduleVersion.objects.filter(schedule=report_row).count() == 2
    poll = Schedule.objects.get(name="poll")
    assert poll.version == 1
    assert dict(ScheduleTag.objects.filter(schedule=poll).values_list("key", "value")) == {
        "new": "tag"
    }
    updates = AuditEntry.objects.filter(action="update").order_by("id")
    assert [e.schedule_id for e in updates] == [report_row.id, poll.id]
    assert updates[0].detail["fields"] == sorted(["cron", "interval", "queue", "run_at"])
    # Applied again: all unchanged.
    assert _sync(items, at=later).unchanged == ["report", "poll", "once"]


def test_prune_cancels_only_sync_made_schedules_missing_from_the_items(acme: Tenant) -> None:
    _sync(_items())
    api.create_schedule(
        name="by hand", task="billing.ping", cron="* * * * *", tenant="acme",
        idempotency_key="by-hand", clock=FrozenClock(NOW),
    )  # fmt: skip
    items = _items()[:1]
    kept = _sync(items)
    assert kept.pruned == []
    assert kept.unchanged == ["report"]
    report = _sync(items, prune=True, reason="gone from the file")
    assert report.pruned == ["once", "poll"]  # in key order
    assert report.unchanged == ["report"]
    states = dict(Schedule.objects.values_list("idempotency_key", "state"))
    assert states == {
        "report": "ACTIVE", "poll": "CANCELED", "once": "CANCELED", "by-hand": "ACTIVE",
    }  # fmt: skip
    assert AuditEntry.objects.filter(action="cancel", reason="gone from the file").count() == 2
    # A pruned key stays taken: syncing it again leaves the canceled schedule alone.
    assert _sync(_items()).stopped == ["poll", "once"]
    assert Schedule.objects.get(idempotency_key="poll").state == ScheduleState.CANCELED


@pytest.mark.parametrize("prune", ["false", 0, "yes"])
def test_prune_takes_a_bool_only(acme: Tenant, prune: Any) -> None:
    """prune cancels schedules: a string from a config file ("false") or a 0 must not be
    read by its truth. Seen failing: prune="false" canceled "poll" and "once"."""
    _sync(_items())
    with pytest.raises(errors.ValidationError) as caught:
        _sync(_items()[:1], prune=prune)
    assert caught.value.field == "prune"
    assert "True or False" in str(caught.value)
    assert set(Schedule.objects.values_list("state", flat=True)) == {"ACTIVE"}
    assert _sync(_items()[:1], prune=None).pruned == []  # None: not given (HTTP's null)


def test_keys_are_required_and_unique(acme: Tenant) -> None:
    items = _items()
    del items[1]["idempotency_key"]
    with pytest.raises(errors.ValidationError) as caught:
        _sync(items)
    assert caught.value.field == "items[1].idempotency_key"
    items = _items()
    items[2]["idempotency_key"] = "report"
    with pytest.raises(errors.ValidationError, match=r"items\[0\]") as caught:
        _sync(items)
    assert caught.value.field == "items[2].idempotency_key"
    assert not Schedule.objects.exists()


def test_all_or_nothing(acme: Tenant) -> None:
    """A refused item, or a refused update, leaves the creates and updates of the call out."""
    _sync(_items()[:1])
    items = _items()
    items[0]["cron"] = "15 * * * *"
    items[2]["task"] = "billing.pong"
    with pytest.raises(errors.UnknownTask, match=r"^items\[2\]: "):
        _sync(items)
    assert Schedule.objects.count() == 1
    assert Schedule.objects.get().cron == "0 * * * *"
    items = _items()
    items[0]["max_runs"] = 1
    Schedule.objects.filter(idempotency_key="report").update(runs_count=3)
    with pytest.raises(errors.ValidationError) as caught:
        _sync(items)
    assert caught.value.field == "items[0].max_runs"
    assert Schedule.objects.count() == 1
    assert Schedule.objects.get().max_runs is None


def test_a_paused_schedule_is_updated_and_stays_paused(acme: Tenant) -> None:
    _sync(_items())
    poll = Schedule.objects.get(idempotency_key="poll")
    api.pause_schedule(poll.id, clock=FrozenClock(NOW))
    items = _items()
    items[1]["interval"] = 120
    assert _sync(items).updated == ["poll"]
    poll.refresh_from_db()
    assert (poll.state, poll.interval_seconds) == ("PAUSED", 120)


def test_the_sync_schedules_command(acme: Tenant, tmp_path: Any) -> None:
    import io
    import json

    from django.core.management import call_command
    from django.core.management.base import CommandError

    items = _items()
    run_at = datetime.now(UTC).replace(microsecond=0) + timedelta(days=1)  # the real clock
    items[2]["run_at"] = run_at.isoformat()  # JSON: ISO 8601 text
    path = tmp_path / "schedules.json"
    path.write_text(json.dumps({"items": items}))
    out = io.StringIO()
    call_command("sync_schedules", str(path), "--tenant", "acme", stdout=out)
    assert "created: 3" in out.getvalue()
    assert Schedule.objects.get(idempotency_key="once").run_at == run_at
    items[0]["cron"] = "61 * * * *"
    path.write_text(json.dumps(items))
    with pytest.raises(CommandError, match=r"items\[0\]\.cron") as caught:
        call_command("sync_schedules", str(path), "--tenant", "acme")
    assert caught.value.returncode == 2
