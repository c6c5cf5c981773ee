"""Weighted fair order and per-tenant token buckets (pure), with hypothesis."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from celery_scheduler.core.fairness import (
    Bucket,
    DueRow,
    fair_order,
    fair_positions,
    next_batch,
)

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@st.composite
def workloads(draw: st.DrawFn) -> tuple[list[DueRow[str]], dict[str, int], int]:
    tenants = draw(st.lists(st.sampled_from("abcdef"), min_size=1, max_size=6, unique=True))
    weights = {t: draw(st.integers(min_value=0, max_value=7)) for t in tenants}
    rows = []
    for i in range(draw(st.integers(min_value=0, max_value=120))):
        rows.append(
            DueRow(
                id=i,
                tenant=draw(st.sampled_from(tenants)),
                available_at=T0 + timedelta(seconds=draw(st.integers(-3600, 5))),
                priority=draw(st.integers(0, 3)),
            )
        )
    return rows, weights, draw(st.integers(min_value=1, max_value=60))


def _queues(rows: list[DueRow[str]]) -> dict[str, list[DueRow[str]]]:
    queues: dict[str, list[DueRow[str]]] = {}
    for row in sorted(rows, key=DueRow.own_key):
        queues.setdefault(row.tenant, []).append(row)
    return queues


@given(workloads())
@settings(max_examples=300, deadline=None)
def test_heap_batches_equal_the_sorted_definition(
    work: tuple[list[DueRow[str]], dict[str, int], int],
) -> None:
    rows, weights, size = work
    assert next_batch(_queues(rows), weights, size) == fair_order(rows, weights)[:size]


@given(workloads())
@settings(max_examples=300, deadline=None)
def test_positions_of_rows_in_their_own_order_equal_the_sorted_definition(
    work: tuple[list[DueRow[str]], dict[str, int], int],
) -> None:
    rows, weights, _ = work
    own = sorted(rows, key=DueRow.own_key)
    positions = fair_positions([row.tenant for row in own], weights)
    assert [own[i] for i in positions] == fair_order(rows, weights)


@given(workloads())
@settings(max_examples=300, deadline=None)
def test_each_batch_is_a_fair_prefix_of_every_tenant(
    work: tuple[list[DueRow[str]], dict[str, int], int],
) -> None:
    rows, weights, size = work
    queues = _queues(rows)
    while any(queues.values()):
        batch = next_batch(queues, weights, size)
        assert len(batch) == min(size, sum(map(len, queues.values())))
        taken = Counter(row.tenant for row in batch)
        for tenant, queue in queues.items():
            # Own order kept: a tenant's rows in the batch are the head of its queue.
            assert [r for r in batch if r.tenant == tenant] == queue[: taken[tenant]]
        for t, queue in queues.items():
            if taken[t] == len(queue):
                continue
            w_t = max(weights[t], 1)
            for u in queues:
                # Nobody got more than its weight's share relative to a tenant left waiting.
                assert taken[u] * w_t <= (taken[t] + 1) * max(weights[u], 1)
        queues = {t: q[taken[t] :] for t, q in queues.items()}


def test_a_small_tenant_is_served_in_the_first_batch_of_a_storm() -> None:
    storm = [DueRow(i, "a", T0 - timedelta(minutes=10), 0) for i in range(5000)]
    strict = [DueRow(10_000 + i, "b", T0, 0) for i in range(50)]
    order = fair_order(storm + strict, {"a": 1, "b": 1})
    assert {r.id for r in order[:500] if r.tenant == "b"} == {r.id for r in strict}
    plain = sorted(storm + strict, key=DueRow.own_key)
    assert plain[-50:] == strict  # what plain available_at order would do


def test_weights_split_a_contended_batch() -> None:
    rows = [DueRow(i, t, T0, 0) for i, t in enumerate(["a"] * 1000 + ["b"] * 1000)]
    batch = next_batch(_queues(rows), {"a": 3, "b": 1}, 400)
    assert Counter(r.tenant for r in batch) == {"a": 300, "b": 100}


def test_bucket_admits_its_rate_then_refills_with_time() -> None:
    bucket = Bucket.full(10, T0)
    granted, bucket = bucket.take(10, 25, T0)
    assert granted == 10
    granted, bucket = bucket.take(10, 5, T0)
    assert granted == 0
    assert bucket.refilled(10, T0).tokens < 1  # exhausted
    granted, bucket = bucket.take(10, 5, T0 + timedelta(seconds=0.35))
    assert granted == 3
    granted, bucket = bucket.take(10, 50, T0 + timedelta(seconds=10))
    assert granted == 10  # burst capped at 1 s
    assert bucket.refilled(10, T0 + timedelta(seconds=10)).tokens < 1
    assert bucket.refilled(10, T0 + timedelta(seconds=11)).tokens >= 1


def test_bucket_ignores_a_clock_stepping_back() -> None:
    granted, bucket = Bucket.full(5, T0).take(5, 5, T0)
    assert granted == 5
    granted, bucket = bucket.take(5, 5, T0 - timedelta(hours=1))
    assert (granted, bucket.at) == (0, T0)
    granted, bucket = bucket.take(5, 5, T0 + timedelta(seconds=1))
    assert granted == 5


def test_unused_tokens_go_back_up_to_the_cap() -> None:
    granted, bucket = Bucket.full(4, T0).take(4, 3, T0)
    assert (granted, bucket.give_back(4, 2).tokens, bucket.give_back(4, 9).tokens) == (3, 3, 4)


def assert_within_the_bound(rate: int, admitted: list[tuple[int, int]]) -> None:
    """Grants dated in milliseconds: any window of T s admits at most rate * T + rate."""
    for start, _ in admitted:
        for end, _ in admitted:
            if end >= start:
                window = sum(n for at, n in admitted if start <= at <= end)
                assert window <= rate + rate * (end - start) / 1000 + 1e-9


@given(
    st.integers(min_value=1, max_value=50),
    st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 40)), min_size=1, max_size=60),
)
@settings(max_examples=200, deadline=None)
def test_bucket_never_exceeds_rate_times_window_plus_burst(
    rate: int, calls: list[tuple[int, int]]
) -> None:
    bucket = Bucket.full(rate, T0)
    admitted = []
    for offset_ms, wanted in sorted(calls):
        granted, bucket = bucket.take(rate, wanted, T0 + timedelta(milliseconds=offset_ms))
        admitted.append((offset_ms, granted))
    assert_within_the_bound(rate, admitted)


@given(
    st.integers(min_value=1, max_value=50),
    st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 40)), min_size=1, max_size=60),
)
@settings(max_examples=300, deadline=None, derandomize=True)
def test_bucket_holds_the_bound_when_takes_come_dated_out_of_order(
    rate: int, calls: list[tuple[int, int]]
) -> None:
    """Takes in the order they reach the bucket, each dated with its own time: a burst
    wave takes as of its instant, a second or so ahead, and other relays take in between
    (and clocks of several nodes differ). By their dates, the grants keep the bound."""
    bucket = Bucket.full(rate, T0)
    admitted = []
    for offset_ms, wanted in calls:
        granted, bucket = bucket.take(rate, wanted, T0 + timedelta(milliseconds=offset_ms))
        admitted.append((offset_ms, granted))
    assert_within_the_bound(rate, admitted)
