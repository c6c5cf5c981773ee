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
  judge's ``claim_bound``) plus one occurrence lease per fault during its wait (a killed
  or stalled holder keeps its slot until its lease expires; a lost message of the head
  waits for a wake or a redelivery).

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
        faults: list[tuple[datetime, datetime]],
        lease: float,
    ) -> None:
        self.keys = {sid: k for sid, s in scheds.items() if (k := cap_key(s)) is not None}
        self.longest = longest_bodies(scheds)
        self.deferral = deferral
        self.lag = lag
        self.faults = faults
        self.lease = lease
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
        until = t + timedelta(seconds=nominal + self.lag(t))
        since = t - timedelta(seconds=longest)
        faults = sum(1 for lo, hi in self.faults if lo < until and hi > since)
        return Bound(
            ahead=ahead,
            longest=longest,
            deferral=self.deferral,
            tolerance=self.lag(t) + faults * self.lease,
        )


def fault_spans(history: list[dict[str, Any]]) -> list[tuple[datetime, datetime]]:
    """(start, end) of every injected fault."""
    return [(r["start"], r["end"]) for r in history if r["type"] == "fault_end"]
