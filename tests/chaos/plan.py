"""Everything random in a soak comes from one seed: the schedule mix, the lifecycle calls and
the faults, with their timing. The plan is pure data (offsets in seconds from the start);
targets are drawn as a number in [0, 1) that picks among the eligible ones at run time.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

TENANTS: dict[str, dict[str, Any]] = {
    # slug: Tenant fields. initech's schedule quota is set at run time (its count + 2).
    "acme": {"relay_weight": 2},
    "globex": {"max_running": 2},
    "initech": {},
    "umbrella": {},
}
ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe"]

FAULT_KINDS = [
    "beat_kill",  # SIGKILL a beat, restart it later
    "worker_kill",  # SIGKILL a worker, restart it later
    "beat_stop",  # SIGSTOP a beat, SIGCONT later (sometimes past its shard lease)
    "worker_stall",  # SIGSTOP a worker past its occurrence lease, SIGCONT later
    "pg_terminate",  # pg_terminate_backend every connection of a beat or worker
    "redis_restart",  # kill the broker (no persistence) and start it again
    "broker_flush",  # FLUSHDB the broker's database
]


@dataclass(frozen=True, kw_only=True)
class SchedulePlan:
    key: str
    tenant: str
    #: {"cron": expr, "timezone": zone} | {"interval": s, "anchor": offset} | {"run_at": offset}
    timing: dict[str, Any]
    duration: float
    overlap_policy: str = "ALLOW"
    concurrency_limit: int | None = None
    concurrency_group: str = ""
    flexible_window: int = 0
    misfire_policy: str = "SKIP"
    max_lateness: int | None = None
    poison: bool = False
    #: One fire time in five sleeps this long instead (0: never).
    long: float = 0.0
    #: Created during the run by a "create" action rather than before it.
    late: bool = False


@dataclass(frozen=True, kw_only=True)
class Action:
    at: float  # seconds from the start of the chaos phase
    op: str  # update, pause, resume, cancel, run_now, replay, create, or a fault kind
    pick: float  # picks the target among the eligible ones at run time
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Plan:
    seed: int
    chaos_seconds: float
    schedules: list[SchedulePlan]
    actions: list[Action]

    def summary(self) -> str:
        ops: dict[str, int] = {}
        for a in self.actions:
            ops[a.op] = ops.get(a.op, 0) + 1
        created = sum(1 for s in self.schedules if not s.late)
        return (
            f"seed={self.seed} schedules={created} (+{len(self.schedules) - created} created "
            f"during the run) chaos={self.chaos_seconds:.0f}s actions="
            + ", ".join(f"{k}:{v}" for k, v in sorted(ops.items()))
        )


def _duration(rng: random.Random, short: float = 0.15) -> float:
    return round(rng.uniform(0.01, short), 3)


def make_schedules(rng: random.Random, count: int, chaos_seconds: float) -> list[SchedulePlan]:
    out: list[SchedulePlan] = []

    def add(tenant: str | None = None, **fields: Any) -> None:
        out.append(
            SchedulePlan(
                key=f"s{len(out):03d}",
                tenant=tenant or rng.choice(["acme", "globex", "initech", "umbrella"]),
                **fields,
            )
        )

    # Capped groups with the SAME name in two tenants: each tenant's cap stands alone.
    for _ in range(3):
        iv = rng.randint(10, 15)
        add(
            "acme",
            timing={"interval": iv, "anchor": rng.uniform(0, iv)},
            duration=round(rng.uniform(0.1, 0.3), 2),
            long=round(iv * rng.uniform(1.2, 1.6), 1),
            concurrency_limit=2,
            concurrency_group="reports",
        )
    for _ in range(2):
        iv = rng.randint(10, 15)
        add(
            "umbrella",
            timing={"interval": iv, "anchor": rng.uniform(0, iv)},
            duration=round(rng.uniform(0.1, 0.3), 2),
            long=round(iv * rng.uniform(1.2, 1.6), 1),
            concurrency_limit=1,
            concurrency_group="reports",
        )
    iv = rng.randint(6, 9)  # a per-schedule cap
    add(
        timing={"interval": iv, "anchor": rng.uniform(0, iv)},
        duration=_duration(rng, 0.1),
        long=round(iv * 1.4, 1),
        concurrency_limit=1,
    )
    for policy in ("SKIP_IF_RUNNING", "QUEUE_ONE"):
        iv = rng.randint(5, 7)
        add(
            timing={"interval": iv, "anchor": rng.uniform(0, iv)},
            duration=_duration(rng, 0.1),
            long=round(iv * rng.uniform(1.5, 2.0), 1),
            overlap_policy=policy,
        )
    for policy in ("SKIP", "FIRE_ONCE", "CATCH_UP"):  # short lateness: misfires happen
        iv = rng.randint(10, 15)
        add(
            timing={"interval": iv, "anchor": rng.uniform(0, iv)},
            duration=_duration(rng, 0.1),
            misfire_policy=policy,
            max_lateness=rng.randint(2, 4),
        )
    for _ in range(3):
        iv = rng.randint(15, 25)
        add(
            timing={"interval": iv, "anchor": rng.uniform(0, iv)},
            duration=_duration(rng, 0.1),
            poison=True,
        )
    add(timing={"interval": 2, "anchor": rng.uniform(0, 2)}, duration=0.01)  # per-second-ish
    # The rest: a capacity-minded mix (about 1.5 occurrences/s per 100 schedules), so a
    # loaded 2-core machine keeps up and a lost occurrence is a lost occurrence, not a queue.
    while len(out) < count:
        roll = rng.random()
        if roll < 0.25:
            add(
                timing={"cron": "* * * * *", "timezone": rng.choice(ZONES)}, duration=_duration(rng)
            )
        elif roll < 0.35:
            add(
                timing={
                    "cron": rng.choice(["*/2 * * * *", "1-59/2 * * * *"]),
                    "timezone": rng.choice(ZONES),
                },
                duration=_duration(rng),
            )
        elif roll < 0.47:
            add(
                timing={"cron": "* * * * *", "timezone": "UTC"},
                duration=_duration(rng),
                flexible_window=rng.randint(10, 50),
            )
        elif roll < 0.60:
            add(
                timing={
                    "cron": rng.choice(["*/5 * * * *", "*/3 * * * *", "2-59/5 * * * *"]),
                    "timezone": rng.choice(ZONES),
                },
                duration=_duration(rng),
            )
        elif roll < 0.85:
            iv = rng.randint(20, 90)
            add(timing={"interval": iv, "anchor": rng.uniform(0, iv)}, duration=_duration(rng))
        else:
            add(timing={"run_at": rng.uniform(5, chaos_seconds)}, duration=_duration(rng))
    return out


def make_plan(seed: int, *, chaos_seconds: float, schedules: int) -> Plan:
    rng = random.Random(seed)
    mix = make_schedules(rng, schedules, chaos_seconds)
    actions: list[Action] = []
    # Lifecycle calls: one every 0.5-2.5 s.
    ops = ["update", "pause", "resume", "cancel", "run_now", "replay", "create"]
    weights = [30, 14, 20, 3, 15, 10, 8]
    t = rng.uniform(1, 3)
    while t < chaos_seconds:
        op = rng.choices(ops, weights)[0]
        params: dict[str, Any] = {}
        if op == "update":
            params["change"] = rng.choices(["rename", "args", "timing", "window"], [3, 3, 3, 1])[0]
            params["value"] = rng.random()
        if op == "create":
            params["tenant"] = rng.choice(["initech", "initech", "acme", "umbrella"])
            iv = rng.randint(20, 90)  # like the mix: the run must not outgrow the workers
            params["interval"] = iv
            params["duration"] = _duration(rng)
        actions.append(Action(at=round(t, 3), op=op, pick=rng.random(), params=params))
        t += rng.uniform(0.5, 2.5)
    # Faults: one at a time; the first ones cover every kind once, in a seeded order.
    order = FAULT_KINDS[:]
    rng.shuffle(order)
    t = rng.uniform(3, 6)
    gap = (3.0, 5.0) if chaos_seconds < 300 else (8.0, 20.0)
    while t < chaos_seconds - 5:
        kind = order.pop(0) if order else rng.choice(FAULT_KINDS)
        params = {
            "down": round(rng.uniform(1, 5), 2),  # stop/kill -> revive delay
            "variant": rng.random(),
        }
        actions.append(Action(at=round(t, 3), op=kind, pick=rng.random(), params=params))
        t += params["down"] + rng.uniform(*gap)
    actions.sort(key=lambda a: a.at)
    return Plan(seed=seed, chaos_seconds=chaos_seconds, schedules=mix, actions=actions)
