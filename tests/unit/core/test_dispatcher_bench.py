"""Dispatcher throughput and dispatch lag (deselected by default: ``-m benchmark``).

Run: ``pytest -m benchmark tests/unit/core/test_dispatcher_bench.py -s``. Figures are printed so a
run can be compared with the SPEC's "500,000 at the top of the hour, p99 within 5 s".
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest

from celery_scheduler.core.clock import SystemClock
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


def test_threaded_dispatch_lag_real_clock() -> None:
    clock = SystemClock()
    n = 100_000
    lags: list[float] = []
    lock = threading.Lock()
    all_done = threading.Event()

    def handler(batch: list[datetime]) -> None:
        now = clock.now()
        with lock:
            lags.extend((now - due).total_seconds() for due in batch)
            if len(lags) >= n:
                all_done.set()

    d: Dispatcher[datetime] = Dispatcher(handler, clock=clock, batch_size=200, max_in_flight=4)
    d.start()
    due = clock.now() + timedelta(seconds=2)
    for i in range(n):
        d.submit(i, due, due)
    assert all_done.wait(60)
    d.close()
    lags.sort()
    assert lags[0] >= 0, "dispatched before available_at"
    p50, p99 = lags[len(lags) // 2], lags[int(len(lags) * 0.99)]
    print(f"\nthreaded: {n} items due at one instant, lag p50={p50:.3f}s p99={p99:.3f}s")
