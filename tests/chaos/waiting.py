"""The waiting bound the README states, as the judge applies it to capped schedules' runs.

README, "Waiting for a slot": a waiter gets a slot within (waiters ahead of it + 1) x the
group's longest body + the deferral interval. Here, for a fire time ``t`` of a schedule
with a concurrency cap (its group's, or its own):

* *waiters ahead* are the fire times of the same line (same cap key) planned before ``t``
  that had not started by ``t``: runs that started after ``t``, and planned times that never
  ran within the last ``RECENT`` longest bodies before ``t`` (they may have been waiting
  when they were invalidated; older ones cannot still hold the line);
* *the group's longest body* is the longest body the plan gives any member (``long`` or
  ``duration``);
* the faults are not part of the bound, so each run gets the delivery lag ordinary
  (uncapped) runs showed around it (:class:`tests.chaos.judge.Lags`, whose floor is the
  judge's ``claim_bound``) plus, per fault during its wait, what that fault can cost it:
  an occurrence lease (a killed or stalled holder keeps its slot until its lease expires),
  or, for a fault that can lose the waiter's own message (a broker restart or flush, a
  worker killed or stalled holding it), the redelivery step: the outbox publishes a message
  no worker received again ``redelivery`` seconds after its first publish, and the wait
  doubles per publish no worker received, at most :data:`MAX_BACKOFF_DOUBLINGS` times
  (docs/explanation/contracts.md, "Delivery", item 5), so the j-th such fault in a row
  costs up to ``redelivery x 2 ** min(j - 1, MAX_BACKOFF_DOUBLINGS)``. Faults are counted
  over the wait the bound allows, widened until the count settles (a later fault can lose a
  later copy).

The judge uses it twice: a run that started later than its bound is a ``slow_wait``
violation, and a capped fire time is MUST only if its bound ends before the judged window.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from tests.chaos.effects import Effect

#: Never-run times older than this many longest bodies are not counted as waiting ahead.
RECENT = 10
#: The redelivery wait doubles per publish no worker received, at most this many times.
MAX_BACKOFF_DOUBLINGS = 3
#: Faults that can lose a waiting occurrence's own message (the rest hold a slot or a beat).
LOSES_MESSAGES = frozenset({"redis_restart", "broker_flush", "worker_kill", "worker_stall"})


def cap_key(s: Any) -> str | None:
    """The line a schedule's runs wait in (``s``: a :class:`tests.chaos.judge.Sched`)."""
    c = s.create
    if not c.get("concurrency_limit"):
        return None
    group = c.get("concurrency_group")
    return f"group {s.tenant}/{group}" if group else f"cap of {s.key}"


def longest_bodies(scheds: dict[str, Any]) -> dict[str, float]:
    """The longest body the plan gives any member of each cap key."""
    longest: dict[str, float] = defaultdict(float)
    for s in scheds.values():
        key = cap_key(s)
        if key is not None:
            body = max(float(s.create.get("long") or 0), float(s.create.get("duration") or 0))
            longest[key] = max(longest[key], body)
    return dict(longest)


@dataclass(frozen=True, kw_only=True)
class Bound:
    ahead: int
    longest: float
    deferral: float
    tolerance: float

    @property
    def stated(self) -> float:
        """The README's bound, without the fault tolerance."""
        return (self.ahead + 1) * self.longest + self.deferral

    @property
    def seconds(self) -> float:
        return self.stated + self.tolerance

    def explain(self) -> str:
        return (
            f"bound ({self.ahead} ahead + 1) x {self.longest:.1f} s + {self.deferral:.0f} s"
            f" = {self.stated:.1f} s, + {self.tolerance:.1f} s for faults and delivery lag"
        )


class WaitingBound:
    """Each capped fire time's bound, from the plan, the planned times and the effects."""

    def __init__(
        self,
        scheds: dict[str, Any],
        planned: Mapping[str, Iterable[datetime]],
        effects: Iterable[Effect],
        *,
        deferral: float,
        lag: Callable[[datetime], float],
        faults: list[tuple[datetime, datetime, str]],
        lease: float,
        redelivery: float,
    ) -> None:
        self.keys = {sid: k for sid, s in scheds.items() if (k := cap_key(s)) is not None}
        self.longest = longest_bodies(scheds)
        self.deferral = deferral
        self.lag = lag
        self.faults = faults
        self.lease = lease
        self.redelivery = redelivery
        started: dict[tuple[str, datetime], datetime] = {}
        for e in effects:
            key = (e.schedule_id, e.scheduled_for)
            started[key] = min(started.get(key, e.started_at), e.started_at)
        # Per cap key: every planned fire time, in line order, with its first start (if any).
        self.line: dict[str, list[tuple[datetime, str, datetime | None]]] = defaultdict(list)
        for sid, times in planned.items():
            if sid in self.keys:
                for t in times:
                    self.line[self.keys[sid]].append((t, sid, started.get((sid, t))))
        for entries in self.line.values():
            entries.sort(key=lambda x: (x[0], x[1]))

    def capped(self, sid: str) -> bool:
        return sid in self.keys

    def of(self, sid: str, t: datetime) -> Bound:
        key = self.keys[sid]
        longest = self.longest[key]
        recent = t - timedelta(seconds=RECENT * longest)
        ahead = 0
        for t2, sid2, start in self.line[key]:
            if (t2, sid2) >= (t, sid):
                break
            if (start is not None and start > t) or (start is None and t2 >= recent):
                ahead += 1
        nominal = (ahead + 1) * longest + self.deferral
        since = t - timedelta(seconds=longest)
        tolerance = self.lag(t)
        for _ in range(len(self.faults) + 1):  # each pass can only add faults
            until = t + timedelta(seconds=nominal + tolerance)
            during = [kind for lo, hi, kind in self.faults if lo < until and hi > since]
            widened = self.lag(t) + self.fault_allowance(during)
            if widened == tolerance:
                break
            tolerance = widened
        return Bound(ahead=ahead, longest=longest, deferral=self.deferral, tolerance=tolerance)

    def fault_allowance(self, kinds: list[str]) -> float:
        """What the faults of ``kinds`` (in order) can add to one run's wait, at most."""
        total, lost = 0.0, 0
        for kind in kinds:
            step = 0.0
            if kind in LOSES_MESSAGES:
                step = self.redelivery * 2 ** min(lost, MAX_BACKOFF_DOUBLINGS)
                lost += 1
            total += max(self.lease, step)
        return total


def fault_spans(history: list[dict[str, Any]]) -> list[tuple[datetime, datetime, str]]:
    """(start, end, kind) of every injected fault, in order."""
    spans = [(r["start"], r["end"], r["kind"]) for r in history if r["type"] == "fault_end"]
    return sorted(spans)
