"""Tenant fairness on the relay and per-tenant trigger-rate buckets: pure, no I/O.

**Weighted fair order.** Each tenant's due rows keep their own order (``available_at``,
then higher ``priority`` first, then ``id``). The k-th row of a tenant (k = 1, 2, ...) gets
the *fair key* ``(k / weight, available_at, -priority, id)`` and a batch of ``size`` is the
``size`` rows with the smallest fair keys. So under contention a tenant of weight w gets
about ``size * w / (sum of the weights of tenants with work)`` rows of every batch, a tenant
with little work is served at once, and no tenant ever has a later row published before an
earlier one of its own. ``k / weight`` is an IEEE double division: the SQL in
:mod:`django_app.tenancy` computes the same double, so both agree bit for bit and ties fall
to ``available_at, -priority, id`` (``id`` is unique, so the order is total).

:func:`fair_order` is the definition (one sort, what the SQL does); :func:`next_batch` is a
heap merge over per-tenant queues that only looks at ``size`` rows; the tests check that
they agree.

**Trigger-rate buckets.** :class:`RateLimiter` keeps a token bucket per tenant: ``rate``
tokens a second, at most ``rate`` stored (one second of burst), full at first sight.
"""

from __future__ import annotations

import heapq
import math
import threading
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, TypeVar

T = TypeVar("T", bound=Hashable)


@dataclass(frozen=True, slots=True)
class DueRow(Generic[T]):
    """One due outbox row as the fairness rules see it."""

    id: int
    tenant: T
    available_at: datetime
    priority: int = 0

    def own_key(self) -> tuple[datetime, int, int]:
        """Order within the tenant: earlier first, then higher priority, then id."""
        return (self.available_at, -self.priority, self.id)


FairKey = tuple[float, datetime, int, int]


def weight_of(weights: Mapping[T, int], tenant: T) -> int:
    """A tenant's relay weight; missing or below 1 counts as 1 (0 would starve it)."""
    return max(int(weights.get(tenant, 1)), 1)


def fair_key(rank: int, weight: int, row: DueRow[T]) -> FairKey:
    """The sort key of the ``rank``-th (1-based) row of its tenant."""
    return (rank / max(weight, 1), *row.own_key())


def fair_order(rows: Iterable[DueRow[T]], weights: Mapping[T, int]) -> list[DueRow[T]]:
    """All ``rows`` in weighted fair order (the definition the SQL implements)."""
    by_tenant: dict[T, list[DueRow[T]]] = {}
    for row in rows:
        by_tenant.setdefault(row.tenant, []).append(row)
    keyed: list[tuple[FairKey, DueRow[T]]] = []
    for tenant, queue in by_tenant.items():
        weight = weight_of(weights, tenant)
        queue.sort(key=DueRow.own_key)
        keyed.extend((fair_key(k, weight, row), row) for k, row in enumerate(queue, start=1))
    keyed.sort(key=lambda pair: pair[0])
    return [row for _, row in keyed]


def next_batch(
    queues: Mapping[T, Sequence[DueRow[T]]], weights: Mapping[T, int], size: int
) -> list[DueRow[T]]:
    """The next batch of at most ``size`` rows, in fair order, from per-tenant queues.

    Each queue must already be in the tenant's own order (:meth:`DueRow.own_key`); only
    its head matters at each step, so this costs O(size log tenants).
    """
    heap: list[tuple[FairKey, T, int]] = []
    for tenant, queue in queues.items():
        if queue:
            heapq.heappush(heap, (fair_key(1, weight_of(weights, tenant), queue[0]), tenant, 0))
    batch: list[DueRow[T]] = []
    while heap and len(batch) < size:
        _, tenant, i = heapq.heappop(heap)
        queue = queues[tenant]
        batch.append(queue[i])
        if i + 1 < len(queue):
            key = fair_key(i + 2, weight_of(weights, tenant), queue[i + 1])
            heapq.heappush(heap, (key, tenant, i + 1))
    return batch


@dataclass(slots=True)
class _Bucket:
    rate: int
    tokens: float
    at: datetime

    def refill(self, now: datetime) -> None:
        # A clock that steps back refills nothing rather than draining the bucket.
        elapsed = max((now - self.at).total_seconds(), 0.0)
        self.tokens = min(float(self.rate), self.tokens + elapsed * self.rate)
        self.at = max(now, self.at)


class RateLimiter(Generic[T]):
    """Token buckets per tenant, safe to share between threads of one process.

    ``rate`` (messages per second) is passed on each call so a changed quota applies at
    once; ``None`` or ``0`` means no limit for that tenant.
    """

    def __init__(self) -> None:
        self._buckets: dict[T, _Bucket] = {}
        self._lock = threading.Lock()

    def admit(self, tenant: T, rate: int | None, wanted: int, now: datetime) -> int:
        """Take up to ``wanted`` tokens; returns how many rows may be published now."""
        if not rate:
            with self._lock:
                self._buckets.pop(tenant, None)
            return wanted
        with self._lock:
            bucket = self._buckets.get(tenant)
            if bucket is None:
                bucket = self._buckets[tenant] = _Bucket(rate=rate, tokens=float(rate), at=now)
            bucket.rate = rate
            bucket.refill(now)
            granted = min(wanted, math.floor(bucket.tokens))
            bucket.tokens -= granted
            return granted

    def exhausted(self, now: datetime) -> set[T]:
        """Tenants that could not publish a single row at ``now``."""
        with self._lock:
            out = set()
            for tenant, bucket in self._buckets.items():
                bucket.refill(now)
                if bucket.tokens < 1:
                    out.add(tenant)
            return out

    def reset(self) -> None:
        with self._lock:
            self._buckets.clear()
