"""The DST policies (``dst_gap`` x ``dst_fold``) against a brute-force reference, exhaustively.

Every zone of the installed tz database that changes its UTC offset between 2000 and 2037,
every such change, a day either side of it, six crons that touch the hours where changes
happen, all six policy pairs. The reference is deliberately dumb and shares nothing with
``timemath`` but ``zoneinfo``: it walks every minute of LOCAL wall time over the window, keeps
the minutes the cron matches (predicates written out by hand below), and asks ``zoneinfo``
whether each exists (the ``fold=0`` round trip lands on it), exists twice (``fold=0`` and
``fold=1`` give two instants) or not at all. A missing minute under SHIFT fires at the first
existing minute after it, found by walking on minute by minute.

Changes that look the same to these crons are checked once (Europe/Paris and Europe/Rome on
the same night, or Europe/Berlin in 2024 and in 2030 when both fall on a Sunday at 02:00): the
key is the local time of day and weekday of the change and every change of the zone within
two days of it (distance and both offsets), which is all the six crons and the zone's offsets
in the window can depend on; none of the crons restricts the day of month or the month.
No randomness except a fixed-seed sample of starting instants for ``next_after``.
"""

from __future__ import annotations

import bisect
import functools
import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, available_timezones

import pytest

from celery_scheduler.core import timemath
from celery_scheduler.core.enums import DstFold, DstGap

MINUTE = timedelta(minutes=1)
SECOND = timedelta(seconds=1)
WALK = timedelta(days=1)
#: Instants compared: within a day of the change the walk's wall times cover every instant;
#: the 3-hour margin keeps that true when a second change falls inside the window.
COMPARE = timedelta(hours=21)
#: Fire times checked with first_at_or_after: those next to the change.
NEAR = timedelta(hours=3)
FIRST_YEAR, END_YEAR = 2000, 2038

#: cron -> the same set of wall times, written independently of timemath's parser.
CRONS: dict[str, Callable[[datetime], bool]] = {
    "*/15 * * * *": lambda w: w.minute % 15 == 0,
    "0 * * * *": lambda w: w.minute == 0,
    "30 1-3 * * *": lambda w: w.minute == 30 and 1 <= w.hour <= 3,
    "0 0 * * *": lambda w: w.hour == 0 and w.minute == 0,
    "* 2 * * 0": lambda w: w.hour == 2 and w.isoweekday() == 7,
    "59 23 * * *": lambda w: w.hour == 23 and w.minute == 59,
}
POLICIES = [(gap, fold) for gap in DstGap for fold in DstFold]


