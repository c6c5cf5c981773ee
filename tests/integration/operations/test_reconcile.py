"""The reconciler judges the occurrence table against schedule versions and time rules."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command, execute_from_command_line
from django.core.management.base import CommandError
from django.db import connections

from celery_scheduler import api
from celery_scheduler.core.clock import FrozenClock
from django_app.models import Occurrence, Schedule
from django_app.operations.reconcile import reconcile
from django_app.wiring import materialize_due

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
            "reconcile",
            "--from",
            NOW.isoformat(),
            "--to",
            (NOW + 5 * MINUTE).isoformat(),
            "--json",
            *extra,
            stdout=out,
        )
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


@pytest.mark.parametrize("policy", ["SKIP", "FIRE_ONCE", "CATCH_UP"])
def test_history_jumped_by_max_missed_per_pass_is_skipped_by_policy_not_absent(
    clock: FrozenClock, settings: Any, policy: str
) -> None:
    # A long outage: more late fire times than max_missed_per_pass. The policy jumps over the
    # oldest ones on purpose (no row each); that is not a lost occurrence.
    settings.CELERY_SCHEDULER = {"max_missed_per_pass": 2}
    create(clock, misfire_policy=policy, max_lateness=60, catchup_cap=1)
    clock.advance(10 * MINUTE)  # down from 12:00 to 12:10
    materialize_due(clock=clock, horizon=timedelta(0))
    out = StringIO()
    call_command(
        "reconcile",
        "--from",
        NOW.isoformat(),
        "--to",
        (NOW + 11 * MINUTE).isoformat(),
        "--json",
        stdout=out,
    )  # fmt: skip  (no CommandError: exit status 0)
    report = json.loads(out.getvalue())
    statuses = [i["status"] for i in report["expected"]]
    assert "ABSENT" not in statuses
    assert report["ok"] is True
    jumped = statuses.count("skipped_by_policy")
    assert jumped >= 1
    assert statuses[:jumped] == ["skipped_by_policy"] * jumped  # the oldest ones
    assert report["counts"]["skipped_by_policy"] == jumped
    assert statuses[-1] == "pending"  # 12:10, on time


def test_a_span_an_update_jumped_over_is_skipped_by_policy_not_absent(
    clock: FrozenClock, settings: Any
) -> None:
    """After a long outage an update re-plans the span itself; more late times than
    max_missed_per_pass are jumped over, and the materializer records that span for the
    reconciler, but the update's re-plan did not: every jumped time was ABSENT (exit 1)."""
    settings.CELERY_SCHEDULER = {"max_missed_per_pass": 2}
    schedule = create(clock, max_lateness=60)
    materialize_due(clock=clock, horizon=timedelta(0))  # 12:00 planned, then the beat is down
    clock.advance(10 * MINUTE)
    api.update_schedule(schedule.id, misfire_policy="FIRE_ONCE", clock=clock)
    materialize_due(clock=clock, horizon=timedelta(0))
    result = reconcile(start=NOW, end=NOW + 10 * MINUTE, now=clock.now())
    statuses = [item.status for item in result.expected]
    assert "ABSENT" not in statuses, statuses
    assert "skipped_by_policy" in statuses


def test_dst_gap_is_not_absent() -> None:
    # Europe/Berlin springs forward at 2026-03-29 01:00 UTC (02:00 local does not exist).
    night = datetime(2026, 3, 28, 23, 0, tzinfo=UTC)
    clock = FrozenClock(night)
    create(clock, cron="*/30 2 * * *", timezone="Europe/Berlin")
    create(clock, cron="0 * * * *", timezone="Europe/Berlin", name="hourly")
    for _ in range(8):
        materialize_due(clock=clock, horizon=timedelta(0))
        clock.advance(30 * MINUTE)
    result = reconcile(start=night, end=clock.now(), now=clock.now())
    assert result.absent == []
    assert result.counts.get("pending", 0) == len(result.expected) > 0


def test_chunked_streaming_matches_and_queries_per_chunk(clock: FrozenClock) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_app.operations.reconcile import iter_reconcile

    schedules = [create(clock, name=f"s{i}") for i in range(5)]
    run_minutes(clock, 3)
    api.update_schedule(schedules[0].id, cron="*/2 * * * *", clock=clock)
    run_minutes(clock, 3)
    Occurrence.objects.filter(schedule=schedules[3], scheduled_for=NOW + MINUTE).delete()
    whole = reconcile(start=NOW, end=NOW + 6 * MINUTE, now=clock.now())
    with CaptureQueriesContext(connection) as queries:
        items = list(iter_reconcile(start=NOW, end=NOW + 6 * MINUTE, now=clock.now(),
                                    chunk_size=2))  # fmt: skip
    table = connection.ops.quote_name("django_app_occurrence")
    occurrence_reads = [q for q in queries if f"FROM {table}" in q["sql"]]
    assert len(occurrence_reads) == 3  # 5 schedules in chunks of 2: one read per chunk
    key = lambda i: (str(i.schedule_id), i.version, i.scheduled_for, i.status)  # noqa: E731
    assert sorted(map(key, items)) == sorted(map(key, whole.expected + whole.unexpected))
    assert [i.status for i in items].count("ABSENT") == 1


