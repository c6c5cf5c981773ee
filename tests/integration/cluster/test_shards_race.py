"""Shard leases under real concurrency (PostgreSQL): nodes refreshing at the same instant.

Threads with their own connections stand in for nodes; the conditional UPDATEs and row
locks, not Python, must keep every shard with at most one owner.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from django.db import connection, transaction

from celery_scheduler.core.clock import FrozenClock
from django_app.cluster import shards
from django_app.cluster.shards import ShardLeaser
from django_app.models import ShardLease

pytestmark = [pytest.mark.concurrent_db, pytest.mark.django_db(transaction=True)]

N = 64
LEASE = 30


def in_threads(count: int, work: Callable[[int], None]) -> None:
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            work(i)
        except BaseException as exc:  # re-raised in the main thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a node hung"
    if errors:
        raise errors[0]


def assert_disjoint_and_current(leasers: list[ShardLeaser]) -> None:
    table = {row.shard: row for row in ShardLease.objects.all()}
    seen: dict[int, str] = {}
    for leaser in leasers:
        for shard, token in leaser.held.items():
            assert shard not in seen, f"shard {shard} held by {seen[shard]} and {leaser.node}"
            seen[shard] = leaser.node
            assert (table[shard].owner, table[shard].fencing_token) == (leaser.node, token)


def test_four_nodes_starting_together_never_share_a_shard_and_balance(
    frozen_clock: FrozenClock,
) -> None:
    leasers = [
        ShardLeaser(f"node-{i}", clock=frozen_clock, shard_count=N, lease_seconds=LEASE)
        for i in range(4)
    ]
    rounds = 6
    # The barrier's action runs alone between rounds: check the table, then move time.
    checks: list[list[int]] = []

    def between_rounds() -> None:
        assert_disjoint_and_current(leasers)
        checks.append([len(x.held) for x in leasers])
        frozen_clock.advance(LEASE / 3)

    barrier = threading.Barrier(4, action=between_rounds, timeout=30)

    def node(i: int) -> None:
        for _ in range(rounds):
            barrier.wait()
            leasers[i].refresh()
        barrier.wait()

    in_threads(4, node)
    assert len(checks) == rounds + 1
    assert checks[-1] == [N // 4] * 4, checks
    assert sum(checks[-1]) == N


def test_a_takeover_skips_a_shard_whose_writer_is_mid_transaction(
    frozen_clock: FrozenClock,
) -> None:
    """The old owner's fencing check locks the row: the new owner skips it until the commit."""
    a = ShardLeaser("a", clock=frozen_clock, shard_count=N, lease_seconds=LEASE)
    b = ShardLeaser("b", clock=frozen_clock, shard_count=N, lease_seconds=LEASE)
    old = a.refresh()
    checked, finish = threading.Event(), threading.Event()

    def writer(_: int) -> None:
        with transaction.atomic():
            shards.check(5, old[5])  # a's write began while its token was current
            checked.set()
            assert finish.wait(30)

    thread = threading.Thread(target=in_threads, args=(1, writer))
    thread.start()
    try:
        assert checked.wait(30)
        frozen_clock.advance(LEASE + 1)
        first = b.refresh()
        assert 5 not in first, "took a shard whose old owner was still inside a write"
        assert len(first) == N - 1
        assert ShardLease.objects.get(shard=5).fencing_token == old[5]
    finally:
        finish.set()
        thread.join(30)
    assert b.refresh()[5] == old[5] + 1
