"""How far ahead to plan: sized from the work actually due and the rates this node measured.

A fixed lead time is either too short for a large burst (500,000 hourly crons need minutes
of materializing and preparing before their instant) or far too long for everyday loads
(every per-minute schedule would carry an hour of future rows). So the beat sizes each lead
from two readings:

* ``pending``: the rows this stage will have to handle before the far end of its largest
  allowed lead (read from an index, capped: past the cap the lead is at its ceiling anyway);
* ``rate``: the rows per second this stage achieved on this node, measured over passes large
  enough to mean something (:class:`RateMeter`), or a conservative assumed rate until then.

``lead = floor + safety * pending / rate``, clamped to ``[floor, ceiling]``. The safety factor
covers the work arriving while the stage runs and the stages after it; a lead too long costs
only rows held (bounded) a little earlier, a lead too short costs lateness.

Pure: no I/O, no clock. The beat and the burst relay feed it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: Work ahead counts double: the stage must finish with time to spare for the next one.
SAFETY = 2.0
#: Passes smaller than this say more about fixed costs than about throughput.
MIN_MEASURED_ROWS = 1_000
#: Weight of the newest measurement in the moving average.
SMOOTHING = 0.3


def lead_seconds(
    pending: int, rate: float, *, floor: float, ceiling: float, safety: float = SAFETY
) -> float:
    """Seconds ahead a stage must start for ``pending`` rows at ``rate`` rows/s.

    ``floor`` is the lead for a light load (the configured minimum), ``ceiling`` the most
    this stage may reach ahead (memory and invalidation cost bound it).
    """
    if floor < 0 or ceiling < floor:
        raise ValueError(f"need 0 <= floor <= ceiling, got floor={floor} ceiling={ceiling}")
    if rate <= 0:
        raise ValueError(f"rate must be > 0 rows/s, got {rate}")
    if pending <= 0:
        return floor
    return min(ceiling, floor + safety * pending / rate)


def pending_cap(rate: float, *, floor: float, ceiling: float, safety: float = SAFETY) -> int:
    """Rows past which the lead is at its ceiling anyway: counting further is wasted work."""
    return max(1, int((ceiling - floor) * rate / safety) + 1)


@dataclass
class RateMeter:
    """Rows per second a stage achieves, smoothed; ``assumed`` until a large pass is seen."""

    assumed: float
    rate: float = field(init=False)
    measured: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        if self.assumed <= 0:
            raise ValueError(f"assumed rate must be > 0, got {self.assumed}")
        self.rate = self.assumed

    def observe(self, rows: int, seconds: float) -> None:
        """Record one pass; passes too small to measure throughput are ignored."""
        if rows < MIN_MEASURED_ROWS or seconds <= 0:
            return
        sample = rows / seconds
        self.rate = (
            sample if not self.measured else (1 - SMOOTHING) * self.rate + SMOOTHING * sample
        )
        self.measured = True