def test_window_read_uses_the_schedule_time_index(clock: FrozenClock) -> None:
    from django.db import connection

    from django_app.operations.reconcile import occurrence_window

    # A table the size of a real history, analysed: on a near-empty one the planner may
    # pick any index (every plan costs the same), which says nothing about production.
    schedules = [create(clock, name=f"s{i}") for i in range(10)]
    Occurrence.objects.bulk_create(
        Occurrence(
            id=uuid.uuid4(),
            schedule=s,
            schedule_version=1,
            tenant=s.tenant,
            scheduled_for=NOW + k * MINUTE,
            available_at=NOW + k * MINUTE,
            state="SUCCEEDED",
        )
        for s in schedules
        for k in range(-200, 200)
    )
    table = connection.ops.quote_name(Occurrence._meta.db_table)
    # Not on MySQL/MariaDB: ANALYZE TABLE commits implicitly there (the test's rows would
    # outlive its transaction); InnoDB refreshes its statistics after such an insert itself.
    if connection.vendor != "mysql":
        with connection.cursor() as cur:
            cur.execute(f"ANALYZE {table}")
    qs = occurrence_window([schedules[0].id], NOW, NOW + MINUTE)
    plan = qs.explain()
    assert "occurrence_schedule_time" in plan, plan
    assert connection.vendor in {"sqlite", "postgresql", "mysql"}


def test_streamed_json_is_one_document_even_when_empty_or_unexpected_only(
    clock: FrozenClock,
) -> None:
    code, report = run_reconcile()
    assert (code, report["ok"], report["expected"], report["unexpected"]) == (0, True, [], [])
    s = create(clock)
    Occurrence.objects.create(
        id="00000000-0000-0000-0000-000000000002", schedule=s, schedule_version=7,
        tenant=s.tenant, scheduled_for=NOW, available_at=NOW,
    )  # fmt: skip
    code, report = run_reconcile("--schedule", str(s.id))
    assert [i["version"] for i in report["unexpected"]] == [7]
    assert report["counts"]["unexpected"] == 1


@pytest.mark.parametrize(
    ("start", "end", "message"),
    [
        ("0001-01-01T00:00Z", "0001-01-02T00:00Z", "out of range"),
        ("0001-01-01T00:00+01:00", "2026-01-01T00:00Z", "out of range"),
        ("2026-01-01T00:00Z", "9999-12-31T23:59Z", "out of range"),
        ("9999-12-31T00:00Z", "9999-12-31T23:59:59Z", "out of range"),
        ("2026-03-01T12:05Z", "2026-03-01T12:00Z", "must be after"),
        ("2026-03-01T12:00Z", "2026-03-01T12:00Z", "must be after"),
        ("yesterday", "2026-03-01T12:00Z", "not an ISO 8601 time"),
        ("2026-03-01T12:00", "2026-03-02T12:00Z", "has no UTC offset"),
    ],
)
def test_bad_windows_are_a_clear_usage_error_never_a_traceback(
    clock: FrozenClock, start: str, end: str, message: str
) -> None:
    create(clock)
    with pytest.raises(CommandError, match=message) as caught:
        call_command("reconcile", "--from", start, "--to", end, stdout=StringIO())
    assert caught.value.returncode == 2


def test_a_window_above_the_maximum_is_refused_with_how_to_split_it(clock: FrozenClock) -> None:
    create(clock)
    with pytest.raises(CommandError) as caught:
        call_command("reconcile", "--from", "2000-01-01T00:00Z", "--to", "2100-01-01T00:00Z",
                     stdout=StringIO())  # fmt: skip
    text = str(caught.value)
    assert caught.value.returncode == 2
    assert "36525 days" in text
    assert "at most 31" in text
    # How to split it: the first windows to run, and the switch that lifts the bound.
    assert "--from 2000-01-01T00:00:00+00:00 --to 2000-02-01T00:00:00+00:00" in text
    assert "--from 2000-02-01T00:00:00+00:00 --to 2000-03-03T00:00:00+00:00" in text
    assert "--max-days" in text
    out = StringIO()
    call_command("reconcile", "--from", "2000-01-01T00:00Z", "--to", "2000-03-01T00:00Z",
                 "--max-days", "60", "--json", stdout=out)  # fmt: skip
    assert json.loads(out.getvalue())["ok"] is True  # nothing expected before the schedule


def test_a_max_days_past_what_a_timedelta_holds_is_a_usage_error() -> None:
    """It raised OverflowError (a traceback) building the window's bound."""
    with pytest.raises(CommandError, match="--max-days must be from 1 to") as caught:
        call_command("reconcile", "--from", "2000-01-01T00:00Z", "--to", "2000-01-02T00:00Z",
                     "--max-days", "1000000000", stdout=StringIO())  # fmt: skip
    assert caught.value.returncode == 2


def test_progress_and_an_estimate_go_to_stderr(clock: FrozenClock) -> None:
    for i in range(3):
        create(clock, name=f"p{i}")
    run_minutes(clock, 6)
    out, err = StringIO(), StringIO()
    call_command("reconcile", "--from", NOW.isoformat(), "--to", (NOW + 5 * MINUTE).isoformat(),
                 "--json", "--progress-every", "0", stdout=out, stderr=err)  # fmt: skip
    assert json.loads(out.getvalue())["counts"]["pending"] == 15  # stdout stays one document
    lines = err.getvalue().splitlines()
    assert lines[0].startswith("reconcile: 3 schedule(s) over 0.0 day(s)"), lines
    assert any("3/3 schedules (100%)" in x and "15 judged" in x and "left" in x for x in lines)


def test_a_database_failure_is_not_read_as_absent(
    clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It escaped as a traceback with Python's exit status 1, which the command documents as
    "something is ABSENT": a cron job reported lost occurrences while the database was down."""
    from django.db import OperationalError

    from django_app.management.commands import reconcile as command

    def down(*args: Any, **kwargs: Any) -> int:
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(command, "count_schedules", down)
    with pytest.raises(CommandError, match="nothing was decided") as caught:
        call_command("reconcile", "--from", NOW.isoformat(), "--to",
                     (NOW + MINUTE).isoformat(), stdout=StringIO())  # fmt: skip
    assert caught.value.returncode == 3
