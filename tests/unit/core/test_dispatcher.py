"""Dispatcher: pure heap behaviour with a frozen clock, then the threaded runner.

Threaded tests never wait for time to pass: they move a FrozenClock and use ``settle`` to
know the runner has looked at the heap again. Bounded Event waits cover thread handoff only.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta, timezone

import pytest

from celery_scheduler.core.clock import FrozenClock, SystemClock
from celery_scheduler.core.dispatcher import Dispatcher, DispatcherClosed
from celery_scheduler.errors import InvalidPolicy, InvalidTiming, SchedulerError

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
HANDOFF = 5.0  # seconds: generous bound for a thread handoff, never reached when it works


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def settle(dispatcher: Dispatcher[object]) -> None:
    """Wake the runner and return once it has re-evaluated the heap and parked again."""
    before = dispatcher.loop_count
    dispatcher.wake()
    assert dispatcher.wait_for_loop(before, HANDOFF), "runner did not come back to wait"


class Recorder:
    """A handler that records batches; optionally blocks until released."""

    def __init__(self, block: bool = False) -> None:
        self.batches: list[list[object]] = []
        self.started = threading.Event()
        self.release = threading.Event()
        self.called = threading.Condition()
        if not block:
            self.release.set()

    def __call__(self, batch: list[object]) -> None:
        self.started.set()
        assert self.release.wait(HANDOFF), "test never released the handler"
        with self.called:
            self.batches.append(batch)
            self.called.notify_all()

    def wait_items(self, count: int) -> list[object]:
        with self.called:
            ok = self.called.wait_for(lambda: sum(map(len, self.batches)) >= count, HANDOFF)
        assert ok, f"expected {count} dispatched items, got {self.batches}"
        return [item for batch in self.batches for item in batch]


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
        ({"batch_size": 0}, "batch_size"),
        ({"max_in_flight": 0}, "max_in_flight"),
        ({"max_pending": 0}, "max_pending"),
        ({"rebuild_factor": 0}, "rebuild_factor"),
        ({"max_wait": 0}, "max_wait"),
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


def test_runner_needs_a_handler() -> None:
    with pytest.raises(InvalidPolicy, match="no handler"):
        Dispatcher().start()


# -- threaded runner ---------------------------------------------------------------------


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(T0)


def make_runner(clock: FrozenClock, handler: Recorder, **kwargs: object) -> Dispatcher[object]:
    # A long max_wait proves that only submit()/wake() moves the runner, not polling.
    options: dict[str, object] = {"max_wait": 3600.0, **kwargs}
    d: Dispatcher[object] = Dispatcher(handler, clock=clock, **options)  # type: ignore[arg-type]
    d.start()
    return d


def test_runner_dispatches_exactly_when_the_clock_reaches_available_at(
    clock: FrozenClock,
) -> None:
    rec = Recorder()
    d = make_runner(clock, rec)
    try:
        d.submit("a", "a", at(10))
        settle(d)
        clock.advance(9.999)
        settle(d)
        assert len(d) == 1, "dispatched before its time"
        assert rec.batches == []
        clock.advance(0.001)
        settle(d)
        assert rec.wait_items(1) == ["a"]
        assert clock.now() == at(10)
    finally:
        d.close()


def test_runner_is_woken_early_by_earlier_work(clock: FrozenClock) -> None:
    rec = Recorder()
    d = make_runner(clock, rec)
    try:
        d.submit("far", "far", at(600))
        settle(d)  # now parked with a 600 s deadline and a 3600 s max_wait
        d.submit("now", "now", at(0))  # no wake(), no clock move: submit alone must wake it
        assert rec.wait_items(1) == ["now"]
        assert "far" in d
    finally:
        assert d.close() == ["far"]


def test_runner_batches_due_items_up_to_batch_size(clock: FrozenClock) -> None:
    rec = Recorder()
    d = make_runner(clock, rec, batch_size=2, max_in_flight=1)
    try:
        for i in range(5):
            d.submit(i, i, at(1), priority=-i)
        clock.advance(1)
        settle(d)
        assert rec.wait_items(5) == [0, 1, 2, 3, 4]
        assert [len(b) for b in rec.batches] == [2, 2, 1]
    finally:
        d.close()


def test_full_pool_keeps_due_items_in_the_heap(clock: FrozenClock) -> None:
    rec = Recorder(block=True)
    d = make_runner(clock, rec, batch_size=1, max_in_flight=1)
    try:
        for i in range(3):
            d.submit(i, i, at(0))
        assert rec.started.wait(HANDOFF)
        settle(d)
        stats = d.stats()
        assert (stats.in_flight, stats.live) == (1, 2)
        rec.release.set()
        assert rec.wait_items(3) == [0, 1, 2]
    finally:
        rec.release.set()
        d.close()


def test_close_lets_in_flight_batches_finish_and_returns_the_rest(clock: FrozenClock) -> None:
    rec = Recorder(block=True)
    d = make_runner(clock, rec)
    d.submit("due", "due", at(0))
    d.submit("later", "later", at(60))
    assert rec.started.wait(HANDOFF)

    result: list[list[object]] = []
    closer = threading.Thread(target=lambda: result.append(d.close(wait=True)))
    closer.start()
    closer.join(0.2)
    assert closer.is_alive(), "close(wait=True) returned while a batch was still running"
    with pytest.raises(DispatcherClosed):
        d.submit("new", "new", at(0))
    rec.release.set()
    closer.join(HANDOFF)
    assert not closer.is_alive()
    assert rec.batches == [["due"]]
    assert result == [["later"]]
    clock.advance(120)
    assert rec.batches == [["due"]]  # nothing dispatched after close


def test_handler_errors_are_reported_and_the_runner_continues(clock: FrozenClock) -> None:
    errors: list[tuple[list[object], BaseException]] = []
    done = threading.Event()

    def handler(batch: list[object]) -> None:
        if batch == ["bad"]:
            raise RuntimeError("broker down")
        done.set()

    d: Dispatcher[object] = Dispatcher(
        handler,
        clock=clock,
        batch_size=1,
        max_in_flight=1,
        on_error=lambda b, e: errors.append((b, e)),
    )
    d.start()
    try:
        d.submit("bad", "bad", at(0))
        d.submit("good", "good", at(1))
        clock.advance(1)
        settle(d)
        assert done.wait(HANDOFF)
        assert d.close() == []
        assert d.stats().failed_batches == 1
        assert [(b, str(e)) for b, e in errors] == [(["bad"], "broker down")]
    finally:
        d.close()


def test_run_until_closed_in_the_callers_thread(clock: FrozenClock) -> None:
    rec = Recorder()
    d: Dispatcher[object] = Dispatcher(rec, clock=clock)
    loop = threading.Thread(target=d.run_until_closed)
    loop.start()
    d.submit("a", "a", at(0))
    assert rec.wait_items(1) == ["a"]
    d.close()
    loop.join(HANDOFF)
    assert not loop.is_alive()
    with pytest.raises(DispatcherClosed):
        d.start()


def test_second_runner_is_refused(clock: FrozenClock) -> None:
    d = make_runner(clock, Recorder())
    try:
        with pytest.raises(SchedulerError, match="already has a runner"):
            d.start()
    finally:
        d.close()


def test_system_clock_never_dispatches_early() -> None:
    """One short real wait (50 ms) to prove the real monotonic path, not the frozen one."""
    clock = SystemClock()
    seen: list[datetime] = []
    done = threading.Event()

    def handler(batch: list[object]) -> None:
        seen.append(clock.now())
        done.set()

    d: Dispatcher[object] = Dispatcher(handler, clock=clock)
    d.start()
    try:
        due = clock.now() + timedelta(milliseconds=50)
        d.submit("a", "a", due)
        assert done.wait(HANDOFF)
        assert seen[0] >= due
        assert seen[0] - due < timedelta(seconds=1)
    finally:
        d.close()


class SkewedClock(FrozenClock):
    """Monotonic time runs on while the wall clock stands still (a wall clock stepped back)."""

    def __init__(self, start: datetime) -> None:
        super().__init__(start)
        self.skew = 0.0

    def monotonic(self) -> float:
        return super().monotonic() + self.skew


def test_wall_clock_decides_due_even_when_the_monotonic_deadline_passed() -> None:
    clock = SkewedClock(T0)
    rec = Recorder()
    d = make_runner(clock, rec, max_wait=0.01)
    try:
        d.submit("a", "a", at(10))
        settle(d)
        clock.skew = 60.0  # the monotonic deadline is long gone; the wall says 12:00:00
        for _ in range(3):
            settle(d)
        assert len(d) == 1, "dispatched on the monotonic deadline before the wall time"
        clock.advance(10)
        settle(d)
        assert rec.wait_items(1) == ["a"]
    finally:
        d.close()


def test_close_from_inside_the_handler_does_not_deadlock(clock: FrozenClock) -> None:
    returned: list[list[object]] = []
    done = threading.Event()
    d: Dispatcher[object]

    def handler(batch: list[object]) -> None:
        returned.append(d.close(wait=True))
        done.set()

    d = Dispatcher(handler, clock=clock)
    d.start()
    d.submit("a", "a", at(0))
    d.submit("b", "b", at(30))
    assert done.wait(HANDOFF), "close() inside the handler blocked"
    assert returned == [["b"]]
    assert d.close(wait=True, timeout=HANDOFF) == []
