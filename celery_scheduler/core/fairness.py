"""Tenant fairness on the relay and per-tenant trigger-rate buckets: pure, no I/O.

**Weighted fair order.** Each tenant's due rows keep their own order (``available_at``,
then higher ``priority`` first, then ``id``). The k-th row of a tenant (k = 1, 2, ...) gets
the *fair key* ``(k / weight, available_at, -priority, id)`` and a batch of ``size`` is the
``size`` rows with the smallest fair keys. So under contention a tenant of weight w gets
about ``size * w / (sum of the weights of tenants with work)`` rows of every batch, a tenant
with little work is served at once, and no tenant ever has a later row published before an
earlier one of its own. ``k / weight`` is an IEEE double division: the SQL in
:mod:`django_app.tenancy.quotas` computes the same double, so both agree bit for bit and ties fall
to ``available_at, -priority, id`` (``id`` is unique, so the order is total).

:func:`fair_order` is the definition (one sort, what the SQL does); :func:`next_batch` is a
heap merge over per-tenant queues that only looks at ``size`` rows; :func:`fair_positions`
is the same order for rows already in their own order (the burst relay's held wave, where
building a ``DueRow`` per row would cost more than the ordering); the tests check that they
agree.

**Trigger-rate buckets.** :class:`Bucket` is the arithmetic of a tenant's token bucket:
``rate`` tokens a second, at most ``rate`` stored (one second of burst), full at first
sight. The state lives in the database (:mod:`django_app.tenancy.budget`), shared by every relay.
"""

from __future__ import annotations

import heapq
import math
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


def fair_positions(tenants: Sequence[T], weights: Mapping[T, int]) -> list[int]:
    """The weighted fair order of rows given only their tenants, as positions.

    ``tenants[i]`` is the tenant of row ``i``; the rows must already be in the order of
    :meth:`DueRow.own_key` (each tenant's rows in its own order, ties across tenants in
    ``available_at, -priority, id`` order). Returns the row positions in the order of
    :func:`fair_order`: the k-th row of a tenant of weight w sorts at k / w, ties keep the
    given order (the sort is stable).
    """
    ranks: dict[T, int] = {}
    per_tenant_weight: dict[T, float] = {}
    keys: list[float] = []
    append = keys.append
    for tenant in tenants:
        rank = ranks.get(tenant, 0) + 1
        ranks[tenant] = rank
        weight = per_tenant_weight.get(tenant)
        if weight is None:
            weight = per_tenant_weight[tenant] = float(weight_of(weights, tenant))
        append(rank / weight)
    return sorted(range(len(keys)), key=keys.__getitem__)


@dataclass(frozen=True, slots=True)
class Bucket:
    """A token bucket's state: ``tokens`` left at ``at`` (the rate is passed on each use,
    so a changed quota applies at once)."""

    tokens: float
    at: datetime

    @classmethod
    def full(cls, rate: int, now: datetime) -> Bucket:
        """A tenant's bucket at first sight: one second of burst."""
        return cls(tokens=float(rate), at=now)

    def refilled(self, rate: int, now: datetime) -> Bucket:
        """The bucket at ``now``: ``rate`` tokens a second, at most ``rate`` stored.

        A clock that steps back (another node's, or this one's) refills nothing rather than
        draining the bucket, and never moves ``at`` back.
        """
        elapsed = max((now - self.at).total_seconds(), 0.0)
        return Bucket(tokens=min(float(rate), self.tokens + elapsed * rate), at=max(now, self.at))

    def available(self, rate: int, now: datetime) -> float:
        """The tokens a taker at ``now`` may have.

        A bucket dated after ``now`` (a burst wave took its tokens as of its instant, still
        ahead; another node's clock is ahead) holds the refill up to that time, which is not
        there yet at ``now``: that much is not offered, so no taker in between spends it
        before it exists (the conservative side: a taker then may get less than it could).
        """
        bucket = self.refilled(rate, now)
        return bucket.tokens - max((bucket.at - now).total_seconds(), 0.0) * rate

    def take(self, rate: int, wanted: int, now: datetime) -> tuple[int, Bucket]:
        """Take up to ``wanted`` whole tokens at ``now`` (:meth:`available`); returns
        (granted, new state)."""
        bucket = self.refilled(rate, now)
        granted = max(min(wanted, math.floor(self.available(rate, now))), 0)
        return granted, Bucket(tokens=bucket.tokens - granted, at=bucket.at)

    def give_back(self, rate: int, count: int) -> Bucket:
        """Return ``count`` unused tokens (never above the one-second cap)."""
        return Bucket(tokens=min(float(rate), self.tokens + count), at=self.at)
