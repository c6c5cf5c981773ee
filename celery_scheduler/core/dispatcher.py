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
- Whether work is due is decided by the caller's ``now`` only (``now >= available_at``), so
  nothing is dispatched early even if the wall clock is stepped back; the caller's loop sleeps
  until ``next_due_at()`` on its own clock.
- Admission: with ``max_pending`` set, ``submit`` of a new id returns ``False`` once that many
  items are live (replacing an existing id is always accepted). The caller then stops claiming;
  its claims are durable, so nothing is lost.

``close()`` rejects new work (``submit`` raises :class:`DispatcherClosed`) and returns every
item still held (due or not) in key order so the caller can release their claims.

The relay's loop drives it from one thread; every public method takes one lock, because a
stopping beat releases the held claims (``close()``) from a helper thread.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Hashable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Generic, TypeVar

from celery_scheduler.errors import InvalidPolicy, InvalidTiming, SchedulerError

T = TypeVar("T")


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
    rebuilds: int


def _aware_utc(value: datetime, field: str) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidTiming(f"{field} must be timezone-aware (got naive {value!r})", field=field)
    return value.astimezone(UTC)


class Dispatcher(Generic[T]):
    """Holds submitted items until their ``available_at``; ``pop_due`` hands them out."""

    def __init__(
        self,
        *,
        max_pending: int | None = None,
        rebuild_factor: float = 2.0,
        name: str = "dispatcher",
    ) -> None:
        if max_pending is not None and max_pending < 1:
            raise InvalidPolicy(
                f"max_pending must be >= 1 or None (got {max_pending})", field="max_pending"
            )
        if rebuild_factor <= 0:
            raise InvalidPolicy(
                f"rebuild_factor must be > 0 (got {rebuild_factor})", field="rebuild_factor"
            )
        self._max_pending = max_pending
        self._rebuild_factor = rebuild_factor
        self._name = name
        self._heap: list[_HeapEntry] = []
        self._live: dict[Hashable, _Live[T]] = {}
        self._sequence = itertools.count()
        self._closed = False
        self._rebuilds = 0
        self._lock = threading.Lock()

    def submit(self, item_id: Hashable, item: T, available_at: datetime, priority: int = 0) -> bool:
        """Schedule ``item`` for ``available_at``; replaces any live item with the same id.

        Returns ``False`` (and changes nothing) when ``max_pending`` live items are already
        held and ``item_id`` is new. Raises :class:`DispatcherClosed` after ``close()``.
        """
        at = _aware_utc(available_at, "available_at")
        with self._lock:
            return self._submit_locked(item_id, item, at, priority)

    def _submit_locked(self, item_id: Hashable, item: T, at: datetime, priority: int) -> bool:
        if self._closed:
            raise DispatcherClosed(
                f"{self._name} is closed; cannot accept {item_id!r}: release its claim"
            )
        replacing = item_id in self._live
        if not replacing and self._max_pending is not None and len(self._live) >= self._max_pending:
            return False
        sequence = next(self._sequence)
        self._live[item_id] = _Live(sequence, item, at, priority)
        heapq.heappush(self._heap, (at, -priority, sequence, item_id))
        if replacing:
            self._maybe_rebuild()
        return True

    def cancel(self, item_id: Hashable) -> bool:
        """Forget ``item_id``; ``True`` if it was live (it will not be dispatched)."""
        with self._lock:
            if self._live.pop(item_id, None) is None:
                return False
            self._maybe_rebuild()
            return True

    def pop_due(self, now: datetime, limit: int | None = None) -> list[T]:
        """Remove and return live items with ``available_at <= now``, in key order."""
        now = _aware_utc(now, "now")
        with self._lock:
            return self._pop_due_locked(now, limit)

    def _pop_due_locked(self, now: datetime, limit: int | None) -> list[T]:
        due: list[T] = []
        while self._heap and (limit is None or len(due) < limit):
            self._drop_stale_head()
            if not self._heap or self._heap[0][0] > now:
                break
            entry = heapq.heappop(self._heap)
            due.append(self._live.pop(entry[3]).item)
        if due:
            self._maybe_rebuild()
        return due

    def next_due_at(self) -> datetime | None:
        """``available_at`` of the earliest live item, or ``None`` when empty."""
        with self._lock:
            self._drop_stale_head()
            return self._heap[0][0] if self._heap else None

    def drain_pending(self) -> list[T]:
        """Remove and return every live item in key order (e.g. after losing a shard)."""
        with self._lock:
            return self._drain_locked()

    def _drain_locked(self) -> list[T]:
        live = sorted(self._live.values(), key=lambda v: (v.available_at, -v.priority, v.sequence))
        self._live.clear()
        self._heap.clear()
        return [v.item for v in live]

    def close(self) -> list[T]:
        """Stop accepting work; return the items never handed out, in key order.

        A second call returns ``[]``.
        """
        with self._lock:
            if self._closed:
                return []
            self._closed = True
            return self._drain_locked()

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, item_id: object) -> bool:
        return item_id in self._live

    @property
    def stale_count(self) -> int:
        """Heap entries whose id was canceled, replaced or already dispatched."""
        return len(self._heap) - len(self._live)

    @property
    def closed(self) -> bool:
        return self._closed

    def stats(self) -> DispatcherStats:
        with self._lock:
            stale = len(self._heap) - len(self._live)
            return DispatcherStats(live=len(self._live), stale=stale, rebuilds=self._rebuilds)

    # -- heap internals ----------------------------------------------------------------------

    def _is_stale(self, entry: _HeapEntry) -> bool:
        live = self._live.get(entry[3])
        return live is None or live.sequence != entry[2]

    def _drop_stale_head(self) -> None:
        while self._heap and self._is_stale(self._heap[0]):
            heapq.heappop(self._heap)

    def _maybe_rebuild(self) -> None:
        stale = len(self._heap) - len(self._live)
        if stale > self._rebuild_factor * len(self._live):
            self._heap = [e for e in self._heap if not self._is_stale(e)]
            heapq.heapify(self._heap)
            self._rebuilds += 1
