"""Why the cron parser is ours: the cases where croniter (kept as a test oracle) is wrong.

Vixie cron, the reference every crontab user knows, is the contract. croniter departs from it
in two ways that the property tests therefore steer around; these tests pin both, so the day
croniter changes is the day we look again:

* an equal range ``5-5`` is read as the whole field (every minute instead of minute 5);
* day-of-month/day-of-week OR versus AND is decided from the expanded sets, where Vixie cron
  decides from a leading ``*`` in the field text (``*/2`` keeps AND semantics).
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from croniter import croniter

from celery_scheduler.core.timemath import CronTrigger

MONDAY = datetime(2026, 3, 2, 0, 0, tzinfo=UTC)


def ours(expression: str, count: int = 4) -> list[datetime]:
    trigger = CronTrigger(expression=expression, timezone="UTC")
    out: list[datetime] = []
    at = MONDAY
    for _ in range(count):
        nxt = trigger.next_after(at)
        assert nxt is not None
        out.append(nxt)
        at = nxt
    return out


def theirs(expression: str, count: int = 4) -> list[datetime]:
    iterator = croniter(expression, MONDAY)
    return [iterator.get_next(datetime) for _ in range(count)]


def at(day: int, hour: int = 0, minute: int = 0, month: int = 3) -> datetime:
    return datetime(2026, month, day, hour, minute, tzinfo=UTC)


@pytest.mark.parametrize(
    ("expression", "vixie"),
    [
        # Minute 5 of every hour; croniter fires every minute.
        ("5-5 * * * *", [at(2, 0, 5), at(2, 1, 5), at(2, 2, 5), at(2, 3, 5)]),
        # Day-of-month starts with "*": Vixie ANDs the fields, so odd days that are Mondays.
        # croniter ORs them (odd days or Mondays) because "*/2" is not the full set.
        ("0 0 */2 * 1", [at(9), at(23), at(13, month=4), at(27, month=4)]),
    ],
)
def test_ours_follows_vixie_where_croniter_does_not(expression: str, vixie: list[datetime]) -> None:
    assert ours(expression) == vixie
    assert theirs(expression) != vixie  # croniter's known departure, pinned


@pytest.mark.parametrize(
    "expression",
    ["0 0 1-31 * 1", "0 0 13 * 5", "0 0 * * 1", "*/15 9-17 * * 1-5", "0 0 1 * 1-5/1"],
)
def test_ours_and_croniter_agree_on_ordinary_expressions(expression: str) -> None:
    assert ours(expression) == theirs(expression)
