"""Time inputs at the edges: host-only zone names, instants near year 1 and 9999, intervals
that are enormous, zero or not numbers. Each is a ValidationError naming the field."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from celery_scheduler import api, errors
from celery_scheduler.core import timemath


@pytest.mark.parametrize("name", ["localtime", "posixrules", "", " UTC", "UTC\x00", "../UTC"])
def test_zone_names_that_are_not_iana_are_rejected(name: str) -> None:
    with pytest.raises(errors.UnknownTimeZone) as caught:
        timemath.parse_timezone(name)
    assert caught.value.field == "timezone"


@pytest.mark.parametrize("name", ["UTC", "Europe/Berlin", "America/Argentina/Buenos_Aires"])
def test_iana_names_still_parse(name: str) -> None:
    assert timemath.parse_timezone(name).key == name


EDGES = [
    datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=1))),  # before year 1 in UTC
    datetime(1, 1, 1, tzinfo=UTC),
    datetime(9999, 12, 31, 23, 59, tzinfo=UTC),
    datetime(9999, 12, 31, 23, 59, tzinfo=timezone(timedelta(hours=-1))),  # past 9999 in UTC
]


@pytest.mark.parametrize("instant", EDGES, ids=str)
def test_instants_near_the_datetime_range_are_invalid_timing(instant: datetime) -> None:
    with pytest.raises(errors.InvalidTiming) as caught:
        timemath.check_instant(instant, "run_at")
    assert caught.value.field == "run_at"


@pytest.mark.parametrize("instant", EDGES, ids=str)
def test_api_preview_start_near_the_range_is_invalid_timing(instant: datetime) -> None:
    with pytest.raises(errors.InvalidTiming) as caught:
        api.preview(cron="* * * * *", start=instant)
    assert caught.value.field == "start"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "from 1 second"), (-5, "from 1 second"), (10**30, "from 1 second"),
        (10**5000, "too large"), (float("inf"), "whole number"), (float("nan"), "whole number"),
        ("abc", "whole number"), ("²", "whole number"), ("٣", "whole number"),
        (True, "whole number"), (timedelta(days=10**8), "from 1 second"),
        (timedelta(seconds=1.5), "whole number"), ([1], "whole number"),
    ],
    ids=lambda v: type(v).__name__,
)  # fmt: skip
def test_intervals_that_are_not_sane_are_invalid_timing(value: object, message: str) -> None:
    with pytest.raises(errors.InvalidTiming, match=message) as caught:
        timemath.parse_interval(value)
    assert caught.value.field == "interval"


@pytest.mark.parametrize("interval", [0, 10**30, "abc", 10**5000], ids=["0", "1e30", "abc", "huge"])
def test_api_preview_interval_errors_name_interval(interval: Any) -> None:
    with pytest.raises(errors.ValidationError) as caught:
        api.preview(interval=interval, start=datetime(2026, 1, 1, tzinfo=UTC))
    assert caught.value.field == "interval"


def test_interval_fire_times_stop_at_the_end_of_datetime() -> None:
    trigger = timemath.IntervalTrigger(
        every=timedelta(days=366), anchor=datetime(8999, 1, 1, tzinfo=UTC)
    )
    rows = timemath.preview(trigger, start=datetime(8999, 1, 1, tzinfo=UTC), count=1000)
    assert rows
    assert rows[-1].utc.year == 9999
