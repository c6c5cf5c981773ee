"""The reconciler judges the occurrence table against schedule versions and time rules."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command, execute_from_command_line
from django.core.management.base import CommandError
from django.db import connections

from celery_scheduler import api
from celery_scheduler.core.clock import FrozenClock
from django_app.materializer import materialize_due
from django_app.models import Occurrence, Schedule
from django_app.reconcile import reconcile

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
pytestmark = pytest.mark.django_db


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(NOW)


def run_minutes(clock: FrozenClock, minutes: int) -> None:
    """A healthy beat: materialize each minute as it comes (no look-ahead)."""
    for _ in range(minutes):
        materialize_due(clock=clock, horizon=timedelta(0))
        clock.advance(MINUTE)


def create(clock: FrozenClock, **kw: Any) -> Schedule:
    kw.setdefault("cron", "* * * * *")
    return api.create_schedule(name=kw.pop("name", "every minute"), task="billing.ping",
                               clock=clock, **kw)  # fmt: skip


def run_reconcile(*extra: str) -> tuple[int, dict[str, Any]]:
    out = StringIO()
    try:
        call_command(
            "reconcile", "--from", NOW.isoformat(), "--to", (NOW + 5 * MINUTE).isoformat(),
            "--json", *extra, stdout=out,
        )  # fmt: skip
        code = 0
    except CommandError as exc:
        code = exc.returncode
    return code, json.loads(out.getvalue())


def test_all_present_exits_zero_and_reports_each_state(clock: FrozenClock) -> None:
    s = create(clock)
    run_minutes(clock, 6)
    occs = {o.scheduled_for: o for o in Occurrence.objects.filter(schedule=s)}
    for minute, state in enumerate(["SUCCEEDED", "DEAD", "CANCELED", "SKIPPED_OVERLAP", "RUNNING"]):
        Occurrence.objects.filter(id=occs[NOW + minute * MINUTE].id).update(state=state)
    code, report = run_reconcile()
    assert code == 0
    assert report["ok"] is True
    statuses = [i["status"] for i in report["expected"]]
    assert statuses == ["succeeded", "failed", "canceled", "skipped", "pending"]
    assert [i["scheduled_for"] for i in report["expected"]] == [
        (NOW + m * MINUTE).isoformat() for m in range(5)
    ]
    assert report["unexpected"] == []


def test_a_deleted_occurrence_is_absent_and_exits_non_zero(clock: FrozenClock) -> None:
    s = create(clock)
    run_minutes(clock, 6)
    gone = Occurrence.objects.get(schedule=s, scheduled_for=NOW + 2 * MINUTE)
    gone_id = gone.id
    gone.delete()
    code, report = run_reconcile()
    assert code == 1
    absent = [i for i in report["expected"] if i["status"] == "ABSENT"]
    assert [(i["scheduled_for"], i["occurrence_id"]) for i in absent] == [
        ((NOW + 2 * MINUTE).isoformat(), str(gone_id))
    ]
    assert report["counts"]["ABSENT"] == 1


def test_command_line_exit_status_and_table(
    clock: FrozenClock, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # run_from_argv closes every connection when done; that would drop the test database.
    monkeypatch.setattr(connections, "close_all", lambda: None)
    s = create(clock)
    run_minutes(clock, 6)
    argv = ["manage.py", "reconcile", "--from", "2026-03-01T12:00:00+00:00",
            "--to", "2026-03-01T12:05:00Z", "--schedule", str(s.id)]  # fmt: skip
    execute_from_command_line(argv)  # no SystemExit: all present
    assert "pending=5" in capsys.readouterr().out
    Occurrence.objects.filter(schedule=s, scheduled_for=NOW).delete()
    with pytest.raises(SystemExit) as exit_info:
        execute_from_command_line(argv)
    assert exit_info.value.code == 1
    captured = capsys.readouterr()
    assert "ABSENT" in captured.out
    assert "1 expected occurrence(s) ABSENT" in captured.err


def test_outage_shows_missed_and_skip_never_absent(clock: FrozenClock) -> None:
    create(clock, misfire_policy="SKIP", max_lateness=60)
    clock.advance(5 * MINUTE)  # the beat was down for five minutes
    materialize_due(clock=clock, horizon=timedelta(0))
    code, report = run_reconcile()
    assert code == 0
    assert [i["status"] for i in report["expected"]] == ["missed"] * 4 + ["pending"]


def test_paused_period_is_not_expected_and_new_version_is(clock: FrozenClock) -> None:
    s = create(clock)
    run_minutes(clock, 2)  # 12:00, 12:01 materialized; clock at 12:02
    api.pause_schedule(s.id, clock=clock)
    clock.advance(2 * MINUTE)  # 12:04
    api.resume_schedule(s.id, clock=clock)  # SKIP: resumes at 12:04 under version 3
    run_minutes(clock, 2)
    code, report = run_reconcile()
    assert code == 0
    got = [(i["scheduled_for"], i["version"]) for i in report["expected"]]
    assert got == [(NOW.isoformat(), 1), ((NOW + MINUTE).isoformat(), 1),
                   ((NOW + 4 * MINUTE).isoformat(), 3)]  # fmt: skip


def test_never_materialized_is_absent_but_future_is_upcoming(clock: FrozenClock) -> None:
    s = create(clock)
    result = reconcile(start=NOW, end=NOW + 5 * MINUTE, now=NOW + 2 * MINUTE, schedule_ids=[s.id])
    assert [i.status for i in result.expected] == ["ABSENT"] * 3 + ["upcoming"] * 2
    assert not result.ok


def test_unexpected_occurrences_are_listed_but_manual_ones_are_not(clock: FrozenClock) -> None:
    s = create(clock)
    run_minutes(clock, 1)
    api.run_now(s.id, clock=clock)
    Occurrence.objects.create(
        id="00000000-0000-0000-0000-000000000001", schedule=s, schedule_version=9,
        tenant=s.tenant, scheduled_for=NOW + MINUTE, available_at=NOW + MINUTE,
    )  # fmt: skip
    result = reconcile(start=NOW, end=NOW + 2 * MINUTE, now=NOW + 2 * MINUTE)
    assert [(i.version, i.status) for i in result.unexpected] == [(9, "unexpected")]
    assert result.counts["unexpected"] == 1
