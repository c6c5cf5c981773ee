"""Named fault points that a crash test arms to SIGKILL the process at an exact step.

Arm one with the environment variable ``CELERY_SCHEDULER_FAULT``:

- ``CELERY_SCHEDULER_FAULT=materialize.before_insert`` kills on the first hit;
- ``CELERY_SCHEDULER_FAULT=relay.after_publish:3`` kills on the third hit.

SIGKILL (not an exception) because the claim under test is "a process that dies here without
running any cleanup loses nothing": ``finally`` blocks, atexit hooks and open transactions
must not get a chance to tidy up. The variable is read once per process, so an unarmed point
costs one comparison.

``CELERY_SCHEDULER_FAULT_SIGNAL=STOP`` sends SIGSTOP instead: the process freezes at that
step with whatever it holds (a stalled VM, a GC pause), until someone sends SIGCONT;
``CELERY_SCHEDULER_FAULT_SIGNAL=TERM`` sends SIGTERM: an operator's stop (a deploy) at that
step.
"""

from __future__ import annotations

import os
import signal
import threading

from celery_scheduler.errors import SchedulerError

ENV_VAR = "CELERY_SCHEDULER_FAULT"

#: Every fault point the code base places. Arming an unknown name is refused (a typo in a
#: crash test must not silently test nothing): add new points here.
KNOWN_POINTS = frozenset(
    {
        "materialize.before_insert",
        "materialize.after_commit",
        "relay.before_publish",
        "relay.after_publish",
        "relay.before_mark",
        "worker.after_effect",
        "partitions.after_detach",
    }
)

#: ``CELERY_SCHEDULER_FAULT_SIGNAL`` values other than the default SIGKILL.
_SIGNALS = {"STOP": signal.SIGSTOP, "TERM": signal.SIGTERM}
_UNREAD = object()
_armed: object | tuple[str, int] | None = _UNREAD
_hits = 0
_lock = threading.Lock()


def _parse(raw: str) -> tuple[str, int] | None:
    raw = raw.strip()
    if not raw:
        return None
    name, sep, nth = raw.partition(":")
    count = int(nth) if sep else 1
    if name not in KNOWN_POINTS:
        raise SchedulerError(
            f"{ENV_VAR}={raw!r} names no fault point; known: {sorted(KNOWN_POINTS)}"
        )
    if count < 1:
        raise SchedulerError(f"{ENV_VAR}={raw!r}: the hit number must be >= 1")
    return name, count


def _armed_point() -> tuple[str, int] | None:
    global _armed
    if _armed is _UNREAD:
        _armed = _parse(os.environ.get(ENV_VAR, ""))
    return _armed  # type: ignore[return-value]


def reset() -> None:
    """Forget the cached arming and hit count (for tests that change the env in-process)."""
    global _armed, _hits
    with _lock:
        _armed = _UNREAD
        _hits = 0


def fault_point(name: str) -> None:
    """Kill this process with SIGKILL if ``name`` is armed and this is the armed hit."""
    armed = _armed_point()
    if armed is None or armed[0] != name:
        return
    global _hits
    with _lock:
        _hits += 1
        fire = _hits == armed[1]
    if fire:
        wanted = os.environ.get(ENV_VAR + "_SIGNAL", "").strip().upper()
        os.kill(os.getpid(), _SIGNALS.get(wanted, signal.SIGKILL))
