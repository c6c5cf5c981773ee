"""The preview row of a run a DST policy moved or doubled says which policy made it, and bad
policy input is refused naming the field (the pure half of every entry point)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from celery_scheduler import errors
from celery_scheduler.core import timemath

CRON = "0,30 1,2 * * *"
SPRING = datetime(2026, 3, 28, 23, 45, tzinfo=UTC)  # 00:45 CET, before the 02:00 jump
FALL = datetime(2026, 10, 24, 23, 45, tzinfo=UTC)  # 01:45 CEST, before the repeated hour


def _notes(start: datetime, count: int, **policy: Any) -> list[tuple[str, str]]:
    trigger = timemath.CronTrigger(expression=CRON, timezone="Europe/Berlin", **policy)
    rows = timemath.preview(trigger, start=start, count=count)
    return [(f"{r.utc:%H:%M}", r.note) for r in rows]


def test_skip_and_shift_notes() -> None:
    skip = _notes(SPRING, 3)
    assert skip[2][0] == "23:00"  # the next day's 01:00 CEST
    assert "02:00-02:30 did not exist and was skipped" in skip[2][1]
    shift = _notes(SPRING, 3, dst_gap="SHIFT")
    shift = shift[1:]
    assert shift[1][0] == "01:00"
    assert (
        "02:00-02:30 did not exist; runs at the end of the gap, 03:00 (dst_gap=SHIFT)"
        in (shift[1][1])
    )
    assert "skipped" not in shift[1][1]


def test_fold_notes_name_the_policy() -> None:
    first = _notes(FALL, 2)
    assert first == [
        ("00:00", "repeated wall time 02:00 runs once (first instant)"),
        ("00:30", "repeated wall time 02:30 runs once (first instant)"),
    ]
    second = _notes(FALL, 1, dst_fold="SECOND")
    assert second[0][0] == "01:00"
    assert "repeated wall time 02:00 runs once (second instant, dst_fold=SECOND)" in second[0][1]
    both = _notes(FALL, 4, dst_fold="BOTH")
    assert [t for t, _ in both] == ["00:00", "00:30", "01:00", "01:30"]
    assert both[0][1] == "repeated wall time 02:00 runs twice: the first run (dst_fold=BOTH)"
    assert both[3][1] == "repeated wall time 02:30 runs twice: the second run (dst_fold=BOTH)"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"dst_gap": "later"}, "dst_gap"),
        ({"dst_fold": None}, "dst_fold"),
        ({"dst_fold": 1}, "dst_fold"),
    ],
)
def test_trigger_refuses_a_bad_policy(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(errors.InvalidPolicy) as caught:
        timemath.CronTrigger(expression=CRON, **kwargs)  # type: ignore[arg-type]
    assert caught.value.field == field


def test_policy_check_for_intervals_and_one_offs() -> None:
    assert timemath.dst_policy(None, "", cron=False) == (
        timemath.DstGap.SKIP,
        timemath.DstFold.FIRST,
    )
    assert timemath.dst_policy("shift", "both", cron=True) == (
        timemath.DstGap.SHIFT, timemath.DstFold.BOTH,
    )  # fmt: skip
    with pytest.raises(errors.InvalidPolicy, match="applies to cron schedules only") as caught:
        timemath.dst_policy(None, "SECOND", cron=False)
    assert caught.value.field == "dst_fold"
