"""Static ``beat_schedule`` entries -> schedules: conversions, refusals, idempotency."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from celery.schedules import crontab, schedule, solar
from django.db import connection

from celery_scheduler import api, errors
from django_app.models import AuditEntry, Schedule
from django_app.schedules import beat_schedule


def a_solar(event: str, lat: float, lon: float) -> solar:
    """A solar schedule without the optional ``ephem`` package its constructor imports."""
    value = solar.__new__(solar)
    value.event, value.lat, value.lon = event, lat, lon  # type: ignore[assignment]
    return value


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (crontab(), {"cron": "* * * * *", "timezone": "Asia/Kolkata"}),
        (crontab(minute=0, hour=4), {"cron": "0 4 * * *", "timezone": "Asia/Kolkata"}),
        (
            crontab(minute="*/5", hour="9-17", day_of_week="mon-fri"),
            {"cron": "*/5 9-17 * * mon-fri", "timezone": "Asia/Kolkata"},
        ),
        # Ranges that wrap (Celery reads them, cron does not): the values, listed.
        (
            crontab(minute=0, hour="22-2", day_of_week="sat-mon"),
            {"cron": "0 0,1,2,22,23 * * 0,1,6", "timezone": "Asia/Kolkata"},
        ),
        (crontab(minute=[30, 0]), {"cron": "0,30 * * * *", "timezone": "Asia/Kolkata"}),
        (timedelta(minutes=2), {"interval": 120}),
        (30, {"interval": 30}),
        (45.0, {"interval": 45}),
        (schedule(run_every=timedelta(hours=1)), {"interval": 3600}),
    ],
)
def test_conversions(value: Any, expected: dict[str, Any]) -> None:
    assert beat_schedule.schedule_fields("e", value, timezone="Asia/Kolkata") == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (a_solar("sunrise", 52.5, 13.4), "solar schedule .* not support"),
        (0.5, "not a whole number of seconds >= 1"),
        (timedelta(seconds=1.5), "not a whole number"),
        ("every day", "schedule type str is not supported"),
        # "The first Monday": Celery runs on days matching both fields, cron on either.
        (
            crontab(minute=0, hour=0, day_of_week="mon", day_of_month="1-7"),
            "restricts both day_of_month and day_of_week",
        ),
    ],
)
def test_unsupported_schedules_are_refused_clearly(value: Any, message: str) -> None:
    with pytest.raises(errors.UnsupportedSchedule, match=message):
        beat_schedule.schedule_fields("e", value, timezone="UTC")


def test_a_converted_crontab_fires_where_celery_runs_it() -> None:
    """Each conversion against Celery's own reading of the crontab, over a year of minutes
    checked day by day: the same days, hours and minutes (in the schedule's zone)."""
    from datetime import UTC, datetime

    from celery_scheduler.core.timemath import CronTrigger

    value: Any
    for value in (
        crontab(minute="*/20", hour="22-2"),
        crontab(minute=15, hour=3, day_of_week="sat-mon"),
        crontab(minute=0, hour=9, day_of_month="1,15", month_of_year="*/3"),
        crontab(minute=0, hour=9, day_of_month="1-31", day_of_week="mon"),  # Mondays
        crontab(minute=0, hour=9, day_of_month="*/2", day_of_week="mon"),  # both, "*/2" too
    ):
        cron = beat_schedule.schedule_fields("e", value, timezone="UTC")["cron"]
        fired = CronTrigger(expression=cron, timezone="UTC").next_after
        at: datetime | None = datetime(2026, 1, 1, tzinfo=UTC)
        for _ in range(200):
            assert at is not None
            at = fired(at)
            assert at is not None
            assert at.minute in value.minute, (cron, at)
            assert at.hour in value.hour, (cron, at)
            assert at.day in value.day_of_month, (cron, at)
            assert at.month in value.month_of_year, (cron, at)
            assert (at.weekday() + 1) % 7 in value.day_of_week, (cron, at)


@pytest.mark.django_db
def test_an_entry_with_nested_tuples_is_unchanged_by_a_second_sync() -> None:
    """args/kwargs read back from JSON with lists where the entry has tuples: every sync
    (every beat's start) saw a change and made a new version."""
    entries = {
        "pairs": {"task": "billing.ping", "schedule": timedelta(minutes=5),
                  "args": ((1, 2), [3, (4,)]), "kwargs": {"span": (0, 9)}},
    }  # fmt: skip
    assert beat_schedule.sync_beat_schedule(entries).created == ["pairs"]
    assert beat_schedule.sync_beat_schedule(entries).unchanged == ["pairs"]
    assert Schedule.objects.get(name="pairs").version == 1


@pytest.mark.django_db
def test_sync_reports_each_entry_and_a_bad_one_does_not_stop_the_rest() -> None:
    config: dict[str, dict[str, Any]] = {
        "good": {"task": "billing.ping", "schedule": 60},
        "sunny": {"task": "billing.ping", "schedule": a_solar("sunset", 0, 0)},
        "typo": {"task": "billing.pnig", "schedule": 60},
        "no-task": {"schedule": 60},
    }
    report = beat_schedule.sync_beat_schedule(config, timezone="UTC")
    assert report.created == ["good"]
    assert set(report.failed) == {"sunny", "typo", "no-task"}
    assert "solar" in report.failed["sunny"]
    assert "billing.ping" in report.failed["typo"]  # the "did you mean" hint
    assert "task" in report.failed["no-task"]
    assert list(Schedule.objects.values_list("idempotency_key", flat=True)) == ["beat:good"]


@pytest.mark.django_db
def test_changes_update_once_removed_entries_are_reported_canceled_stay_canceled() -> None:
    config: dict[str, dict[str, Any]] = {
        "a": {"task": "billing.ping", "schedule": 60, "kwargs": {"message": "1"}},
        "b": {"task": "billing.ping", "schedule": crontab(minute=0)},
    }
    assert beat_schedule.sync_beat_schedule(config).created == ["a", "b"]
    assert beat_schedule.sync_beat_schedule(config).unchanged == ["a", "b"]

    config["a"]["kwargs"] = {"message": "2"}
    config["b"]["schedule"] = crontab(minute=30)
    report = beat_schedule.sync_beat_schedule(config, timezone="America/New_York")
    assert report.updated == ["a", "b"]
    a = Schedule.objects.get(idempotency_key="beat:a")
    b = Schedule.objects.get(idempotency_key="beat:b")
    assert (a.kwargs, a.version, a.interval_seconds) == ({"message": "2"}, 2, 60)
    assert (b.cron, b.timezone, b.version) == ("30 * * * *", "America/New_York", 2)
    # Audited like any change, naming the sync (it wrote no entry before).
    trail = AuditEntry.objects.filter(schedule_id=a.id).order_by("id")
    assert list(trail.values_list("action", "actor")) == [
        ("create", "beat_schedule"), ("update", "beat_schedule"),
    ]  # fmt: skip
    assert beat_schedule.sync_beat_schedule(config, timezone="America/New_York").unchanged == [
        "a", "b",
    ]  # fmt: skip

    api.cancel_schedule(b.id)
    del config["a"]
    report = beat_schedule.sync_beat_schedule(config, timezone="America/New_York")
    assert report.orphaned == ["a"]
    assert report.unchanged == ["b"]
    b.refresh_from_db()
    assert b.state == "CANCELED"
    assert Schedule.objects.get(idempotency_key="beat:a").state == "ACTIVE"


@pytest.mark.concurrent_db
@pytest.mark.django_db(transaction=True)
def test_beats_syncing_at_once_create_and_update_each_schedule_once() -> None:
    def sync_all(config: dict[str, dict[str, Any]]) -> list[BaseException]:
        failures: list[BaseException] = []
        start = threading.Barrier(3)

        def one() -> None:
            try:
                start.wait()
                beat_schedule.sync_beat_schedule(config)
            except BaseException as exc:
                failures.append(exc)
            finally:
                connection.close()

        threads = [threading.Thread(target=one) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        return failures

    config: dict[str, dict[str, Any]] = {
        f"e{i}": {"task": "billing.ping", "schedule": 60 + i} for i in range(10)
    }
    assert sync_all(config) == []
    assert Schedule.objects.count() == 10
    for entry in config.values():
        entry["schedule"] += 1
    assert sync_all(config) == []
    assert set(Schedule.objects.values_list("version", flat=True)) == {2}


@pytest.mark.django_db
def test_entry_options_a_schedule_does_not_carry_are_named_not_dropped_silently(
    caplog: pytest.LogCaptureFixture,
) -> None:
    entries = {
        "fresh": {"task": "billing.ping", "schedule": 60,
                  "options": {"queue": "q", "expires": 10, "routing_key": "x"}},
    }  # fmt: skip
    with caplog.at_level("WARNING", logger="django_app.schedules.beat_schedule"):
        assert beat_schedule.sync_beat_schedule(entries).created == ["fresh"]
    warned = [r.getMessage() for r in caplog.records if "not carried over" in r.getMessage()]
    assert len(warned) == 1
    assert "expires, routing_key" in warned[0]
    assert Schedule.objects.get(name="fresh").queue == "q"
