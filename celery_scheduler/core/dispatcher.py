"""In-memory dispatcher: releases work at its ``available_at``, never before.

A relay claims outbox rows a little ahead of time and parks them here, so a strict occurrence
is published at its instant rather than at the next database poll.

Shape (see SPEC "The single-node dispatcher"):

- A min-heap of ``(available_at, -priority, sequence)``; ``sequence`` is unique per submit and
  doubles as the item's version. A map holds the current version of every live id, so
  replacing or canceling is O(1) plus a push: the old heap entry is left in place as *stale*
  and dropped when it reaches the head. When stale entries exceed ``rebuild_factor`` times the
  live ones the heap is rebuilt, which keeps memory bounded and costs amortized O(1) per
  replace/cancel.
- Whether work is due is decided by the wall clock (``clock.now() >= available_at``) only, so
  nothing is dispatched early even if the wall clock is stepped back. How long to wait is a
  deadline on ``clock.monotonic()``, re-checked against the wall clock every ``max_wait``
  seconds so a wall clock stepped forward is noticed promptly.
- A runner (``start()`` for a thread, or ``run_until_closed()`` in the caller's thread) waits
  for the head on a condition, is woken early when work is submitted ahead of the head, and
  hands due items in batches of at most ``batch_size`` to ``handler`` on a pool of
  ``max_in_flight`` threads.

Backpressure, chosen so the relay never blocks while holding database claims:
- dispatch: at most ``max_in_flight`` batches run at once; while they are all busy, due items
  stay in the heap (the runner waits for a slot), so a slow broker slows dispatch, not memory;
- admission: with ``max_pending`` set, ``submit`` of a new id returns ``False`` once that many
  items are live (replacing an existing id is always accepted). The caller then stops claiming;
  its claims are durable, so nothing is lost.

``close()`` rejects new work (``submit`` raises :class:`DispatcherClosed`), wakes the runner,
lets batches already handed to the pool finish, and returns every item still in the heap
(due or not) in key order so the caller can release their claims.

The pure API (``submit``/``cancel``/``pop_due``/``next_due_at``/``drain_pending``) needs no
thread and is what a caller that drives its own loop, or a test, uses.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Generic, TypeVar

from celery_scheduler.core.clock import SYSTEM_CLOCK, Clock
from celery_scheduler.errors import InvalidPolicy, InvalidTiming, SchedulerError

T = TypeVar("T")

Handler = Callable[[list[T]], None]
ErrorHook = Callable[[list[T], BaseException], None]


class DispatcherClosed(SchedulerError):
    """``submit`` was called after ``close()``: release the claim instead of dispatching."""


# (available_at, -priority, sequence, item_id); sequence is unique, so item ids are never
# compared and need only be hashable.
_HeapEntry = tuple[datetime, int, int, Hashable]


@dataclass(frozen=True, slots=True)
class _Live(Generic[T]):
    sequence: int
    item: T
    available_at: datetime
    priority: int


@dataclass(frozen=True, slots=True)
class DispatcherStats:
    live: int
    stale: int
    in_flight: int
    dispatched: int
    batches: int
    failed_batches: int
    rebuilds: int


def _aware_utc(value: datetime, field: str) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidTiming(f"{field} must be timezone-aware (got naive {value!r})", field=field)
    return value.astimezone(UTC)


class Dispatcher(Generic[T]):
    """Releases submitted items to ``handler`` in batches once their ``available_at`` passed.

    Thread-safe: every public method may be called from any thread. ``handler`` runs on the
    pool, never under the dispatcher's lock. Exceptions from ``handler`` go to ``on_error``
    (if given) and are counted in ``stats().failed_batches``; the runner keeps going either
    way, because the handler's claims are durable and are retried elsewhere once they expire.
    """

    def __init__(
        self,
        handler: Handler[T] | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
        batch_size: int = 100,
        max_in_flight: int = 4,
        max_pending: int | None = None,
        rebuild_factor: float = 2.0,
        max_wait: float = 1.0,
        on_error: ErrorHook[T] | None = None,
        name: str = "dispatcher",
    ) -> None:
        if batch_size < 1:
            raise InvalidPolicy(f"batch_size must be >= 1 (got {batch_size})", field="batch_size")
        if max_in_flight < 1:
            raise InvalidPolicy(
                f"max_in_flight must be >= 1 (got {max_in_flight})", field="max_in_flight"
            )
        if max_pending is not None and max_pending < 1:
            raise InvalidPolicy(
                f"max_pending must be >= 1 or None (got {max_pending})", field="max_pending"
            )
        if rebuild_factor <= 0:
            raise InvalidPolicy(
                f"rebuild_factor must be > 0 (got {rebuild_factor})", field="rebuild_factor"
            )
        if max_wait <= 0:
            raise InvalidPolicy(f"max_wait must be > 0 (got {max_wait})", field="max_wait")
        self._handler = handler
        self._clock = clock
        self._batch_size = batch_size
        self._max_in_flight = max_in_flight
        self._max_pending = max_pending
        self._rebuild_factor = rebuild_factor
        self._max_wait = max_wait
        self._on_error = on_error
        self._name = name

        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)  # the runner waits here
        self._looped = threading.Condition(self._lock)  # observers of runner progress
        self._heap: list[_HeapEntry] = []
        self._live: dict[Hashable, _Live[T]] = {}
        self._sequence = itertools.count()
        self._closed = False
        self._wake_generation = 0
        self._loop_count = 0
        self._in_flight = 0
        self._dispatched = 0
        self._batches = 0
        self._failed_batches = 0
        self._rebuilds = 0
        self._running = False
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._in_handler = threading.local()

    # -- pure API ---------------------------------------------------------------------------

    def submit(self, item_id: Hashable, item: T, available_at: datetime, priority: int = 0) -> bool:
        """Schedule ``item`` for ``available_at``; replaces any live item with the same id.

        Returns ``False`` (and changes nothing) when ``max_pending`` live items are already
        held and ``item_id`` is new. Raises :class:`DispatcherClosed` after ``close()``.
        """
        at = _aware_utc(available_at, "available_at")
        with self._lock:
            if self._closed:
                raise DispatcherClosed(
                    f"{self._name} is closed; cannot accept {item_id!r}: release its claim"
                )
            replacing = item_id in self._live
            if (
                not replacing
                and self._max_pending is not None
                and len(self._live) >= self._max_pending
            ):
                return False
            sequence = next(self._sequence)
            entry: _HeapEntry = (at, -priority, sequence, item_id)
            new_head = not self._heap or entry < self._heap[0]
            self._live[item_id] = _Live(sequence, item, at, priority)
            heapq.heappush(self._heap, entry)
            if replacing:
                self._maybe_rebuild_locked()
            if new_head:
                self._wake_locked()
            return True

    def cancel(self, item_id: Hashable) -> bool:
        """Forget ``item_id``; ``True`` if it was live (it will not be dispatched)."""
        with self._lock:
            if self._live.pop(item_id, None) is None:
                return False
            self._maybe_rebuild_locked()
            return True

    def pop_due(self, now: datetime, limit: int | None = None) -> list[T]:
        """Remove and return live items with ``available_at <= now``, in key order."""
        now = _aware_utc(now, "now")
        with self._lock:
            return self._pop_due_locked(now, limit)

    def next_due_at(self) -> datetime | None:
        """``available_at`` of the earliest live item, or ``None`` when empty."""
        with self._lock:
            self._drop_stale_head_locked()
            return self._heap[0][0] if self._heap else None

    def drain_pending(self) -> list[T]:
        """Remove and return every live item in key order (e.g. after losing a shard)."""
        with self._lock:
            return self._drain_locked()

    def __len__(self) -> int:
        with self._lock:
            return len(self._live)

    def __contains__(self, item_id: object) -> bool:
        with self._lock:
            return item_id in self._live

    @property
    def stale_count(self) -> int:
        """Heap entries whose id was canceled, replaced or already dispatched."""
        with self._lock:
            return len(self._heap) - len(self._live)

    @property
    def closed(self) -> bool:
        with self._lock:
            return self._closed

    def stats(self) -> DispatcherStats:
        with self._lock:
            return DispatcherStats(
                live=len(self._live),
                stale=len(self._heap) - len(self._live),
                in_flight=self._in_flight,
                dispatched=self._dispatched,
                batches=self._batches,
                failed_batches=self._failed_batches,
                rebuilds=self._rebuilds,
            )

    # -- runner -----------------------------------------------------------------------------

    def start(self) -> None:
        """Run the dispatch loop on a daemon thread until ``close()``."""
        with self._lock:
            self._claim_runner_locked()
            self._thread = threading.Thread(
                target=self._run, name=f"{self._name}-runner", daemon=True
            )
        self._thread.start()

    def run_until_closed(self) -> None:
        """Run the dispatch loop in the calling thread; returns after ``close()``."""
        with self._lock:
            self._claim_runner_locked()
        self._run()

    def wake(self) -> None:
        """Make the runner re-read the clocks now (after a clock jump; tests move time)."""
        with self._lock:
            self._wake_locked()

    @property
    def loop_count(self) -> int:
        """How many times the runner has evaluated the heap and gone back to waiting."""
        with self._lock:
            return self._loop_count

    def wait_for_loop(self, after: int, timeout: float) -> bool:
        """Block until ``loop_count > after`` (the runner re-evaluated); ``False`` on timeout."""
        with self._lock:
            return self._looped.wait_for(lambda: self._loop_count > after, timeout)

    def close(self, wait: bool = True, timeout: float | None = None) -> list[T]:
        """Stop accepting and dispatching; return the items never handed out, in key order.

        Batches already handed to the pool finish; with ``wait`` this call returns after they
        did (or after ``timeout`` seconds). A second call returns ``[]``. Called from inside
        ``handler`` it does not wait, since the pool would be waiting for that very call.
        """
        with self._lock:
            if self._closed:
                pending: list[T] = []
            else:
                self._closed = True
                pending = self._drain_locked()
                self._wake_locked()
            running = self._running
        if wait and running and not getattr(self._in_handler, "active", False):
            self._stopped.wait(timeout)
        return pending

    def _claim_runner_locked(self) -> None:
        if self._handler is None:
            raise InvalidPolicy(f"{self._name} has no handler to dispatch to", field="handler")
        if self._closed:
            raise DispatcherClosed(f"{self._name} is closed; create a new dispatcher")
        if self._running:
            raise SchedulerError(f"{self._name} already has a runner")
        self._running = True

    def _run(self) -> None:
        pool = ThreadPoolExecutor(
            max_workers=self._max_in_flight, thread_name_prefix=f"{self._name}-batch"
        )
        try:
            while True:
                batch = self._next_batch()
                if batch is None:
                    break
                pool.submit(self._run_batch, batch)
        finally:
            # Lets in-flight batches finish before close(wait=True) returns.
            pool.shutdown(wait=True)
            self._stopped.set()

    def _next_batch(self) -> list[T] | None:
        """Wait until a pool slot is free and something is due; ``None`` once closed."""
        with self._lock:
            while not self._closed:
                if self._in_flight >= self._max_in_flight:
                    self._park_locked(None, None)
                    continue
                now = self._clock.now()
                batch = self._pop_due_locked(now, self._batch_size)
                if batch:
                    self._in_flight += 1
                    self._batches += 1
                    self._dispatched += len(batch)
                    return batch
                head_at = self._heap[0][0] if self._heap else None
                self._park_locked(head_at, now)
            return None

    def _park_locked(self, head_at: datetime | None, now: datetime | None) -> None:
        """Wait until woken, or until ``head_at`` by the monotonic clock (wall-checked)."""
        self._loop_count += 1
        self._looped.notify_all()
        generation = self._wake_generation
        if head_at is None or now is None:
            self._wakeup.wait()
            return
        deadline = self._clock.monotonic() + (head_at - now).total_seconds()
        while self._wake_generation == generation and not self._closed:
            remaining = deadline - self._clock.monotonic()
            if remaining <= 0:
                return
            self._wakeup.wait(min(remaining, self._max_wait))
            if self._clock.now() >= head_at:
                return

    def _run_batch(self, batch: list[T]) -> None:
        assert self._handler is not None  # checked by _claim_runner_locked
        self._in_handler.active = True
        try:
            self._handler(batch)
        except Exception as exc:
            with self._lock:
                self._failed_batches += 1
            if self._on_error is not None:
                self._on_error(batch, exc)
        finally:
            self._in_handler.active = False
            with self._lock:
                self._in_flight -= 1
                self._wake_locked()

    # -- heap internals (caller holds the lock) ---------------------------------------------

    def _wake_locked(self) -> None:
        self._wake_generation += 1
        self._wakeup.notify_all()

    def _is_stale(self, entry: _HeapEntry) -> bool:
        live = self._live.get(entry[3])
        return live is None or live.sequence != entry[2]

    def _drop_stale_head_locked(self) -> None:
        while self._heap and self._is_stale(self._heap[0]):
            heapq.heappop(self._heap)

    def _pop_due_locked(self, now: datetime, limit: int | None) -> list[T]:
        due: list[T] = []
        while self._heap and (limit is None or len(due) < limit):
            self._drop_stale_head_locked()
            if not self._heap or self._heap[0][0] > now:
                break
            entry = heapq.heappop(self._heap)
            due.append(self._live.pop(entry[3]).item)
        if due:
            self._maybe_rebuild_locked()
        return due

    def _drain_locked(self) -> list[T]:
        live = sorted(self._live.values(), key=lambda v: (v.available_at, -v.priority, v.sequence))
        self._live.clear()
        self._heap.clear()
        return [v.item for v in live]

    def _maybe_rebuild_locked(self) -> None:
        stale = len(self._heap) - len(self._live)
        if stale > self._rebuild_factor * len(self._live):
            self._heap = [e for e in self._heap if not self._is_stale(e)]
            heapq.heapify(self._heap)
            self._rebuilds += 1
