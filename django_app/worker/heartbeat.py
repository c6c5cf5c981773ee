"""One heartbeat thread per worker process renews the leases of the runs it holds.

A run registers its lease when the body starts (:meth:`Heartbeats.hold`) and drops it when
the body ends (:meth:`Held.stop`). The thread renews each held lease (and its concurrency
slot) every third of that lease, so a run shorter than a third of its lease writes nothing
and costs no thread start: the thread is started once per process, at its first run, and
waits between renewals. A thread per run used to cost each run a ``Thread.start()``, which
waits until the new thread is scheduled, and a ``join()``: most of the wrapper's time
outside the database on a busy machine (bench/README.md, "Worker throughput").

The guarantees are the per-run thread's: the first renewal comes one renewal period after
the body started; a renewal that finds the token stale marks the run ``lost`` and stops
renewing it (its completion will be rejected by the fencing check); a renewal that fails on
the database reconnects and tries again one period later; and once :meth:`Held.stop`
returns, no renewal of that run is in flight or will start. The thread uses its own
database connection while it holds runs, and closes it when it holds none.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import DatabaseError, InterfaceError, connection

from celery_scheduler.core.clock import SYSTEM_CLOCK, Clock
from django_app.db.connections import reset_after_error
from django_app.worker import finish
from django_app.worker.finish import logger


@dataclass(eq=False, kw_only=True)
class Held:
    """One run's lease, as the heartbeat thread renews it."""

    occurrence_id: str
    token: int
    lease: timedelta
    clock: Clock
    #: The occurrence's time as its claim read it: the history partition's key.
    scheduled_for: datetime | None
    #: The claim took a concurrency slot: a renewal that finds it taken is a lost lease.
    holds_slot: bool
    #: Monotonic time of the next renewal.
    due: float
    #: A renewal found the token stale: the attempt lost its lease.
    lost: bool = False
    owner: Heartbeats | None = field(default=None, repr=False)

    @property
    def period(self) -> float:
        return self.lease.total_seconds() / 3

    def stop(self) -> None:
        """Renew this lease no more; returns once no renewal of it is in flight."""
        if self.owner is not None:
            self.owner.release(self)


class Heartbeats:
    """The process's heartbeat thread and the leases it renews (see the module docstring)."""

    def __init__(self) -> None:
        self._reset()
        # A forked child (Celery's prefork pool) has no thread: it starts its own.
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._held: set[Held] = set()
        self._renewing: Held | None = None
        self._thread: threading.Thread | None = None
        #: When the thread will next wake by itself (monotonic); a run due earlier wakes it.
        self._wakes_at = 0.0
        self._connected = False

    def hold(
        self,
        occurrence_id: str,
        token: int,
        lease: timedelta,
        clock: Clock,
        scheduled_for: datetime | None = None,
        *,
        holds_slot: bool,
    ) -> Held:
        """Renew this lease every ``lease / 3`` from now until :meth:`Held.stop`."""
        held = Held(
            occurrence_id=occurrence_id, token=token, lease=lease, clock=clock, owner=self,
            due=time.monotonic() + lease.total_seconds() / 3, scheduled_for=scheduled_for,
            holds_slot=holds_slot,
        )  # fmt: skip
        with self._cond:
            self._held.add(held)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
                self._thread.start()
            elif held.due < self._wakes_at:
                self._cond.notify()
        return held

    def release(self, held: Held) -> None:
        with self._cond:
            self._held.discard(held)
            if threading.current_thread() is not self._thread:
                while self._renewing is held:
                    self._cond.wait()
            if not self._held and self._connected:
                self._cond.notify()  # let the thread close its connection

    def _run(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                due = [held for held in self._held if held.due <= now]
                if not due:
                    if not self._held and self._connected:
                        connection.close()  # this thread's own connection
                        self._connected = False
                    # Idle: wake after a default period anyway; a run due earlier notifies.
                    nearest = min((held.due for held in self._held), default=now + 60)
                    self._wakes_at = nearest
                    self._cond.wait(max(nearest - now, 0))
                    continue
            for held in due:
                with self._cond:
                    if held not in self._held:
                        continue  # stopped meanwhile
                    self._renewing = held
                try:
                    self._renew(held)
                finally:
                    with self._cond:
                        self._renewing = None
                        self._cond.notify_all()

    def _renew(self, held: Held) -> None:
        self._connected = True
        held.due = time.monotonic() + held.period
        try:
            renewed = finish.renew(
                held.occurrence_id, held.token, clock=held.clock, lease=held.lease,
                scheduled_for=held.scheduled_for, holds_slot=held.holds_slot,
            )  # fmt: skip
        except (DatabaseError, InterfaceError):
            # Reconnect for the next renewal: a killed connection is never retried.
            reset_after_error()
            logger.warning(
                "heartbeat of %s failed; retrying on a new connection",
                held.occurrence_id,
                exc_info=True,
                extra={"event": "heartbeat_failed", "occurrence_id": held.occurrence_id},
            )
            return
        if not renewed:
            held.lost = True
            with self._cond:
                self._held.discard(held)
            logger.warning(
                "occurrence %s: lease lost (token %s is stale)",
                held.occurrence_id,
                held.token,
                extra={"event": "lease_lost", "occurrence_id": held.occurrence_id},
            )


#: The process's heartbeats: every run of this worker process registers here.
HEARTBEATS = Heartbeats()


def hold(
    occurrence_id: str,
    token: int,
    lease: timedelta,
    clock: Clock = SYSTEM_CLOCK,
    scheduled_for: datetime | None = None,
    *,
    holds_slot: bool,
) -> Held:
    """Renew a run's lease from this process's heartbeat thread until ``stop()``;
    ``scheduled_for`` (the claim's) is the occurrence's partition key, ``holds_slot``
    whether the claim took a concurrency slot."""
    return HEARTBEATS.hold(occurrence_id, token, lease, clock, scheduled_for, holds_slot=holds_slot)
