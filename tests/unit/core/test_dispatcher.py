"""Dispatcher: the due-time heap the lookahead relay holds claimed rows in."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from celery_scheduler.core.dispatcher import Dispatcher, DispatcherClosed
from celery_scheduler.errors import InvalidPolicy, InvalidTiming, SchedulerError

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


# -- pure API ----------------------------------------------------------------------------


def test_pop_due_returns_only_due_items_in_key_order() -> None:
    d: Dispatcher[str] = Dispatcher()
    d.submit("late", "late", at(10))
    d.submit("low", "low", at(5), priority=0)
    d.submit("high", "high", at(5), priority=9)
    d.submit("first", "first", at(1))
    d.submit("low2", "low2", at(5), priority=0)  # ties keep submission order

    assert d.pop_due(at(0.999)) == []
    assert d.pop_due(at(5)) == ["first", "high", "low", "low2"]
    assert len(d) == 1
    assert d.next_due_at() == at(10)
    assert d.pop_due(at(10)) == ["late"]
    assert d.next_due_at() is None


def test_pop_due_limit_leaves_the_rest_in_order() -> None:
    d: Dispatcher[int] = Dispatcher()
    for i in range(5):
        d.submit(i, i, at(i))
    assert d.pop_due(at(10), limit=2) == [0, 1]
    assert d.pop_due(at(10), limit=2) == [2, 3]
    assert d.pop_due(at(10)) == [4]


def test_replace_moves_the_item_and_leaves_a_stale_entry() -> None:
    d: Dispatcher[str] = Dispatcher(rebuild_factor=10)
    d.submit("a", "a-v1", at(1))
    d.submit("b", "b", at(2))
    d.submit("a", "a-v2", at(3))
    assert len(d) == 2
    assert d.stale_count == 1
    assert d.pop_due(at(2)) == ["b"]  # the old a@1 is skipped, not dispatched
    assert d.stale_count == 0  # dropped lazily when it reached the head
    assert d.pop_due(at(3)) == ["a-v2"]


def test_replace_can_move_an_item_earlier() -> None:
    d: Dispatcher[str] = Dispatcher()
    d.submit("a", "a-v1", at(10))
    d.submit("a", "a-v2", at(1))
    assert d.next_due_at() == at(1)
    assert d.pop_due(at(1)) == ["a-v2"]
    assert d.pop_due(at(100)) == []


def test_cancel_prevents_dispatch_and_reports_whether_live() -> None:
    d: Dispatcher[str] = Dispatcher(rebuild_factor=10)
    d.submit("a", "a", at(1))
    d.submit("b", "b", at(2))
    assert d.cancel("a") is True
    assert d.cancel("a") is False
    assert d.cancel("never") is False
    assert "a" not in d
    assert d.next_due_at() == at(2)
    assert d.pop_due(at(100)) == ["b"]


def test_heap_is_rebuilt_when_stale_entries_exceed_the_factor() -> None:
    d: Dispatcher[int] = Dispatcher(rebuild_factor=2)
    for i in range(10):
        d.submit(i, i, at(100 + i))
    for i in range(4):
        d.cancel(i)  # 4 stale, 6 live: 4 <= 12
    assert d.stale_count == 4
    assert d.stats().rebuilds == 0
    for i in range(4, 8):
        d.cancel(i)  # 8 stale, 2 live: 8 > 4 -> rebuilt
    assert d.stats().rebuilds >= 1
    assert d.stale_count <= 2 * len(d)
    assert d.pop_due(at(1000)) == [8, 9]


def test_replacing_one_id_many_times_keeps_memory_bounded() -> None:
    d: Dispatcher[int] = Dispatcher(rebuild_factor=2)
    d.submit("other", -1, at(0))
    for version in range(1000):
        d.submit("hot", version, at(50))
    assert d.stale_count <= 2 * len(d)
    assert d.pop_due(at(50)) == [-1, 999]


def test_drain_pending_returns_live_items_in_key_order() -> None:
    d: Dispatcher[str] = Dispatcher()
    d.submit("b", "b", at(2))
    d.submit("a", "a", at(1))
    d.submit("c", "c", at(3))
    d.cancel("c")
    assert d.drain_pending() == ["a", "b"]
    assert len(d) == 0
    assert d.stale_count == 0


def test_capacity_rejects_new_ids_but_accepts_replacements() -> None:
    d: Dispatcher[str] = Dispatcher(max_pending=2)
    assert d.submit("a", "a", at(1))
    assert d.submit("b", "b", at(2))
    assert d.submit("c", "c", at(3)) is False
    assert d.submit("a", "a2", at(4)) is True
    assert "c" not in d
    d.pop_due(at(2))
    assert d.submit("c", "c", at(3)) is True


def test_naive_datetimes_are_rejected() -> None:
    d: Dispatcher[str] = Dispatcher()
    with pytest.raises(InvalidTiming, match="available_at must be timezone-aware"):
        d.submit("a", "a", datetime(2026, 1, 1))
    with pytest.raises(InvalidTiming, match="now must be timezone-aware"):
        d.pop_due(datetime(2026, 1, 1))


def test_other_timezones_compare_by_instant() -> None:
    d: Dispatcher[str] = Dispatcher()
    plus_two = timezone(timedelta(hours=2))
    d.submit("a", "a", datetime(2026, 3, 1, 14, 0, 1, tzinfo=plus_two))  # 12:00:01 UTC
    assert d.pop_due(T0) == []
    assert d.next_due_at() == at(1)
    assert d.pop_due(at(1)) == ["a"]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_pending": 0}, "max_pending"),
        ({"rebuild_factor": 0}, "rebuild_factor"),
    ],
)
def test_bad_settings_name_the_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(InvalidPolicy, match=field) as info:
        Dispatcher(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


def test_close_rejects_new_work_and_returns_pending() -> None:
    d: Dispatcher[str] = Dispatcher()
    d.submit("a", "a", at(5))
    d.submit("b", "b", at(1))
    assert d.close() == ["b", "a"]
    assert d.closed
    with pytest.raises(DispatcherClosed, match="closed"):
        d.submit("c", "c", at(1))
    assert isinstance(DispatcherClosed("x"), SchedulerError)
    assert d.close() == []
