"""Dispatcher throughput (deselected by default: ``-m benchmark``).

Run: ``pytest -m benchmark tests/unit/core/test_dispatcher_bench.py -s``.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from celery_scheduler.core.dispatcher import Dispatcher

pytestmark = pytest.mark.benchmark

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def test_half_a_million_at_one_instant_pure() -> None:
    d: Dispatcher[int] = Dispatcher()
    n = 500_000
    start = time.perf_counter()
    for i in range(n):
        d.submit(i, i, T0, priority=i % 3)
    submitted = time.perf_counter()
    for i in range(0, n, 10):
        d.cancel(i)
    popped = 0
    while batch := d.pop_due(T0, limit=500):
        popped += len(batch)
    done = time.perf_counter()
    assert popped == n - n // 10
    print(
        f"\npure: submit {n / (submitted - start):,.0f}/s, "
        f"cancel+pop {popped / (done - submitted):,.0f}/s"
    )
