"""Shard leases on a real database: acquire, renew, expiry, takeover, release, fencing.

Time is a FrozenClock; "a node" is a ShardLeaser with its own name. These run on SQLite and
PostgreSQL; the racing-process claims are in ``test_shards_race.py`` and the acceptance test.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import OperationalError, connection, transaction

from celery_scheduler.core import ids
from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.errors import CoordinationUnavailable, LeaseLost, SchedulerError
from django_app.cluster import shards
from django_app.cluster.shards import ShardLeaser
from django_app.models import BeatNode, Occurrence, Schedule, ShardLease, Tenant
from django_app.wiring import materialize_due

pytestmark = pytest.mark.django_db

N = 8
LEASE = 30


@pytest.fixture
def node(frozen_clock: FrozenClock) -> Callable[[str], ShardLeaser]:
    def make(name: str) -> ShardLeaser:
        return ShardLeaser(name, clock=frozen_clock, shard_count=N, lease_seconds=LEASE)

    return make


def owners() -> dict[int, str]:
    return dict(ShardLease.objects.values_list("shard", "owner"))


def tokens() -> dict[int, int]:
    return dict(ShardLease.objects.values_list("shard", "fencing_token"))


def assert_db_matches(*leasers: ShardLeaser) -> None:
    """Every shard a node believes it holds is its own in the table, with its token; none twice."""
    seen: set[int] = set()
    table = {row.shard: row for row in ShardLease.objects.all()}
    for leaser in leasers:
        for shard, token in leaser.held.items():
            assert shard not in seen, f"shard {shard} held twice"
            seen.add(shard)
            assert table[shard].owner == leaser.node
            assert table[shard].fencing_token == token


def test_a_lone_node_creates_the_rows_and_acquires_every_shard(
    node: Callable[[str], ShardLeaser], frozen_clock: FrozenClock
) -> None:
    a = node("a")
    held = a.refresh()
    assert held == dict.fromkeys(range(N), 1)
    assert ShardLease.objects.count() == N
    assert set(owners().values()) == {"a"}
    assert set(ShardLease.objects.values_list("expires_at", flat=True)) == {
        frozen_clock.now() + timedelta(seconds=LEASE)
    }
    assert BeatNode.objects.get(name="a").last_seen == frozen_clock.now()


def test_renewal_extends_the_lease_and_keeps_the_token(
    node: Callable[[str], ShardLeaser], frozen_clock: FrozenClock
) -> None:
    a = node("a")
    first = a.refresh()
    frozen_clock.advance(LEASE - 1)
    assert a.refresh() == first
    assert tokens() == first
    assert set(ShardLease.objects.values_list("expires_at", flat=True)) == {
        frozen_clock.now() + timedelta(seconds=LEASE)
    }


def test_an_expired_lease_is_not_held_and_a_takeover_bumps_the_token(
    node: Callable[[str], ShardLeaser], frozen_clock: FrozenClock
) -> None:
    a, b = node("a"), node("b")
    old = a.refresh()
    frozen_clock.advance(LEASE + 1)
    assert a.held == {}, "a lease past its expiry must not count as held"
    # a's heartbeat is stale too, so b's fair share is everything.
    taken = b.refresh()
    assert taken == {s: t + 1 for s, t in old.items()}
    assert set(owners().values()) == {"b"}
    # a wakes up: it cannot renew what b took and learns it holds nothing.
    assert a.refresh() == {}
    assert_db_matches(a, b)


def test_a_stale_holders_fencing_check_fails_and_the_new_owners_passes(
    node: Callable[[str], ShardLeaser], frozen_clock: FrozenClock
) -> None:
    a, b = node("a"), node("b")
    stale = a.refresh()
    frozen_clock.advance(LEASE + 1)
    fresh = b.refresh()
    with transaction.atomic():
        with pytest.raises(LeaseLost, match=r"shard 3: lease with fencing token 1 owned by 'a'"):
            shards.check(3, stale[3], node="a", now=frozen_clock.now())
    with transaction.atomic():
        with pytest.raises(LeaseLost, match="fencing token 1 is no longer current"):
            shards.check(3, stale[3])  # the token alone is enough to fence
    with transaction.atomic():
        shards.check(3, fresh[3], node="b", now=frozen_clock.now())
        b.check(3)
    with pytest.raises(LeaseLost, match="node 'a' holds no lease on shard 3"):
        a.check(3)


@pytest.mark.django_db(transaction=True)
def test_check_refuses_to_run_outside_a_transaction(node: Callable[[str], ShardLeaser]) -> None:
    held = node("a").refresh()
    with pytest.raises(SchedulerError, match="must run inside the writer's transaction"):
        shards.check(0, held[0])


def test_release_happens_only_with_the_holders_token(
    node: Callable[[str], ShardLeaser], frozen_clock: FrozenClock
) -> None:
    a, b = node("a"), node("b")
    a.refresh()
    frozen_clock.advance(LEASE + 1)
    b.refresh()
    # a still believes in its old tokens; its release must not free b's shards.
    a._valid_until = frozen_clock.now() + timedelta(seconds=1)
    assert a.release_all() == 0
    assert set(owners().values()) == {"b"}
    assert not BeatNode.objects.filter(name="a").exists()
    assert b.release_all() == N
    assert set(owners().values()) == {""}
    assert not BeatNode.objects.filter(name="b").exists()


def test_a_shard_released_on_shutdown_is_taken_at_once(
    node: Callable[[str], ShardLeaser],
) -> None:
    a, b = node("a"), node("b")
    a.refresh()
    b.refresh()
    a.refresh()
    b.refresh()
    assert len(a.held) == len(b.held) == N // 2
    a.release_all()
    assert len(b.refresh()) == N, "no lease expiry to wait for after a clean release"
    assert_db_matches(a, b)


def test_a_joining_node_gets_half_within_two_rounds_and_no_shard_is_held_twice(
    node: Callable[[str], ShardLeaser], frozen_clock: FrozenClock
) -> None:
    a, b = node("a"), node("b")
    assert len(a.refresh()) == N
    for _ in range(2):
        frozen_clock.advance(LEASE / 3)
        b.refresh()
        assert_db_matches(a, b)
        a.refresh()
        assert_db_matches(a, b)
    b.refresh()
    assert len(a.held) == len(b.held) == N // 2
    assert set(a.held) | set(b.held) == set(range(N))
    assert_db_matches(a, b)


def test_a_dead_nodes_shards_move_after_one_lease_period(
    node: Callable[[str], ShardLeaser], frozen_clock: FrozenClock
) -> None:
    a, b = node("a"), node("b")
    for _ in range(2):
        a.refresh()
        b.refresh()
    assert len(b.held) == N // 2
    for _ in range(3):  # b keeps refreshing; a is gone without a word
        frozen_clock.advance(LEASE / 3 + 1)
        b.refresh()
    assert len(b.held) == N
    assert_db_matches(b)


@pytest.mark.django_db(transaction=True)
def test_database_down_raises_coordination_unavailable_and_holds_nothing(
    node: Callable[[str], ShardLeaser],
) -> None:
    a = node("a")
    assert len(a.refresh()) == N

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise OperationalError("connection refused (simulated)")

    with connection.execute_wrapper(refuse):
        with pytest.raises(CoordinationUnavailable, match="holding no shards until it answers"):
            a.refresh()
    assert a.held == {}
    # Once the database answers again the node takes its shards back under new tokens.
    assert a.refresh() == dict.fromkeys(range(N), 2)


def test_the_materializer_rejects_a_write_with_a_stale_token(
    node: Callable[[str], ShardLeaser], frozen_clock: FrozenClock, tenant: Tenant
) -> None:
    schedule_id = uuid.uuid4()
    shard = ids.shard_for(schedule_id, N)
    Schedule.objects.create(  # type: ignore[misc]  # next_run_at: a property
        id=schedule_id,
        tenant=tenant,
        name="every minute",
        task="billing.tick",
        kind="INTERVAL",
        interval_seconds=60,
        start_at=frozen_clock.now(),
        next_run_at=frozen_clock.now(),
        shard=shard,
    )
    a, b = node("a"), node("b")
    stale = a.refresh()
    frozen_clock.advance(LEASE + 1)
    b.refresh()
    report = materialize_due(clock=frozen_clock, shard_fencing=stale, horizon=timedelta(0))
    assert report.fenced == 1
    assert not Occurrence.objects.exists()
    report = materialize_due(clock=frozen_clock, shard_fencing=b.held, horizon=timedelta(0))
    assert report.fenced == 0
    assert Occurrence.objects.count() == 1
