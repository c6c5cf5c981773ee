"""Fair shares and rebalance plans (pure), including a simulated cluster under hypothesis.

The simulation plays the database's role the way ``django_app.cluster.shards`` relies on it: a node
plans from a snapshot taken at the start of the round (possibly stale by the time it acts),
releases only what it holds, and an acquire succeeds only if the shard is still free when
applied (the conditional UPDATE).
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from celery_scheduler.core.balance import Plan, plan, target_for, targets


def test_targets_sum_to_shard_count_and_differ_by_at_most_one() -> None:
    assert targets(64, ["b", "a", "c"]) == {"a": 22, "b": 21, "c": 21}
    assert targets(64, ["a"]) == {"a": 64}
    assert targets(2, ["a", "b", "c"]) == {"a": 1, "b": 1, "c": 0}
    assert targets(8, []) == {}


def test_target_counts_the_asking_node_as_live() -> None:
    assert target_for("new", 64, ["old"]) == 32
    assert target_for("solo", 64, []) == 64


def test_shard_count_must_be_positive() -> None:
    with pytest.raises(ValueError, match="shard_count must be >= 1, got 0"):
        targets(0, ["a"])


def test_plan_releases_the_highest_held_shards_above_target() -> None:
    result = plan("a", shard_count=8, live_nodes=["a", "b"], held=range(8), free=())
    assert result == Plan(target=4, release=(4, 5, 6, 7))


def test_plan_acquires_only_free_shards_and_prefers_own_orphans() -> None:
    result = plan(
        "b", shard_count=8, live_nodes=["a", "b"], held=[1], free=[0, 5, 6, 7], preferred=[6]
    )
    assert result.target == 4
    assert len(result.acquire) == 3
    assert result.acquire[0] == 6
    assert set(result.acquire) <= {0, 5, 6, 7}
    assert not result.release


def test_plan_at_target_does_nothing() -> None:
    assert plan("a", shard_count=4, live_nodes=["a", "b"], held=[0, 1], free=[2, 3]) == Plan(
        target=2
    )


def test_joining_nodes_start_at_different_offsets() -> None:
    firsts = {
        plan(f"node-{i}", shard_count=64, live_nodes=[], held=(), free=range(64)).acquire[0]
        for i in range(8)
    }
    assert len(firsts) > 1


class Cluster:
    """The lease table (shard -> owner) plus each node's idea of what it holds."""

    def __init__(self, shard_count: int) -> None:
        self.shard_count = shard_count
        self.owner: dict[int, str | None] = dict.fromkeys(range(shard_count))
        self.held: dict[str, set[int]] = {}

    def join(self, node: str) -> None:
        self.held.setdefault(node, set())

    def die(self, node: str) -> None:
        # Its leases expire: the shards become free, and it is no longer live.
        for shard in self.held.pop(node, set()):
            self.owner[shard] = None

    def round(self, rng: random.Random) -> None:
        live = set(self.held)
        free_snapshot = {s for s, o in self.owner.items() if o is None}
        order = sorted(live)
        rng.shuffle(order)
        plans = {
            n: plan(
                n,
                shard_count=self.shard_count,
                live_nodes=live,
                held=self.held[n],
                free=free_snapshot,
            )
            for n in order
        }
        for n in order:
            for shard in plans[n].release:
                assert self.owner[shard] == n, "released a shard it did not hold"
                self.owner[shard] = None
                self.held[n].discard(shard)
            for shard in plans[n].acquire:
                if self.owner[shard] is None:  # the conditional UPDATE
                    self.owner[shard] = n
                    self.held[n].add(shard)
        self.assert_consistent()

    def assert_consistent(self) -> None:
        seen: dict[int, str] = {}
        for n, shards in self.held.items():
            for s in shards:
                assert s not in seen, f"shard {s} held by {seen[s]} and {n}"
                seen[s] = n
                assert self.owner[s] == n
        assert {s for s, o in self.owner.items() if o is not None} == set(seen)

    def counts(self) -> dict[str, int]:
        return {n: len(s) for n, s in self.held.items()}

    def balanced(self) -> bool:
        counts = [len(s) for s in self.held.values()]
        if not counts:
            return True
        owned = sum(counts)
        return owned == self.shard_count and max(counts) - min(counts) <= 1


events = st.lists(
    st.tuples(st.sampled_from(["join", "die"]), st.integers(min_value=0, max_value=7)),
    min_size=1,
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(
    shard_count=st.integers(min_value=1, max_value=128),
    history=events,
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_cluster_never_double_owns_and_converges_to_shares_within_one(
    shard_count: int, history: list[tuple[str, int]], seed: int
) -> None:
    rng = random.Random(seed)
    cluster = Cluster(shard_count)
    for kind, i in history:
        if kind == "join":
            cluster.join(f"node-{i}")
        else:
            cluster.die(f"node-{i}")
        # A join takes two rounds (others release, then the joiner acquires); racing
        # acquirers that lost a conflict retry on the next round.
        expected = targets(shard_count, cluster.held)
        rounds = 0
        while cluster.counts() != expected and rounds < 20:
            cluster.round(rng)
            rounds += 1
        assert cluster.counts() == expected, f"not at targets after {rounds} rounds"
        assert cluster.balanced()
        assert rounds <= max(3, len(cluster.held) + 1)
