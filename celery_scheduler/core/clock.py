"""Time is a parameter: wall UTC for scheduled instants, a monotonic clock for waiting.

Nothing else in the package calls ``datetime.now()`` or ``time.monotonic()`` directly, so
tests move time with :class:`FrozenClock` instead of sleeping.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """Current wall time, timezone-aware UTC."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards (for timeouts and waits)."""
        ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class FrozenClock:
    """A clock that moves only when told to; ``sleep`` advances it instantly."""

    def __init__(self, start: datetime | None = None) -> None:
        if start is not None and start.tzinfo is None:
            raise ValueError("FrozenClock needs a timezone-aware start")
        self._now = (start or datetime(2026, 1, 1, tzinfo=UTC)).astimezone(UTC)
        self._mono = 1000.0
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def advance(self, seconds: float | timedelta) -> None:
        delta = seconds.total_seconds() if isinstance(seconds, timedelta) else float(seconds)
        if delta < 0:
            raise ValueError("a clock does not go backwards")
        with self._lock:
            self._now += timedelta(seconds=delta)
            self._mono += delta

    def set(self, instant: datetime) -> None:
        with self._lock:
            delta = (instant - self._now).total_seconds()
            if delta < 0:
                raise ValueError("a clock does not go backwards")
            self._now = instant.astimezone(UTC)
            self._mono += delta

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.advance(seconds)


SYSTEM_CLOCK: Clock = SystemClock()
