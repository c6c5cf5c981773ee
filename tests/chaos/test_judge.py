"""The chaos judge on hand-made histories: each broken promise is caught, a clean run passes.

Pure (no database, no processes): the judge must be able to fail before its verdict on a
real soak means anything.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from celery_scheduler.core import ids
from tests.chaos.effects import Effect
from tests.chaos.judge import JudgeConfig, Verdict, judge

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
SID = str(uuid.UUID(int=7))
END = T0 + timedelta(minutes=5)
CFG = JudgeConfig(
    judge_from=T0, judge_to=END - timedelta(seconds=30), occurrence_lease=6, claim_bound=20
)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def create(**extra: Any) -> dict[str, Any]:
    record = {
        "type": "create",
        "key": "s000",
        "tenant": "acme",
        "ok": True,
        "schedule_id": SID,
        "version": 1,
        "state": "ACTIVE",
        "start": at(-2),
        "end": at(-1.9),
        "window": 0,
        "timing": {"interval": 10, "start_at": T0},
        "overlap_policy": "ALLOW",
        "concurrency_limit": None,
        "concurrency_group": "",
        "max_lateness": None,
    }
    record.update(extra)
    return record


def call(op: str, start: float, version: int, state: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": "call",
        "op": op,
        "key": "s000",
        "schedule_id": SID,
        "ok": True,
        "start": at(start),
        "end": at(start + 0.05),
        "version": version,
        "state": state,
        "changed": True,
        **extra,
    }


def effect(
    t: float,
    *,
    version: int = 1,
    delay: float = 0.2,
    run: float = 0.1,
    pid: int = 100,
    sid: str = SID,
) -> Effect:
    when = at(t)
    return Effect(
        occurrence_id=str(ids.occurrence_id(sid, version, when)),
        schedule_id=sid,
        version=version,
        scheduled_for=when,
        label="s000",
        tenant="acme",
        delivered_at=when + timedelta(seconds=delay),
        started_at=when + timedelta(seconds=delay),
        ended_at=when + timedelta(seconds=delay + run),
        pid=pid,
    )


def every(lo: float, hi: float, **kw: Any) -> list[Effect]:
    return [effect(t, **kw) for t in range(int(lo), int(hi), 10)]


def verdict(history: list[dict[str, Any]], effects: list[Effect]) -> Verdict:
    return judge(history, effects, CFG, end=END)


def kinds(v: Verdict) -> dict[str, int]:
    return v.by_kind()


def body_start(t: float, *, at_s: float, version: int = 1) -> dict[str, Any]:
    """A worker's note that the body of fire time ``t`` started at ``at_s``."""
    return {
        "occurrence_id": str(ids.occurrence_id(SID, version, at(t))),
        "schedule_id": SID,
        "version": version,
        "scheduled_for": at(t),
        "started_at": at(at_s),
        "pid": 100,
    }


def test_a_clean_run_has_no_violations() -> None:
    v = verdict([create()], every(0, 300))
    assert kinds(v) == {}
    assert v.counts["must_run"] >= 20


def test_a_fire_time_run_twice_is_a_duplicate() -> None:
    effects = every(0, 60) + every(60, 300, version=2)
    effects.append(effect(50, version=2, delay=30))  # 12:00:50 re-run under the new version
    assert kinds(verdict([create(), call("update", 60, 2, "ACTIVE")], effects)) == {"duplicate": 1}


def test_a_fire_time_that_never_ran_is_lost() -> None:
    effects = [e for e in every(0, 300) if e.scheduled_for != at(120)]
    v = verdict([create()], effects)
    assert kinds(v) == {"lost": 1}
    assert "12:02:00" in v.violations[0].what


def test_a_body_started_before_its_time_is_early() -> None:
    effects = every(0, 300)
    effects[5] = effect(50, delay=-0.5)
    assert kinds(verdict([create()], effects)) == {"early": 1}


def test_a_claim_after_the_version_was_invalidated_is_caught() -> None:
    history = [create(), call("update", 100, 2, "ACTIVE", change="rename")]
    effects = [e for e in every(0, 100) if e.scheduled_for != at(90)]
    effects.append(effect(90, delay=11))  # v1, delivered at 12:01:41: after the rename
    effects += every(100, 300, version=2)
    assert kinds(verdict(history, effects)) == {"after_invalidation": 1}


def test_a_paused_schedule_that_runs_is_caught_and_resume_must_replan() -> None:
    history = [create(), call("pause", 101, 2, "PAUSED"), call("resume", 205, 3, "ACTIVE")]
    effects = [e for e in every(0, 300) if e.scheduled_for < at(100)]
    effects.append(effect(150))  # ran while paused, long after the pause
    # nothing after the resume: the next fire times are lost
    v = verdict(history, effects)
    assert kinds(v).get("lost", 0) >= 3
    assert "after_invalidation" in kinds(v) or "never_planned" in kinds(v)


def test_a_cap_exceeded_is_caught_even_when_a_body_was_stalled_past_its_lease() -> None:
    history = [create(concurrency_limit=1)]
    effects = every(0, 300, run=0.5)
    effects[3] = effect(30, run=15, pid=200)  # overlaps 12:00:40 on another worker
    assert kinds(verdict(history, effects)) == {"cap_exceeded": 1}
    stall = {
        "type": "fault_end",
        "kind": "worker_stall",
        "target": "worker1",
        "pid": 200,
        "start": at(31),
        "end": at(42),
    }
    v = verdict([*history, stall], effects)  # its effect must have been rolled back
    assert kinds(v) == {"cap_exceeded": 1}
    assert "SIGSTOPped" in v.violations[0].what


