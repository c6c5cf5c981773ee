"""A stop (SIGTERM, SIGINT) that waits for the relay's commit once the broker has a message.

Celery's beat handles SIGTERM by raising ``SystemExit`` wherever the main thread is. Inside
a relay transaction after the publish, that rolls back the marks of messages the broker
already accepted: at the next start every one of them is sent again. At least once still
holds, but a deploy at the top of the hour would deliver a whole burst twice. Between the
first publish and the commit a stop is therefore held and delivered right after the block
(its lock waits are bounded by the relay's lock timeout; its marks take as long as the
wave's size asks); before the first publish it is delivered at once, since rolling back
then loses nothing. A second stop while one is held is delivered at once: an operator who
insists gets the rollback.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

#: The signals Celery's beat treats as "stop".
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopDeferral:
    """What :func:`stop_deferred` yields: :meth:`hold` once there is something to lose."""

    __slots__ = ("holding", "pending", "previous")

    def __init__(self) -> None:
        self.holding = False
        self.pending: int | None = None
        self.previous: dict[int, Any] = {}

    def hold(self) -> None:
        """From now until the block ends, a first stop waits for the block's end."""
        self.holding = True

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.holding and self.pending is None:
            self.pending = signum
            return
        self._deliver(signum)

    def _restore(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        self.previous = {}

    def _deliver(self, signum: int) -> None:
        self._restore()
        signal.raise_signal(signum)  # runs the handler that was there (Celery's) now


@contextmanager
def stop_deferred() -> Iterator[StopDeferral]:
    """Hold a stop that arrives after :meth:`StopDeferral.hold` until the block ends.

    Only the main thread receives signals; elsewhere (an embedded beat thread) the block
    changes nothing and the deferral is inert.
    """
    deferral = StopDeferral()
    if threading.current_thread() is not threading.main_thread():
        yield deferral
        return
    # A handler installed from C (getsignal is None) could not be put back: leave it be.
    ours = [s for s in STOP_SIGNALS if signal.getsignal(s) is not None]
    deferral.previous = {s: signal.signal(s, deferral._on_signal) for s in ours}
    try:
        yield deferral
    finally:
        pending, deferral.pending = deferral.pending, None
        if deferral.previous:
            if pending is not None:
                deferral._deliver(pending)
            else:
                deferral._restore()
