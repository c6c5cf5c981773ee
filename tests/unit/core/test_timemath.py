"""Named tests for the time contract: both DST transitions in several zones, cron syntax,
validation messages, intervals, one-offs and preview notes. Literal instants throughout."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter

from celery_scheduler import errors
from celery_scheduler.core import timemath
from celery_scheduler.core.timemath import CronTrigger, IntervalTrigger, OneOffTrigger


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def runs_on(trigger: CronTrigger, day: date) -> list[datetime]:
    """Local fire times whose local date is ``day``."""
    zone = trigger.zone
    start = datetime.combine(day - timedelta(days=2), datetime.min.time(), zone)
    end = datetime.combine(day + timedelta(days=2), datetime.min.time(), zone)
    local = [t.astimezone(zone) for t in timemath.fire_times(trigger, start, until=end)]
    return [t for t in local if t.date() == day]


@dataclass(frozen=True)
class Zone:
    name: str
    spring: date  # the day clocks move forward
    fall: date  # the day clocks move back
    gap_cron: str  # a daily time inside the spring-forward gap
    repeated_cron: str  # a daily time inside the repeated fall-back band
    summer_offset: timedelta
    shift: timedelta


ZONES = [
    Zone(
        "Europe/Berlin",
        date(2026, 3, 29),
        date(2026, 10, 25),
        "30 2 * * *",
        "30 2 * * *",
        timedelta(hours=2),
        timedelta(hours=1),
    ),
    Zone(
        "America/New_York",
        date(2026, 3, 8),
        date(2026, 11, 1),
        "30 2 * * *",
        "30 1 * * *",
        timedelta(hours=-4),
        timedelta(hours=1),
    ),
    # Lord Howe moves by 30 minutes: the gap is 02:00-02:29, the repeated band 01:30-01:59.
    Zone(
        "Australia/Lord_Howe",
        date(2026, 10, 4),
        date(2026, 4, 5),
        "15 2 * * *",
        "45 1 * * *",
        timedelta(hours=11),
        timedelta(minutes=30),
    ),
]
IDS = [z.name for z in ZONES]


@pytest.mark.parametrize("zone", ZONES, ids=IDS)
def test_spring_forward_skips_nonexistent_daily_time(zone: Zone) -> None:
    trigger = CronTrigger(expression=zone.gap_cron, timezone=zone.name)
    assert runs_on(trigger, zone.spring) == []
    before = runs_on(trigger, zone.spring - timedelta(days=1))
    after = runs_on(trigger, zone.spring + timedelta(days=1))
    assert len(before) == len(after) == 1
    assert before[0].time() == after[0].time()


@pytest.mark.parametrize("zone", ZONES, ids=IDS)
def test_fall_back_repeated_daily_time_runs_once_at_first_instant(zone: Zone) -> None:
    trigger = CronTrigger(expression=zone.repeated_cron, timezone=zone.name)
    [run] = runs_on(trigger, zone.fall)
    assert run.utcoffset() == zone.summer_offset  # the first pass, before clocks move back
    assert run.fold == 0
    second_pass = run.astimezone(UTC) + zone.shift
    assert second_pass.astimezone(ZoneInfo(zone.name)).replace(tzinfo=None) == run.replace(
        tzinfo=None
    )
    following = trigger.next_after(run)
    assert following is not None
    assert following > second_pass


@pytest.mark.parametrize("zone", ZONES, ids=IDS)
def test_daily_job_keeps_wall_clock_time_across_both_transitions(zone: Zone) -> None:
    trigger = CronTrigger(expression="0 9 * * *", timezone=zone.name)
    zi = trigger.zone
    fires = list(
        timemath.fire_times(
            trigger, datetime(2026, 1, 1, tzinfo=zi), until=datetime(2027, 1, 1, tzinfo=zi)
        )
    )
    assert len(fires) == 365
    assert {f.astimezone(trigger.zone).strftime("%H:%M") for f in fires} == {"09:00"}
    gaps = {b - a for a, b in itertools.pairwise(fires)}
    day = timedelta(days=1)
    assert gaps == {day, day - zone.shift, day + zone.shift}  # 23/25 h (Lord Howe 23.5/24.5)


@pytest.mark.parametrize("zone", ZONES, ids=IDS)
def test_hourly_counts_on_transition_days(zone: Zone) -> None:
    hourly = CronTrigger(expression="0 * * * *", timezone=zone.name)
    # Spring: the wall hour inside the gap does not exist (Lord Howe: 02:00 is in 02:00-02:29).
    assert len(runs_on(hourly, zone.spring)) == 23
    # Fall: a 25-hour (24.5) day, but each distinct wall time runs once: 24 runs.
    fall = runs_on(hourly, zone.fall)
    assert len(fall) == 24
    assert len({r.replace(tzinfo=None) for r in fall}) == 24
    assert len(runs_on(hourly, zone.spring + timedelta(days=7))) == 24


def test_lord_howe_half_hour_steps_across_half_hour_shift() -> None:
    trigger = CronTrigger(expression="*/30 * * * *", timezone="Australia/Lord_Howe")
    spring = runs_on(trigger, date(2026, 10, 4))
    assert len(spring) == 47  # only 02:00 falls in the 30-minute gap
    assert "02:00" not in {r.strftime("%H:%M") for r in spring}
    assert "02:30" in {r.strftime("%H:%M") for r in spring}
    assert len(runs_on(trigger, date(2026, 4, 5))) == 48  # 01:30 repeats, runs once


def test_minutely_counts_new_york() -> None:
    trigger = CronTrigger(expression="* * * * *", timezone="America/New_York")
    assert len(runs_on(trigger, date(2026, 3, 8))) == 23 * 60
    assert len(runs_on(trigger, date(2026, 11, 1))) == 24 * 60


@pytest.mark.parametrize("name", ["Asia/Tokyo", "UTC", "Asia/Kolkata"])
def test_zone_without_dst_is_plain_arithmetic(name: str) -> None:
    daily = CronTrigger(expression="0 9 * * *", timezone=name)
    fires = list(timemath.fire_times(daily, utc(2026, 1, 1), limit=400))
    assert {b - a for a, b in itertools.pairwise(fires)} == {timedelta(days=1)}
    hourly = CronTrigger(expression="0 * * * *", timezone=name)
    for day in (date(2026, 3, 29), date(2026, 10, 25), date(2026, 3, 8), date(2026, 11, 1)):
        assert len(runs_on(hourly, day)) == 24
    rows = timemath.preview(daily, start=utc(2026, 3, 1), count=300)
    assert all(row.note == "" for row in rows)


def test_tokyo_daily_is_fixed_utc_time() -> None:
    trigger = CronTrigger(expression="0 9 * * *", timezone="Asia/Tokyo")
    assert trigger.next_after(utc(2026, 3, 29)) == utc(2026, 3, 30, 0)


def test_after_inside_second_pass_of_fall_back() -> None:
    trigger = CronTrigger(expression="*/10 * * * *", timezone="Europe/Berlin")
    # 01:15 UTC is 02:15 CET, the second pass; 02:20 CEST (00:20 UTC) already ran.
    assert trigger.next_after(utc(2026, 10, 25, 1, 15)) == utc(2026, 10, 25, 2, 0)
    assert trigger.next_after(utc(2026, 10, 25, 0, 15)) == utc(2026, 10, 25, 0, 20)


def test_next_after_is_strict_and_first_at_or_after_inclusive() -> None:
    trigger = CronTrigger(expression="0 12 * * *", timezone="Europe/Berlin")
    noon = utc(2026, 6, 1, 10)
    assert trigger.first_at_or_after(noon) == noon
    assert trigger.next_after(noon) == utc(2026, 6, 2, 10)
    assert trigger.next_after(noon - timedelta(microseconds=1)) == noon
    assert trigger.first_at_or_after(noon + timedelta(seconds=1)) == utc(2026, 6, 2, 10)


def test_returned_instants_are_aware_utc_even_for_non_utc_input() -> None:
    trigger = CronTrigger(expression="0 12 * * *", timezone="Asia/Kolkata")
    start = datetime(2026, 6, 1, 8, tzinfo=ZoneInfo("America/New_York"))
    result = trigger.next_after(start)
    assert result is not None
    assert result.tzinfo is UTC
    assert result == utc(2026, 6, 2, 6, 30)


# --- cron syntax ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("macro", "expansion"),
    [
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@hourly", "0 * * * *"),
        ("@DAILY", "0 0 * * *"),
    ],
)
def test_macros_equal_their_expansion(macro: str, expansion: str) -> None:
    start = utc(2026, 1, 15, 7, 30)
    a = CronTrigger(expression=macro, timezone="Europe/Berlin")
    b = CronTrigger(expression=expansion, timezone="Europe/Berlin")
    assert list(timemath.fire_times(a, start, limit=20)) == list(
        timemath.fire_times(b, start, limit=20)
    )


@pytest.mark.parametrize(
    "expression",
    [
        "*/15 9-17 * * mon-fri",
        "5/20 */3 * * *",
        "0 0 1,15 jan-mar,oct *",
        "30 4 * * SUN",
        "0 0 * * 5-7",
        "0 22 * * 1-5",
        "7 7 7 7 *",
        "1-59/7 0-23/5 */2 * *",
        "0 12 * * 0,3",
    ],
)
def test_agrees_with_croniter_in_utc_when_day_semantics_agree(expression: str) -> None:
    trigger = CronTrigger(expression=expression)
    start = utc(2026, 2, 3, 4, 5)
    ours = list(timemath.fire_times(trigger, start, limit=60))
    it = croniter(expression, start)
    theirs = [it.get_next(datetime) for _ in range(60)]
    assert ours == theirs


def test_sunday_is_zero_or_seven_and_mon_sun_range() -> None:
    start = utc(2026, 5, 1)
    sundays = list(timemath.fire_times(CronTrigger(expression="0 0 * * 7"), start, limit=5))
    assert all(f.weekday() == 6 for f in sundays)
    every_day = CronTrigger(expression="0 0 * * mon-sun")
    assert len(list(timemath.fire_times(every_day, start, until=utc(2026, 5, 8)))) == 7


def test_degenerate_range_and_open_ended_steps() -> None:
    start = utc(2026, 5, 4)  # a Monday
    five = list(timemath.fire_times(CronTrigger(expression="5-5 * * * *"), start, limit=3))
    assert {f.minute for f in five} == {5}  # croniter would read "5-5" as "*"
    odd_days = CronTrigger(expression="0 0 * * 1/2")  # Mon, Wed, Fri: the week ends Saturday
    days = [f.strftime("%a") for f in timemath.fire_times(odd_days, start, limit=4)]
    assert days == ["Wed", "Fri", "Mon", "Wed"]
    sunday_steps = CronTrigger(expression="0 0 * * 7/3")  # 7 is Sunday: Sun, Wed, Sat
    days = [f.strftime("%a") for f in timemath.fire_times(sunday_steps, start, limit=3)]
    assert days == ["Wed", "Sat", "Sun"]
    assert {
        f.minute
        for f in timemath.fire_times(CronTrigger(expression="50/5 * * * *"), start, limit=6)
    } == {50, 55}


def test_vixie_day_of_month_or_day_of_week() -> None:
    # Both restricted: either matches (13th of the month OR any Friday).
    either = CronTrigger(expression="0 0 13 * 5")
    days = [f.date() for f in timemath.fire_times(either, utc(2026, 2, 1), until=utc(2026, 3, 1))]
    assert days == [date(2026, 2, d) for d in (6, 13, 20, 27)]
    days = [f.date() for f in timemath.fire_times(either, utc(2026, 3, 1), until=utc(2026, 4, 1))]
    assert days == [date(2026, 3, d) for d in (6, 13, 20, 27)]
    days = [f.date() for f in timemath.fire_times(either, utc(2026, 4, 1), until=utc(2026, 4, 30))]
    assert days == [date(2026, 4, d) for d in (3, 10, 13, 17, 24)]
    # A day field starting with '*' counts as unrestricted in Vixie cron: both must match.
    both = CronTrigger(expression="0 0 */2 * 5")
    fires = list(timemath.fire_times(both, utc(2026, 1, 1), limit=20))
    assert all(f.weekday() == 4 and f.day % 2 == 1 for f in fires)


def test_rare_expressions_fire_without_scanning_forever() -> None:
    leap = CronTrigger(expression="0 0 29 2 *")
    assert list(timemath.fire_times(leap, utc(2026, 1, 1), limit=3)) == [
        utc(2028, 2, 29),
        utc(2032, 2, 29),
        utc(2036, 2, 29),
    ]
    feb_first_monday = CronTrigger(expression="0 0 */31 2 1")  # AND: Feb 1 on a Monday
    assert feb_first_monday.next_after(utc(2027, 2, 2)) == utc(2038, 2, 1)
    assert CronTrigger(expression="0 0 30 2 1").next_after(utc(2026, 1, 1)) == utc(2026, 2, 2)


@pytest.mark.parametrize(
    ("expression", "needle"),
    [
        ("", "empty"),
        ("* * * *", "4 fields"),
        ("0 0 * * * *", "seconds or year"),
        ("0 0 1 1 * 2027 x", "7 fields"),
        ("@reboot", "@reboot"),
        ("@every5m", "Unknown cron macro"),
        ("60 * * * *", "minute field '60'"),
        ("0 24 * * *", "hour field '24'"),
        ("0 0 0 * *", "day-of-month field '0'"),
        ("0 0 1 13 *", "month field '13'"),
        ("0 0 * * 8", "day-of-week field '8'"),
        ("0 0 * foo *", "month field 'foo'"),
        ("0 0 * * funday", "day-of-week field 'funday'"),
        ("*/0 * * * *", "step '0'"),
        ("30-10 * * * *", "runs backwards"),
        ("0 0 L * *", "day-of-month field 'L'"),
        ("0 0 * * 5#2", "day-of-week field '5#2'"),
        ("H * * * *", "minute field 'H'"),
        ("1,,2 * * * *", "minute field '1,,2'"),
        ("0 0 * * 1-", "day-of-week field '1-'"),
        ("0 0 * * -1", "day-of-week field '-1'"),
        ("0 0 * * 1/", "step ''"),
    ],
)
def test_invalid_expressions_name_the_problem(expression: str, needle: str) -> None:
    with pytest.raises(errors.InvalidCronExpression) as info:
        CronTrigger(expression=expression)
    assert needle in str(info.value)
    assert not isinstance(info.value, errors.CronNeverFires)
    assert info.value.field == "cron"


@pytest.mark.parametrize(
    "expression", ["0 0 30 2 *", "0 0 31 4 *", "0 0 31 2,4,6,9,11 *", "0 0 30,31 feb *"]
)
def test_expression_that_never_fires_is_rejected_at_construction(expression: str) -> None:
    started = time.perf_counter()
    with pytest.raises(errors.CronNeverFires, match="never fires"):
        CronTrigger(expression=expression)
    assert time.perf_counter() - started < 0.5


def test_unknown_time_zone_suggests_close_match() -> None:
    with pytest.raises(errors.UnknownTimeZone) as info:
        CronTrigger(expression="0 9 * * *", timezone="Europe/Berln")
    assert str(info.value) == "Unknown time zone 'Europe/Berln'. Use an IANA name such as " + (
        "'Europe/Berlin'."
    )
    with pytest.raises(errors.UnknownTimeZone, match="'America/New_York'"):
        timemath.parse_timezone("america/new_york")
    for bad in ("", "Not/AZone", "../etc/passwd", " UTC"):
        with pytest.raises(errors.UnknownTimeZone, match="Use an IANA name"):
            timemath.parse_timezone(bad)
    assert timemath.parse_timezone("Pacific/Chatham") == ZoneInfo("Pacific/Chatham")


def test_triggers_are_frozen_values() -> None:
    a = CronTrigger(expression="0 9 * * *", timezone="Europe/Berlin")
    assert a == CronTrigger(expression="0 9 * * *", timezone="Europe/Berlin")
    assert hash(a) == hash(CronTrigger(expression="0 9 * * *", timezone="Europe/Berlin"))
    with pytest.raises(AttributeError):
        a.expression = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        CronTrigger("0 9 * * *")  # type: ignore[call-arg]


def test_naive_datetimes_are_rejected() -> None:
    naive = datetime(2026, 1, 1)
    cron = CronTrigger(expression="0 9 * * *")
    for call in (cron.next_after, cron.first_at_or_after):
        with pytest.raises(errors.ValidationError, match="timezone-aware"):
            call(naive)
    with pytest.raises(ValueError, match="anchor must be timezone-aware"):
        IntervalTrigger(every=timedelta(minutes=5), anchor=naive)
    with pytest.raises(ValueError, match="run_at must be timezone-aware"):
        OneOffTrigger(run_at=naive)
    with pytest.raises(ValueError, match="start must be timezone-aware"):
        timemath.preview(cron, start=naive)
    with pytest.raises(ValueError, match="until must be timezone-aware"):
        list(timemath.fire_times(cron, utc(2026, 1, 1), until=naive))


# --- intervals and one-offs -----------------------------------------------------------------


def test_interval_uses_elapsed_time_across_dst() -> None:
    berlin = ZoneInfo("Europe/Berlin")
    anchor = datetime(2026, 3, 28, 9, 0, tzinfo=berlin)
    trigger = IntervalTrigger(every=timedelta(hours=24), anchor=anchor)
    assert trigger.anchor.tzinfo is UTC
    fires = list(timemath.fire_times(trigger, anchor, limit=3))
    # (Aware arithmetic on a zoneinfo datetime is wall-clock arithmetic, so compute in UTC.)
    assert fires == [utc(2026, 3, 28, 8) + timedelta(hours=24 * k) for k in (1, 2, 3)]
    # 24 h of elapsed time after 09:00 CET is 10:00 CEST: the wall clock moves, the rate not.
    assert [f.astimezone(berlin).hour for f in fires] == [10, 10, 10]


def test_interval_next_after_and_first_at_or_after() -> None:
    anchor = utc(2026, 1, 1, 0, 0, 7)
    trigger = IntervalTrigger(every=timedelta(minutes=15), anchor=anchor)
    assert trigger.next_after(utc(2025, 1, 1)) == anchor
    assert trigger.first_at_or_after(utc(2025, 1, 1)) == anchor
    assert trigger.next_after(anchor) == anchor + timedelta(minutes=15)
    assert trigger.first_at_or_after(anchor) == anchor
    assert trigger.first_at_or_after(anchor + timedelta(microseconds=1)) == anchor + timedelta(
        minutes=15
    )
    later = anchor + timedelta(days=400, minutes=31)
    assert trigger.next_after(later) == anchor + timedelta(days=400, minutes=45)
    assert trigger.first_at_or_after(anchor + timedelta(days=400, minutes=30)) == (
        anchor + timedelta(days=400, minutes=30)
    )


@pytest.mark.parametrize("every", [timedelta(0), timedelta(seconds=-5), timedelta(milliseconds=1)])
def test_interval_must_be_at_least_a_second(every: timedelta) -> None:
    with pytest.raises(errors.InvalidTiming, match="at least 1 second"):
        IntervalTrigger(every=every, anchor=utc(2026, 1, 1))


def test_one_off() -> None:
    at = utc(2026, 7, 1, 12)
    trigger = OneOffTrigger(run_at=at)
    assert trigger.next_after(at - timedelta(seconds=1)) == at
    assert trigger.next_after(at) is None
    assert trigger.first_at_or_after(at) == at
    assert trigger.first_at_or_after(at + timedelta(microseconds=1)) is None
    assert list(timemath.fire_times(trigger, utc(2026, 1, 1))) == [at]


def test_fire_times_until_and_limit() -> None:
    trigger = CronTrigger(expression="0 * * * *")
    start = utc(2026, 1, 1)
    assert len(list(timemath.fire_times(trigger, start, until=utc(2026, 1, 2)))) == 24
    assert len(list(timemath.fire_times(trigger, start, limit=5))) == 5
    assert list(timemath.fire_times(trigger, start, limit=0)) == []
    assert list(timemath.fire_times(trigger, start, until=start)) == []


# --- preview and descriptions ---------------------------------------------------------------


def test_preview_marks_spring_forward_and_skipped_time() -> None:
    trigger = CronTrigger(expression="30 2 * * *", timezone="Europe/Berlin")
    rows = timemath.preview(trigger, start=utc(2026, 3, 27), count=4)
    notes = [row.note for row in rows]
    assert notes[0] == notes[1] == notes[3] == ""
    assert notes[2].startswith("DST change: clocks move forward 1:00 (02:00 -> 03:00) before")
    assert "02:30 did not exist and was skipped" in notes[2]
    assert rows[2].local.replace(tzinfo=None) == datetime(2026, 3, 30, 2, 30)
    assert rows[2].utc == utc(2026, 3, 30, 0, 30)


def test_preview_marks_fall_back_and_repeated_time() -> None:
    trigger = CronTrigger(expression="0 * * * *", timezone="Europe/Berlin")
    rows = timemath.preview(trigger, start=utc(2026, 10, 24, 23, 30), count=3)
    assert [r.local.strftime("%H:%M%z") for r in rows] == ["02:00+0200", "03:00+0100", "04:00+0100"]
    assert "repeated wall time 02:00 runs once" in rows[0].note
    assert rows[1].note.startswith("DST change: clocks move back 1:00 (03:00 -> 02:00)")
    assert "after fall-back; repeated wall time runs once" in rows[1].note
    assert rows[2].note == ""


def test_preview_lord_howe_half_hour_notes() -> None:
    trigger = CronTrigger(expression="0 3 * * *", timezone="Australia/Lord_Howe")
    rows = timemath.preview(trigger, start=utc(2026, 10, 2), count=3)
    assert "clocks move forward 0:30 (02:00 -> 02:30)" in rows[1].note
    rows = timemath.preview(trigger, start=utc(2026, 4, 3), count=3)
    assert any("clocks move back 0:30 (02:00 -> 01:30)" in r.note for r in rows)


@pytest.mark.parametrize("count", [0, -1, 1001, True, 2.5])
def test_preview_count_is_bounded(count: object) -> None:
    with pytest.raises(errors.ValidationError, match="count must be an integer from 1 to 1000"):
        timemath.preview(CronTrigger(expression="@daily"), start=utc(2026, 1, 1), count=count)  # type: ignore[arg-type]


def test_preview_interval_and_one_off_rows_are_utc() -> None:
    rows = timemath.preview(
        IntervalTrigger(every=timedelta(hours=1), anchor=utc(2026, 1, 1)),
        start=utc(2026, 1, 1),
        count=1000,
    )
    assert len(rows) == 1000
    assert rows[0].utc == rows[0].local == utc(2026, 1, 1, 1)
    assert len(timemath.preview(OneOffTrigger(run_at=utc(2026, 2, 1)), start=utc(2026, 1, 1))) == 1


def test_describe_cron() -> None:
    assert timemath.describe_cron("0 9 * * 1-5") == "At 09:00, Monday through Friday"
    assert timemath.describe_cron("@daily") == timemath.describe_cron("0 0 * * *")
    with pytest.raises(errors.InvalidCronExpression):
        timemath.describe_cron("0 0 30 2 *")


@pytest.mark.parametrize(
    ("expression", "described", "june_days"),
    [
        (
            "0 9 1-7 * 1",
            "At 09:00, between day 1 and 7 of the month, or on Monday",
            [1, 2, 3, 4, 5, 6, 7, 8, 15],
        ),
        (
            "0 9 15 * MON-FRI",
            "At 09:00, on day 15 of the month, or on Monday through Friday",
            [1, 2, 3, 4, 5, 8, 9, 10, 11],
        ),
        # A day field that is a step from * leaves the other to restrict (no OR).
        (
            "30 2 */2 * 1-5",
            "At 02:30, every 2 days, Monday through Friday",
            [1, 3, 5, 9, 11, 15, 17, 19, 23],
        ),
    ],
)
def test_the_description_says_or_where_vixie_cron_runs_on_either_day_field(
    expression: str, described: str, june_days: list[int]
) -> None:
    """cron-descriptor reads two restricted day fields as both ("..., only on Monday");
    the parser, as Vixie cron, runs on a day that either matches, and so does the text."""
    assert timemath.describe_cron(expression) == described
    trigger = CronTrigger(expression=expression, timezone="UTC")
    rows = timemath.preview(trigger, start=utc(2026, 6, 1), count=9)  # 1 June is a Monday
    assert [row.utc.day for row in rows] == june_days


def test_next_after_is_fast_in_hot_loops() -> None:
    triggers = [
        CronTrigger(expression="* * * * *", timezone="Europe/Berlin"),
        CronTrigger(expression="0 9 * * 1-5", timezone="America/New_York"),
        CronTrigger(expression="0 0 29 2 *", timezone="Australia/Lord_Howe"),
    ]
    started = time.perf_counter()
    for trigger in triggers:
        assert len(list(timemath.fire_times(trigger, utc(2026, 1, 1), limit=1500))) == 1500
    # 4,500 calls, including 1,500 leap days (6,000 years of calendar): a generous bound.
    assert time.perf_counter() - started < 5.0


@pytest.mark.parametrize(
    ("wall", "zone", "named", "missing"),
    [
        # Berlin skips 02:00-03:00 on 29 March 2026: the gap's end, not 02:30 read as CET.
        ("2026-03-29T02:30", "Europe/Berlin", "2026-03-29T03:00:00+02:00", True),
        ("2026-03-29T02:00", "Europe/Berlin", "2026-03-29T03:00:00+02:00", True),
        ("2026-03-29T03:00", "Europe/Berlin", "2026-03-29T03:00:00+02:00", False),
        # A repeated wall time names its first pass.
        ("2026-10-25T02:30", "Europe/Berlin", "2026-10-25T02:30:00+02:00", False),
        # Lord Howe moves 30 minutes: 02:00-02:30 is skipped.
        ("2026-10-04T02:15", "Australia/Lord_Howe", "2026-10-04T02:30:00+11:00", True),
    ],
)
def test_a_wall_time_names_its_instant_and_a_skipped_one_the_gaps_end(
    wall: str, zone: str, named: str, missing: bool
) -> None:
    instant, skipped = timemath.wall_instant(datetime.fromisoformat(wall), ZoneInfo(zone))
    assert (instant.isoformat(), skipped) == (named, missing)