def test_a_started_run_that_never_finished_is_abandoned_unless_invalidated_after() -> None:
    history = [create(overlap_policy="SKIP_IF_RUNNING")]  # its times may be skipped...
    effects = [e for e in every(0, 300) if e.scheduled_for != at(50)]
    started = body_start(50, at_s=50.2)
    v = judge(history, effects, CFG, end=END, attempts=[started])
    assert kinds(v) == {"abandoned": 1}  # ...but not once they started
    later = [*history, call("update", 60, 2, "ACTIVE", change="rename")]
    effects = [e for e in effects if e.scheduled_for < at(60)] + every(60, 300, version=2)
    assert kinds(judge(later, effects, CFG, end=END, attempts=[started])) == {}


def test_a_started_run_invalidated_while_waiting_again_is_not_lost() -> None:
    """Seed 3504470 (CI, stop 39): a worker started 12:00:50 and its lease lapsed; a rename
    (timing unchanged, so its times stay MUST) bumped the version while the run waited to be
    claimed again. The contract cancels it and never plans its time again (a claimed time
    is never re-planned: django_app.schedules.replan), so it is excused, not lost."""
    history = [create()]
    effects = [e for e in every(0, 300) if e.scheduled_for != at(50)]
    started = body_start(50, at_s=50.2)
    rename = call("update", 58, 2, "ACTIVE", change="rename")
    later = [*history, rename]
    effects = [e for e in effects if e.scheduled_for < at(58)] + every(60, 300, version=2)
    v = judge(later, effects, CFG, end=END, attempts=[started])
    assert kinds(v) == {}
    assert [x.kind for x in v.excused] == ["lost"]
    # Without a started body the time was never claimed: the rename re-plans it, so it is lost.
    assert kinds(judge(later, effects, CFG, end=END, attempts=[])) == {"lost": 1}
    # A body that started after the rename is no excuse: the rename did not cancel it.
    after = body_start(50, at_s=58.1)
    assert kinds(judge(later, effects, CFG, end=END, attempts=[after])) == {"lost": 1}


def test_a_capped_run_passed_by_later_waiters_breaks_the_waiting_bound() -> None:
    other = str(uuid.UUID(int=8))
    group = {"concurrency_limit": 1, "concurrency_group": "reports", "duration": 3}
    history = [
        create(**group),
        create(**group, key="s001", schedule_id=other, timing={"interval": 10, "start_at": at(5)}),
    ]
    served = every(0, 300, run=3) + [effect(t, sid=other, run=3) for t in range(5, 300, 10)]
    assert kinds(verdict(history, served)) == {}
    # s001's 12:00:05 waits a minute while s000 keeps the slot: (0 ahead + 1) x 3 s + 1 s
    # (+ 20 s of lag allowance) is far less.
    starved = [e for e in served if not (e.schedule_id == other and e.scheduled_for == at(5))]
    starved.append(effect(5, sid=other, delay=58.3, run=1.5))  # in a free gap: no overlap
    v = verdict(history, starved)
    assert kinds(v) == {"slow_wait": 1}
    assert "(0 ahead + 1) x 3.0 s + 1 s" in v.violations[0].what


def test_a_capped_run_whose_message_was_lost_gets_the_redelivery_backoff_per_fault() -> None:
    """Seed 13810352: a capped schedule's first run lost its message to two Redis restarts
    and a flush; redelivery brought it back 120 s later (10 + 20 + 40 s of backoff plus the
    backlog), which one lease (6 s) per fault had called a slow wait."""
    other = str(uuid.UUID(int=8))
    group = {"concurrency_limit": 1, "concurrency_group": "reports", "duration": 3}
    history: list[dict[str, Any]] = [
        create(**group),
        create(**group, key="s001", schedule_id=other, timing={"interval": 10, "start_at": at(5)}),
    ]
    served = every(0, 300, run=3) + [effect(t, sid=other, run=3) for t in range(5, 300, 10)]
    late = [e for e in served if not (e.schedule_id == other and e.scheduled_for == at(5))]
    late.append(effect(5, sid=other, delay=58.3, run=1.5))  # in a free gap: no overlap

    def fault(kind: str, start: float) -> dict[str, Any]:
        return {"type": "fault_end", "kind": kind, "target": "broker", "pid": None,
                "start": at(start), "end": at(start + 2)}  # fmt: skip

    one_kill = [*history, fault("pg_terminate", 4), fault("beat_kill", 20)]
    assert kinds(verdict(one_kill, late)) == {"slow_wait": 1}  # leases do not lose messages
    lost_thrice = [
        *history, fault("redis_restart", 4), fault("broker_flush", 20),
        fault("redis_restart", 40),
    ]  # fmt: skip
    assert kinds(verdict(lost_thrice, late)) == {}
    far_too_late = [*late[:-1], effect(5, sid=other, delay=158.3, run=1.5)]
    v = verdict(lost_thrice, far_too_late)
    assert kinds(v) == {"slow_wait": 1}
    assert "+ 90.0 s for faults and delivery lag" in v.violations[0].what
