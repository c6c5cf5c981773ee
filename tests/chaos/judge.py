"""The independent judge: what should have happened, from the driver's record alone.

Inputs: the driver's history (every schedule's creation, every lifecycle call with its
wall-clock start/end and result, every fault) and the effect log (``chaos.effect``: one row
per business effect). The scheduler's own tables are not read, except through
``manage.py reconcile``, whose answer is checked against the judge's.

Fire times come from the project's pure time math (``celery_scheduler.core.timemath``)
applied to the timing the driver asked for. Each (schedule, fire time) is classified:

* MUST: the schedule was active with that timing well before and after it; it must have
  run exactly once by business effect;
* MAY: near a boundary whose outcome the contracts leave open (a call that invalidated it
  while it may still have been waiting for a worker, a time that passed while paused and
  is subject to the misfire policy on resume, a misfire-prone schedule, an overlap skip, a
  poisoned time that went DEAD, the start and the end of the judged window): at most once;
* anything else: never.

Checks, each violation listed with its evidence: at most one effect per (schedule,
scheduled_for) and per manual occurrence; no effect for a time that was never planned; no
effect started before its ``available_at``; no effect delivered after its version was
invalidated (the delivery time is a lower bound of the claim); every MUST time ran (one
whose body started, then waited to be claimed again when a version bump canceled it, is
excused: a claimed time is never planned again); no concurrency cap, overlap policy or
tenant ``max_running`` exceeded by the effects' body intervals; no schedule created beyond
its tenant's ``max_schedules``; and the reconciler
agrees (no ABSENT, every SUCCEEDED has its effect, every effect's occurrence is SUCCEEDED).

A worker SIGSTOPped past its occurrence lease may finish a body after its slot was taken
over; ``@idempotent_task`` re-checks the claim before it commits, so such a body's effect
rolls back and no excuse is made for it: an overlap or a disagreement involving it is a
violation like any other (the evidence says the body was stalled).
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from celery_scheduler.core import ids, timemath
from tests.chaos import waiting
from tests.chaos.effects import Effect
from tests.chaos.fate import is_poisoned
from tests.chaos.waiting import cap_key

MUST, MAY = "MUST", "MAY"
#: Calls that make a new version (and so invalidate the unclaimed work of the old one).
BUMPS = ("update", "pause", "resume", "cancel")


@dataclass(frozen=True, kw_only=True)
class JudgeConfig:
    judge_from: datetime  # MUST only for times at or after this
    judge_to: datetime  # ... and whose available time is at or before this
    occurrence_lease: float
    #: How long a due occurrence may plausibly wait for a worker under the injected faults
    #: (redelivery + leases + backlog): a call invalidating it within this margin may win.
    claim_bound: float = 40.0
    #: Schedules whose max_lateness is below this may legitimately misfire after a fault.
    late_safe: float = 120.0
    default_max_lateness: float = 300.0
    #: The deferral interval of the README's waiting bound (django_app.worker.claim.DEFER).
    deferral: float = 1.0
    #: The run's ``redelivery_timeout_seconds``: a lost message is published again this long
    #: after its first publish (then twice, four, eight times as long).
    redelivery: float = 10.0


@dataclass
class Violation:
    kind: str
    what: str
    evidence: list[str] = field(default_factory=list)

    def render(self) -> str:
        lines = [f"[{self.kind}] {self.what}"]
        lines += [f"      {e}" for e in self.evidence]
        return "\n".join(lines)


@dataclass
class Verdict:
    violations: list[Violation] = field(default_factory=list)
    excused: list[Violation] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, what: str, evidence: Iterable[str] = ()) -> None:
        self.violations.append(Violation(kind, what, list(evidence)))

    def excuse(self, kind: str, what: str, evidence: Iterable[str] = ()) -> None:
        self.excused.append(Violation(kind, what, list(evidence)))

    def by_kind(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for v in self.violations:
            out[v.kind] += 1
        return dict(out)


@dataclass
class Segment:
    """A stretch during which the schedule was ACTIVE with one timing."""

    timing: dict[str, Any]
    start: tuple[datetime, datetime]  # the call that began it (start, end)
    start_op: str
    end: tuple[datetime, datetime] | None = None
    end_op: str = ""


@dataclass
class Sched:
    key: str
    schedule_id: str
    tenant: str
    create: dict[str, Any]
    calls: list[dict[str, Any]] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    #: (paused from, resumed at, the timings it had meanwhile)
    gaps: list[tuple[datetime, datetime, list[dict[str, Any]]]] = field(default_factory=list)
    #: version -> (flexible window, end of the call that invalidated it or None)
    versions: dict[int, tuple[int, datetime | None]] = field(default_factory=dict)
    canceled_at: datetime | None = None

    @property
    def lateness(self) -> float | None:
        value = self.create.get("max_lateness")
        return None if value is None else float(value)


def trigger_of(timing: dict[str, Any]) -> timemath.Trigger:
    if "cron" in timing:
        return timemath.CronTrigger(expression=timing["cron"], timezone=timing["timezone"])
    if "interval" in timing:
        return timemath.IntervalTrigger(
            every=timedelta(seconds=timing["interval"]), anchor=timing["start_at"]
        )
    return timemath.OneOffTrigger(run_at=timing["run_at"])


def times_between(timing: dict[str, Any], lo: datetime, hi: datetime) -> list[datetime]:
    """Fire times of ``timing`` in ``[lo, hi]``."""
    trigger = trigger_of(timing)
    first = trigger.first_at_or_after(lo)
    if first is None or first > hi:
        return []
    return [first, *timemath.fire_times(trigger, first, until=hi)]


def build(history: list[dict[str, Any]], end: datetime) -> dict[str, Sched]:
    """Each schedule's segments, pause gaps and versions, from the driver's record."""
    scheds: dict[str, Sched] = {}
    for rec in history:
        if rec["type"] == "create" and rec.get("ok"):
            scheds[rec["schedule_id"]] = Sched(
                key=rec["key"], schedule_id=rec["schedule_id"], tenant=rec["tenant"], create=rec
            )
        elif rec["type"] == "call" and rec.get("schedule_id") in scheds:
            scheds[rec["schedule_id"]].calls.append(rec)
    for s in scheds.values():
        c = s.create
        timing, window, state = c["timing"], int(c.get("window") or 0), "ACTIVE"
        s.versions[int(c.get("version", 1))] = (window, None)
        current = int(c.get("version", 1))
        seg: Segment | None = Segment(
            timing=timing, start=(c["start"], c["end"]), start_op="create"
        )
        paused_at: tuple[datetime, datetime] | None = None
        paused_timings: list[dict[str, Any]] = []
        for call in sorted(s.calls, key=lambda r: r["start"]):
            if not call.get("ok") or call["op"] not in BUMPS or not call.get("changed", True):
                continue
            span = (call["start"], call["end"])
            version = int(call["version"])
            s.versions[current] = (s.versions[current][0], call["end"])
            if call["op"] == "update":
                window = int(call.get("window", window) or 0)
            s.versions[version] = (window, None)
            current = version
            new_state = call.get("state", state)
            if call["op"] == "update":
                new_timing = call.get("timing") or timing
                if seg is not None and new_timing != timing:
                    seg.end, seg.end_op = span, "update (timing)"
                    s.segments.append(seg)
                    seg = Segment(timing=new_timing, start=span, start_op="update (timing)")
                timing = new_timing
                paused_timings.append(timing)
            elif call["op"] in ("pause", "cancel") and seg is not None:
                seg.end, seg.end_op = span, call["op"]
                s.segments.append(seg)
                seg = None
                if call["op"] == "pause":
                    paused_at, paused_timings = span, [timing]
            elif call["op"] == "resume" and new_state == "ACTIVE":
                if paused_at is not None:
                    s.gaps.append((paused_at[0], call["end"], paused_timings))
                paused_at = None
                seg = Segment(timing=timing, start=span, start_op="resume")
            if call["op"] == "cancel":
                s.canceled_at = call["end"]
                if paused_at is not None:  # canceled while paused: the gap ends here
                    s.gaps.append((paused_at[0], call["end"], paused_timings))
                    paused_at = None
            state = new_state
        if seg is not None:
            s.segments.append(seg)
        if paused_at is not None:
            s.gaps.append((paused_at[0], end, paused_timings))
    return scheds


class Lags:
    """Observed delivery lags (delivered_at - available_at) of the effects, by delivery time.

    The judge does not assume a fast system: how long a due occurrence may plausibly wait for
    a worker near an instant is what the effects around that instant actually waited.
    """

    def __init__(self, points: list[tuple[datetime, float]], floor: float) -> None:
        self.points = sorted(points)
        self.floor = floor

    def around(
        self, at: datetime, before: float = 90, after: float = 60, floor: float | None = None
    ) -> float:
        lo, hi = at - timedelta(seconds=before), at + timedelta(seconds=after)
        seen = [lag for when, lag in self.points if lo <= when <= hi]
        return max([self.floor if floor is None else floor, *(1.5 * lag + 5 for lag in seen)])


def classify(
    s: Sched,
    cfg: JudgeConfig,
    end: datetime,
    lags: Lags,
    slot_wait: Callable[[datetime], float] | None = None,
) -> dict[datetime, str]:
    """MUST / MAY for every fire time the schedule may run; absent keys: never.

    ``slot_wait(t)``: how long the run of ``t`` may wait for a slot (the waiting bound):
    it is MUST only if that wait ends inside the judged window.
    """
    out: dict[datetime, str] = {}

    def mark(t: datetime, status: str) -> None:
        if out.get(t) != MUST:
            out[t] = status

    capped = 1.5 if s.create.get("concurrency_limit") else 1.0
    max_window = max(w for w, _ in s.versions.values())
    lateness = s.lateness if s.lateness is not None else cfg.default_max_lateness
    maybe_only = s.create.get("overlap_policy", "ALLOW") != "ALLOW" or lateness < cfg.late_safe
    for seg in s.segments:
        hi = seg.end[1] if seg.end else end
        lo = seg.start[0]
        if "run_at" in seg.timing and seg.start_op != "resume":
            lo = min(lo, seg.timing["run_at"])  # a one-off may be created for a past instant
        core_hi = None
        if seg.end is not None:
            bound = lags.around(seg.end[0]) * capped
            core_hi = seg.end[0] - timedelta(seconds=bound)
        for t in times_between(seg.timing, lo, hi):
            if t < seg.start[1] or (core_hi is not None and t >= core_hi):
                mark(t, MAY)
                continue
            must = (
                not maybe_only
                and t >= cfg.judge_from
                and t + timedelta(seconds=max_window + (slot_wait(t) if slot_wait else 0))
                <= cfg.judge_to
                and not (s.create.get("poison") and is_poisoned(s.schedule_id, t))
            )
            mark(t, MUST if must else MAY)
    for lo, hi, timings in s.gaps:
        for timing in timings:
            for t in times_between(timing, lo, hi):
                mark(t, MAY)
    return out


def _iso(t: datetime) -> str:
    return t.isoformat()


def _fmt(t: datetime | None) -> str:
    return "-" if t is None else f"{t:%H:%M:%S.%f}"[:-3]


def describe(s: Sched) -> list[str]:
    c = s.create
    lines = [
        f"schedule {s.key} {s.schedule_id} tenant={s.tenant} timing={_timing(c['timing'])}"
        f" overlap={c.get('overlap_policy')} cap={c.get('concurrency_limit')}"
        f"/{c.get('concurrency_group') or '-'} window={c.get('window')}"
        f" misfire={c.get('misfire_policy')}/{c.get('max_lateness')}"
        f" created {_fmt(c['start'])}..{_fmt(c['end'])}"
    ]
    for call in sorted(s.calls, key=lambda r: r["start"]):
        if not call.get("ok"):
            res = f"failed {call.get('error', '')[:80]}"
        elif call["op"] in ("run_now", "replay"):
            res = f"-> {call.get('occurrence_id')} for {_fmt(call.get('scheduled_for'))}"
        else:
            res = f"-> v{call.get('version')} {call.get('state', '')}"
        extra = ""
        if call["op"] == "update":
            extra = f" {call.get('change', '')} {_timing(call.get('timing') or c['timing'])}"
        lines.append(f"  {call['op']}{extra} {_fmt(call['start'])}..{_fmt(call['end'])} {res}")
    return lines


def _timing(t: dict[str, Any]) -> str:
    if "cron" in t:
        return f"cron '{t['cron']}' {t['timezone']}"
    if "interval" in t:
        return f"every {t['interval']}s from {_fmt(t['start_at'])}"
    return f"once at {_fmt(t['run_at'])}"


def stalls(
    history: list[dict[str, Any]], lease: float
) -> dict[int, list[tuple[datetime, datetime]]]:
    """Per pid: SIGSTOP windows long enough for its occurrence lease to expire."""
    out: dict[int, list[tuple[datetime, datetime]]] = defaultdict(list)
    for rec in history:
        if rec["type"] == "fault_end" and rec["kind"] == "worker_stall" and rec.get("pid"):
            if (rec["end"] - rec["start"]).total_seconds() > lease * 2 / 3:
                out[int(rec["pid"])].append((rec["start"], rec["end"]))
    return out


def _bumped_after(s: Sched, started_at: datetime) -> bool:
    """Did a call that makes a new version end after a body of ``s`` started?"""
    return any(
        c.get("ok") and c["op"] in BUMPS and c.get("changed", True) and c["end"] > started_at
        for c in s.calls
    )


def judge(
    history: list[dict[str, Any]],
    effects: list[Effect],
    cfg: JudgeConfig,
    *,
    end: datetime,
    reconcile: dict[str, Any] | None = None,
    attempts: list[dict[str, Any]] | None = None,
) -> Verdict:
    verdict = Verdict()
    scheds = build(history, end)
    replayed = {
        str(r.get("occurrence_id")) for r in history if r["type"] == "call" and r["op"] == "replay"
    }
    lags = observed_lags(effects, scheds, replayed, cfg.claim_bound)
    # A system lagging at the end cannot be asked to have run what it was still catching up on.
    tail = lags.around(end, before=20, after=0, floor=0)
    cfg = replace(cfg, judge_to=min(cfg.judge_to, end - timedelta(seconds=tail)))
    # Capped runs: MUST only if the README's waiting bound ends in the window (two passes:
    # the bound counts the line's planned times ahead, which the first pass gives).
    planned = {sid: classify(s, cfg, end, lags) for sid, s in scheds.items()}
    bounds = waiting.WaitingBound(
        scheds, planned, effects, deferral=cfg.deferral, lag=lags.around,
        faults=waiting.fault_spans(history), lease=cfg.occurrence_lease,
        redelivery=cfg.redelivery,
    )  # fmt: skip
    classes = {
        sid: classify(s, cfg, end, lags, partial(_bound_seconds, bounds, sid))
        if bounds.capped(sid)
        else planned[sid]
        for sid, s in scheds.items()
    }
    manual = {
        r["occurrence_id"]: r
        for r in history
        if r["type"] == "call" and r["op"] == "run_now" and r.get("ok")
    }
    replays = [r for r in history if r["type"] == "call" and r["op"] == "replay" and r.get("ok")]
    stalled = stalls(history, cfg.occurrence_lease)

    # -- identity, duplicates, never-planned, early, after invalidation --------------------
    by_time: dict[tuple[str, datetime], list[Effect]] = defaultdict(list)
    by_manual: dict[str, list[Effect]] = defaultdict(list)
    for e in effects:
        s = scheds.get(e.schedule_id)
        if s is None:
            verdict.add("unidentified", f"effect of unknown schedule {e.schedule_id}", [e.brief()])
            continue
        if e.occurrence_id in manual:
            by_manual[e.occurrence_id].append(e)
            rec = manual[e.occurrence_id]
            if (
                s.canceled_at
                and rec["end"] < s.canceled_at
                and e.delivered_at
                and e.delivered_at > s.canceled_at
            ):
                verdict.add(
                    "after_invalidation",
                    f"{s.key}: manual occurrence ran after the schedule was canceled",
                    [e.brief(), *describe(s)],
                )
            if e.started_at < rec["scheduled_for"]:
                verdict.add(
                    "early", f"{s.key}: manual occurrence started before its time", [e.brief()]
                )
            continue
        expected_id = str(ids.occurrence_id(e.schedule_id, e.version, e.scheduled_for))
        if expected_id != e.occurrence_id:
            verdict.add(
                "unidentified",
                f"{s.key}: occurrence id is not uuid5(schedule, version,"
                f" time) and no run_now returned it",
                [e.brief()],
            )
            continue
        by_time[(e.schedule_id, e.scheduled_for)].append(e)
        status = classes[e.schedule_id].get(e.scheduled_for)
        if status is None:
            verdict.add(
                "never_planned",
                f"{s.key}: ran {_fmt(e.scheduled_for)}, a time no "
                "active timing of the schedule had",
                [e.brief(), *describe(s)],
            )
        if e.version not in s.versions:
            verdict.add(
                "unknown_version",
                f"{s.key}: ran under version {e.version}, which no driver call produced",
                [e.brief(), *describe(s)],
            )
            continue
        window, invalidated = s.versions[e.version]
        available = ids.available_at(e.occurrence_id, e.scheduled_for, window)
        if e.started_at < available:
            verdict.add(
                "early",
                f"{s.key}: started {(available - e.started_at).total_seconds():.3f}"
                f" s before available_at {_fmt(available)}",
                [e.brief()],
            )
        if invalidated is not None and e.delivered_at is not None and e.delivered_at > invalidated:
            verdict.add(
                "after_invalidation",
                f"{s.key}: v{e.version} was invalidated at "
                f"{_fmt(invalidated)}, its occurrence was delivered (so claimed) later",
                [e.brief(), *describe(s)],
            )
    for (sid, t), group in by_time.items():
        if len(group) > 1:
            verdict.add(
                "duplicate",
                f"{scheds[sid].key}: {_fmt(t)} ran {len(group)} times",
                [g.brief() for g in group] + describe(scheds[sid]),
            )
    for occ, group in by_manual.items():
        if len(group) > 1:
            verdict.add(
                "duplicate",
                f"manual occurrence {occ} ran {len(group)} times",
                [g.brief() for g in group],
            )

    scheduler_says: dict[tuple[str, datetime], list[str]] = defaultdict(list)
    for item in [*(reconcile or {}).get("expected", []), *(reconcile or {}).get("unexpected", [])]:
        fire = (item["schedule_id"], datetime.fromisoformat(item["scheduled_for"]))
        scheduler_says[fire].append(f"v{item['version']} {item['state'] or item['status']}")

    # -- every MUST ran --------------------------------------------------------------------
    # A body that started, then lost its lease or failed, waits to be claimed again; a
    # version bump in that wait cancels it for good, whatever the bump changed.
    requeued_then_invalidated = {
        (a["schedule_id"], a["scheduled_for"])
        for a in attempts or []
        if a["schedule_id"] in scheds and _bumped_after(scheds[a["schedule_id"]], a["started_at"])
    }
    judged = 0
    must_total = 0
    replay_must: set[tuple[str, datetime]] = set()
    for r in replays:
        s = scheds.get(r["schedule_id"])
        if s is None or r.get("manual"):
            continue
        later_bump = any(
            c.get("ok") and c["op"] in BUMPS and c.get("changed", True) and c["start"] > r["start"]
            for c in s.calls
        )
        if (
            r["occurrence_version"] == r["schedule_version"]
            and not later_bump
            and r["end"] + timedelta(seconds=20) <= cfg.judge_to
        ):
            replay_must.add((r["schedule_id"], r["scheduled_for"]))
    for sid, times in classes.items():
        s = scheds[sid]
        for t, status in sorted(times.items()):
            if not (cfg.judge_from <= t <= cfg.judge_to):
                continue
            judged += 1
            if status != MUST and (sid, t) not in replay_must:
                continue
            must_total += 1
            if (sid, t) not in by_time:
                said = ", ".join(scheduler_says.get((sid, t), [])) or "no row in its window"
                evidence = [f"(reconcile: {said})", *describe(s)]
                if (sid, t) in requeued_then_invalidated:
                    # A claimed time is never planned again (django_app.schedules.replan).
                    verdict.excuse("lost", f"{s.key}: {_fmt(t)} started, then was invalidated "
                                   "while waiting to be claimed again", evidence)  # fmt: skip
                    continue
                verdict.add("lost", f"{s.key}: {_fmt(t)} never ran", evidence)
    for occ, rec in manual.items():
        s = scheds.get(rec["schedule_id"])
        if s is None:
            continue
        later_bump = any(
            c.get("ok")
            and c["op"] in BUMPS
            and c.get("changed", True)
            and c["start"] > rec["start"]
            for c in s.calls
        )
        poisoned = s.create.get("poison") and is_poisoned(sid_of(rec), rec["scheduled_for"])
        if s.create.get("overlap_policy", "ALLOW") != "ALLOW":
            continue  # the overlap policy applies to manual runs too: they may be skipped
        if (
            not later_bump
            and not poisoned
            and cfg.judge_from <= rec["scheduled_for"]
            and rec["end"] + timedelta(seconds=20) <= cfg.judge_to
        ):
            must_total += 1
            judged += 1
            if occ not in by_manual:
                verdict.add("lost", f"{s.key}: run_now occurrence {occ} never ran", describe(s))

    # -- a run that started must finish (or be invalidated after it started) -------------
    cured = {(r["schedule_id"], r["scheduled_for"]) for r in replays}
    for a in attempts or []:
        sid, t = a["schedule_id"], a["scheduled_for"]
        s = scheds.get(sid)
        if s is None or a["occurrence_id"] in manual or (sid, t) in by_time:
            continue
        if classes[sid].get(t) == MUST or (sid, t) in replay_must:
            continue  # judged above
        if t > cfg.judge_to or t < cfg.judge_from:
            continue  # unsettled times are not judged
        if s.create.get("poison") and is_poisoned(sid, t) and (sid, t) not in cured:
            continue  # DEAD by design until cured
        if _bumped_after(s, a["started_at"]):
            continue  # re-queued after a crash, then invalidated while waiting: allowed
        verdict.add("abandoned", f"{s.key}: {_fmt(t)} started at {_fmt(a['started_at'])} "
                    f"(pid {a['pid']}, v{a['version']}) and never finished",
                    [f"(reconcile: {', '.join(scheduler_says.get((sid, t), [])) or '-'})",
                     *describe(s)])  # fmt: skip
        by_time[(sid, t)] = []  # one report per fire time

    # -- every capped run got its slot within the waiting bound ----------------------------
    for e in effects:
        s = scheds.get(e.schedule_id)
        if s is None or not bounds.capped(e.schedule_id) or e.occurrence_id in manual:
            continue
        if e.version not in s.versions:
            continue
        available = ids.available_at(e.occurrence_id, e.scheduled_for, s.versions[e.version][0])
        bound = bounds.of(e.schedule_id, e.scheduled_for)
        waited = (e.started_at - available).total_seconds()
        if waited > bound.seconds:
            verdict.add(
                "slow_wait",
                f"{s.key}: {_fmt(e.scheduled_for)} waited {waited:.1f} s for a slot of its"
                f" {cap_key(s)}: {bound.explain()}",
                [e.brief(), *describe(s)],
            )

    # -- caps, overlap, tenant max_running -------------------------------------------------
    limits: dict[str, int] = {}
    members: dict[str, list[Effect]] = defaultdict(list)
    tenants = {r["slug"]: r for r in history if r["type"] == "tenant"}
    for e in effects:
        s = scheds.get(e.schedule_id)
        if s is None:
            continue
        c = s.create
        capped = cap_key(s)
        if capped is not None:
            limits[capped] = int(c["concurrency_limit"])
            members[capped].append(e)
        if c.get("overlap_policy", "ALLOW") != "ALLOW":
            key = f"overlap {c['overlap_policy']} of {s.key}"
            limits[key] = 1
            members[key].append(e)
        max_running = tenants.get(s.tenant, {}).get("max_running")
        if max_running:
            key = f"tenant {s.tenant} max_running"
            limits[key] = int(max_running)
            members[key].append(e)
    for key, group in members.items():
        for over in exceeded(group, limits[key]):
            evidence = [g.brief() for g in over]
            note = ""
            if any(_stalled_during(g, stalled) for g in over):
                # @idempotent_task re-checks the claim before it commits: a body stalled
                # past its lease must have rolled back, so this is no excuse.
                note = "; a body was SIGSTOPped past its lease and still committed"
            verdict.add(
                "cap_exceeded",
                f"{key}: {len(over)} ran at once (limit {limits[key]}){note}",
                evidence,
            )

    # -- tenant schedule quota -------------------------------------------------------------
    for slug, tenant_row in tenants.items():
        quota = tenant_row.get("max_schedules")
        if not quota:
            continue
        live_floor = 0  # schedules certainly live: created, not one-off, not canceled yet
        events = sorted(
            [
                (r["end"], "create", r)
                for r in history
                if r["type"] == "create" and r.get("ok") and r["tenant"] == slug
            ]
            + [
                (r["end"], "cancel", r)
                for r in history
                if r["type"] == "call"
                and r["op"] == "cancel"
                and r.get("ok")
                and r.get("changed", True)
                and scheds.get(r["schedule_id"])
                and scheds[r["schedule_id"]].tenant == slug
            ],
            key=lambda x: x[0],
        )
        for _, what, r in events:
            one_off = "run_at" in (r.get("timing") or {})
            if what == "create":
                if live_floor >= quota:
                    verdict.add(
                        "quota",
                        f"tenant {slug}: {r['key']} created with "
                        f"{live_floor} live schedules (max_schedules {quota})",
                    )
                if not one_off:
                    live_floor += 1
            elif "run_at" not in scheds[r["schedule_id"]].create["timing"]:
                live_floor -= 1

    # -- the reconciler agrees -------------------------------------------------------------
    if reconcile is not None:
        check_reconcile(verdict, reconcile, scheds, classes, effects, manual, stalled, cfg.judge_to)

    verdict.counts = {
        "schedules": len(scheds),
        "fire_times_judged": judged,
        "must_until_lag_s": int(tail),
        "must_run": must_total,
        "effects": len(effects),
        "violations": len(verdict.violations),
        "excused": len(verdict.excused),
    }
    return verdict


def observed_lags(
    effects: list[Effect], scheds: dict[str, Sched], replayed: set[str], floor: float
) -> Lags:
    """Queueing lags of ordinary runs: not replays, cap or overlap waits (they wait by design)."""
    points = []
    for e in effects:
        s = scheds.get(e.schedule_id)
        if s is None or e.delivered_at is None or e.version not in s.versions:
            continue
        if e.occurrence_id in replayed or s.create.get("concurrency_limit"):
            continue
        if s.create.get("overlap_policy", "ALLOW") != "ALLOW":
            continue
        available = ids.available_at(e.occurrence_id, e.scheduled_for, s.versions[e.version][0])
        points.append((e.delivered_at, max(0.0, (e.delivered_at - available).total_seconds())))
    return Lags(points, floor)


def _bound_seconds(bounds: waiting.WaitingBound, sid: str, t: datetime) -> float:
    return bounds.of(sid, t).seconds


def sid_of(rec: dict[str, Any]) -> str:
    return str(rec["schedule_id"])


def exceeded(group: list[Effect], limit: int) -> list[list[Effect]]:
    """Sets of effects whose body intervals overlap more than ``limit`` at once."""
    points = sorted(
        [(e.started_at, 1, n) for n, e in enumerate(group)]
        + [(e.ended_at, 0, n) for n, e in enumerate(group)]  # ends sort before starts
    )
    running: set[int] = set()
    found: list[list[Effect]] = []
    reported: set[frozenset[int]] = set()
    for _, kind, n in points:
        if kind == 0:
            running.discard(n)
            continue
        running.add(n)
        if len(running) > limit:
            key = frozenset(running)
            if key not in reported:
                reported.add(key)
                found.append([group[i] for i in sorted(running)])
    return found


def _stalled_during(e: Effect, stalled: dict[int, list[tuple[datetime, datetime]]]) -> bool:
    return any(lo < e.ended_at and hi > e.started_at for lo, hi in stalled.get(e.pid, []))


def check_reconcile(
    verdict: Verdict,
    report: dict[str, Any],
    scheds: dict[str, Sched],
    classes: dict[str, dict[datetime, str]],
    effects: list[Effect],
    manual: dict[str, dict[str, Any]],
    stalled: dict[int, list[tuple[datetime, datetime]]],
    settled_until: datetime,
) -> None:
    """ABSENT is a loss; an effect's occurrence must read SUCCEEDED once things settled."""
    lo = datetime.fromisoformat(report["from"])
    hi = min(datetime.fromisoformat(report["to"]), settled_until)
    items = {i["occurrence_id"]: i for i in [*report["expected"], *report["unexpected"]]}
    effect_ids = {e.occurrence_id: e for e in effects}
    for item in report["expected"]:
        sid = item["schedule_id"]
        if sid not in scheds:
            continue
        s = scheds[sid]
        t = datetime.fromisoformat(item["scheduled_for"])
        ran = [e for e in effects if e.schedule_id == sid and e.scheduled_for == t]
        if item["status"] == "ABSENT":
            verdict.add(
                "reconcile",
                f"{s.key}: reconcile reports {_fmt(t)} v{item['version']}"
                f" ABSENT; judge: {classes[sid].get(t, 'never')}, {len(ran)} effect(s)",
                describe(s),
            )
        elif item["status"] == "succeeded" and item["occurrence_id"] not in effect_ids:
            verdict.add(
                "reconcile",
                f"{s.key}: reconcile reports {_fmt(t)} SUCCEEDED but no "
                "business effect of that occurrence exists",
                [f"occurrence {item['occurrence_id']}", *[e.brief() for e in ran]],
            )
    for e in effects:
        if e.schedule_id not in scheds or e.occurrence_id in manual:
            continue
        if not (lo <= e.scheduled_for < hi):
            continue
        item = items.get(e.occurrence_id)
        state = item["state"] if item else "no row reported"
        if item is None or item["state"] != "SUCCEEDED":
            what = f"{scheds[e.schedule_id].key}: effect ran but reconcile reports {state}"
            if _stalled_during(e, stalled):
                what += " (its worker was stalled past its lease and still committed)"
            verdict.add("reconcile", what, [e.brief()])


def uuid_str(value: Any) -> str:
    return str(uuid.UUID(str(value)))
