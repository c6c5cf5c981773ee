"""celery_scheduler.core.lead: the lead time sized from pending work and measured rates."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from celery_scheduler.core.lead import RateMeter, lead_seconds, pending_cap


def test_light_load_keeps_the_floor() -> None:
    assert lead_seconds(0, 5_000, floor=60, ceiling=900) == 60
    assert lead_seconds(100, 5_000, floor=60, ceiling=900) == pytest.approx(60.04)


def test_a_burst_moves_the_lead_ahead_by_twice_its_duration() -> None:
    # 500,000 rows at 10,000 rows/s take 50 s: start 100 s (+ floor) ahead.
    assert lead_seconds(500_000, 10_000, floor=60, ceiling=900) == pytest.approx(160)


def test_the_ceiling_bounds_the_lead() -> None:
    assert lead_seconds(10_000_000, 1_000, floor=60, ceiling=900) == 900


def test_past_the_cap_the_lead_is_at_its_ceiling() -> None:
    cap = pending_cap(2_000, floor=60, ceiling=900)
    assert lead_seconds(cap, 2_000, floor=60, ceiling=900) == 900
    assert lead_seconds(cap - 2_000, 2_000, floor=60, ceiling=900) < 900


@given(
    pending=st.integers(0, 10**8),
    rate=st.floats(1, 10**6),
    floor=st.floats(0, 300),
    extra=st.floats(0, 3_000),
)
def test_lead_is_within_bounds_and_grows_with_pending(
    pending: int, rate: float, floor: float, extra: float
) -> None:
    ceiling = floor + extra
    lead = lead_seconds(pending, rate, floor=floor, ceiling=ceiling)
    assert floor <= lead <= ceiling
    assert lead_seconds(pending + 1_000, rate, floor=floor, ceiling=ceiling) >= lead


@pytest.mark.parametrize(
    ("pending", "rate", "floor", "ceiling"),
    [(1, 0, 0, 1), (1, -5, 0, 1), (1, 1, 5, 4), (1, 1, -1, 4)],
)
def test_nonsense_inputs_are_refused(
    pending: int, rate: float, floor: float, ceiling: float
) -> None:
    with pytest.raises(ValueError, match=r"floor|rate"):
        lead_seconds(pending, rate, floor=floor, ceiling=ceiling)


def test_rate_meter_ignores_small_passes_and_smooths_large_ones() -> None:
    meter = RateMeter(assumed=2_000)
    meter.observe(50, 1.0)  # fixed costs, not throughput
    assert (meter.rate, meter.measured) == (2_000, False)
    meter.observe(10_000, 1.0)
    assert (meter.rate, meter.measured) == (10_000, True)
    meter.observe(20_000, 1.0)
    assert 10_000 < meter.rate < 20_000
    with pytest.raises(ValueError, match="assumed rate"):
        RateMeter(assumed=0)