def _changes(zone: ZoneInfo) -> list[tuple[datetime, timedelta, timedelta]]:
    """Every (instant, offset before, offset after) of ``zone`` in [2000, 2038), to the second.

    A two-day scan then bisection: no zone changes its offset twice within two days.
    """
    found = []
    t, end = datetime(FIRST_YEAR, 1, 1, tzinfo=UTC), datetime(END_YEAR, 1, 1, tzinfo=UTC)
    step = timedelta(days=2)
    offset = t.astimezone(zone).utcoffset()
    while t < end:
        nxt = t + step
        after = nxt.astimezone(zone).utcoffset()
        if after != offset:
            lo, hi = t, nxt
            while hi - lo > SECOND:
                mid = lo + ((hi - lo) // SECOND // 2) * SECOND
                if mid.astimezone(zone).utcoffset() == offset:
                    lo = mid
                else:
                    hi = mid
            assert offset is not None
            assert after is not None
            found.append((hi, offset, after))
            offset = after
        t = nxt
    return found


@functools.cache
def _windows() -> tuple[list[tuple[str, datetime]], int, int]:
    """(zone, change) for each distinct change shape; zones and changes seen in all."""
    seen: set[tuple[object, ...]] = set()
    windows = []
    zones = changes_seen = 0
    for name in sorted(available_timezones() - {"localtime", "posixrules"}):
        zone = ZoneInfo(name)
        changes = _changes(zone)
        zones += bool(changes)
        changes_seen += len(changes)
        for instant, before, _ in changes:
            # Everything the six crons can see: the local time of day and weekday of the
            # change, and every change within two days as (distance, offsets).
            near = tuple((t - instant, a, b) for t, a, b in changes if abs(t - instant) <= 2 * WALK)
            local = (instant + before).replace(tzinfo=None)
            key = (local.time(), local.isoweekday(), near)
            if key not in seen:
                seen.add(key)
                windows.append((name, instant))
    return windows, zones, changes_seen


def _reference(
    zone: ZoneInfo, change: datetime, matches: Callable[[datetime], bool]
) -> dict[tuple[DstGap, DstFold], list[datetime]]:
    """The instants each policy fires for walls in the walk window, by walking every minute."""
    lo = (change - WALK).astimezone(zone).replace(tzinfo=None, fold=0, second=0, microsecond=0)
    hi = (change + WALK).astimezone(zone).replace(tzinfo=None, fold=0)

    def instants(wall: datetime) -> list[datetime]:
        out = []
        for fold in (0, 1):
            utc = wall.replace(tzinfo=zone, fold=fold).astimezone(UTC)
            if utc.astimezone(zone).replace(tzinfo=None) == wall and utc not in out:
                out.append(utc)
        return sorted(out)

    fired: dict[tuple[DstGap, DstFold], set[datetime]] = {p: set() for p in POLICIES}
    wall = lo
    while wall <= hi:
        if matches(wall):
            found = instants(wall)
            shifted: list[datetime] = []
            if not found:  # the wall time does not exist: the first minute after it that does
                after = wall + MINUTE
                while not instants(after):
                    after += MINUTE
                shifted = instants(after)[:1]
            for gap, fold in POLICIES:
                chosen: list[datetime]
                if not found:
                    chosen = shifted if gap is DstGap.SHIFT else []
                elif len(found) == 1:
                    chosen = found
                elif fold is DstFold.FIRST:
                    chosen = found[:1]
                elif fold is DstFold.SECOND:
                    chosen = found[1:]
                else:
                    chosen = found
                fired[(gap, fold)].update(chosen)
        wall += MINUTE
    return {p: sorted(times) for p, times in fired.items()}


def test_windows_cover_every_zone_with_changes() -> None:
    """The dedupe keeps every change shape: hundreds of zones, thousands of shapes."""
    windows, zones, changes = _windows()
    assert zones > 300  # 339 in tzdata 2025b
    assert changes > 15_000  # 17,348 in tzdata 2025b
    assert len(windows) > 200  # 236 distinct shapes


@pytest.mark.parametrize("cron", list(CRONS))
def test_policies_match_the_minute_walk(cron: str) -> None:
    rng = random.Random(20260329)  # fixed seed: the next_after starting points
    differences = []
    for name, change in _windows()[0]:
        zone = ZoneInfo(name)
        expected = _reference(zone, change, CRONS[cron])
        lo, hi = change - COMPARE, change + COMPARE
        for (gap, fold), times in expected.items():
            want = [t for t in times if lo < t <= hi]
            trigger = timemath.CronTrigger(
                expression=cron, timezone=name, dst_gap=gap, dst_fold=fold
            )
            got = list(timemath.fire_times(trigger, lo, until=hi))
            if got != want:
                differences.append((name, change, gap, fold, sorted(set(got) ^ set(want))[:4]))
                continue
            # Each fire time near the change is its own first fire time at or after it (a
            # shifted run too: its wall time is after the wall times it stands for).
            near = [t for t in want if abs(t - change) <= NEAR]
            wrong = [t for t in near if trigger.first_at_or_after(t) != t]
            if wrong:
                differences.append((name, change, gap, fold, wrong[:4]))
            # Arbitrary starting points too (inside a repeated hour, inside a gap's span).
            for _ in range(3):
                start = lo + rng.random() * (hi - lo - timedelta(hours=2))
                i = bisect.bisect_right(times, start)
                if i < len(times) and trigger.next_after(start) != times[i]:
                    differences.append((name, change, gap, fold, [start]))
    assert differences == []
