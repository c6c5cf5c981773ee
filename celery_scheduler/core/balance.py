"""How many and which logical shards a beat node should hold: pure decisions, no I/O.

Every node computes the same targets from the same set of live node names: the nodes are
sorted by name and the first ``shard_count % len(nodes)`` of them take one extra shard, so
the targets sum to exactly ``shard_count`` and differ by at most one. (A plain
``ceil(N / nodes)`` ceiling would let the first nodes fill up and leave a later one two or
more short of the others.) A node releases what it holds above its target and acquires free
shards up to it; the database's conditional UPDATEs decide races, so a plan computed from a
stale view can only fail to acquire, never double-own.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable
from dataclasses import dataclass


def targets(shard_count: int, nodes: Iterable[str]) -> dict[str, int]:
    """Fair share of each live node: ``shard_count // k``, plus one for the first remainder."""
    if shard_count < 1:
        raise ValueError(f"shard_count must be >= 1, got {shard_count}")
    ordered = sorted(set(nodes))
    if not ordered:
        return {}
    base, extra = divmod(shard_count, len(ordered))
    return {name: base + (1 if i < extra else 0) for i, name in enumerate(ordered)}


def target_for(node: str, shard_count: int, live_nodes: Iterable[str]) -> int:
    """This node's fair share; the node counts itself live even before others see it."""
    return targets(shard_count, {*live_nodes, node})[node]


def _offset(node: str, shard_count: int) -> int:
    digest = hashlib.blake2b(node.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shard_count


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What a node should do this round: ``release`` held shards, try to ``acquire`` others."""

    target: int
    release: tuple[int, ...] = ()
    acquire: tuple[int, ...] = ()


def plan(
    node: str,
    *,
    shard_count: int,
    live_nodes: Iterable[str],
    held: Collection[int],
    free: Collection[int],
    preferred: Collection[int] = (),
) -> Plan:
    """Shards to release (held above the target) and to try to acquire (free, up to it).

    ``free``: shards nobody holds now (no owner or an expired lease). ``preferred``: free
    shards to take first (e.g. ones this node owned before it lost track of them). Others are
    taken in rotation from an offset derived from the node name, so nodes joining together
    mostly ask for different rows. Released shards are the highest numbered, so a node
    keeps a stable low block and churn stays small.
    """
    target = target_for(node, shard_count, live_nodes)
    held_sorted = sorted(set(held))
    if len(held_sorted) > target:
        return Plan(target=target, release=tuple(held_sorted[target:]))
    want = target - len(held_sorted)
    candidates = set(free) - set(held_sorted)
    if want == 0 or not candidates:
        return Plan(target=target)
    start = _offset(node, shard_count)
    first = set(preferred) & candidates

    def rank(shard: int) -> tuple[int, int]:
        return (0 if shard in first else 1, (shard - start) % shard_count)

    return Plan(target=target, acquire=tuple(sorted(candidates, key=rank)[:want]))
