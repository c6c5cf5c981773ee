"""The driver: creates the schedule mix, then plays the seeded plan in real time.

Lifecycle calls go through the public API (``celery_scheduler.api``) as a user's code would;
faults go to the processes and services. Every call and fault is recorded with its wall-clock
start and end and its result: that record, not the scheduler's tables, is what the judge
reads to know what each schedule's timing was when.
"""

from __future__ import annotations

import heapq
import json
import signal
import time
import traceback
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tests.chaos.cluster import Cluster, Proc
from tests.chaos.plan import TENANTS, Action, Plan, SchedulePlan

TASK = "chaos.effect"


def now() -> datetime:
    return datetime.now(UTC)


@dataclass
class Model:
    """What the driver believes about one schedule: what it asked for and was told."""

    plan: SchedulePlan
    schedule_id: str = ""
    state: str = "ACTIVE"
    timing: dict[str, Any] = field(
        default_factory=dict
    )  # absolute: cron / interval+start_at / run_at
    duration: float = 0.0
    window: int = 0
    renames: int = 0


@dataclass
class History:
    """Append-only record of the soak, mirrored line by line to a JSONL file."""

    path: Path
    records: list[dict[str, Any]] = field(default_factory=list)

    def add(self, record: dict[str, Any]) -> dict[str, Any]:
        self.records.append(record)
        with self.path.open("a") as out:
            out.write(json.dumps(record, default=_json_default) + "\n")
        return record


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


class Driver:
    def __init__(self, plan: Plan, cluster: Cluster, history: History, *, lease: float) -> None:
        self.plan = plan
        self.cluster = cluster
        self.history = history
        self.lease = lease
        self.models: dict[str, Model] = {}
        self.faults: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        self.t0 = now()

    # -- setup ----------------------------------------------------------------------------

    def setup_tenants(self) -> None:
        from django_app.models import Tenant

        initech = sum(1 for s in self.plan.schedules if s.tenant == "initech")
        for slug, fields in TENANTS.items():
            values = dict(fields)
            if slug == "initech":
                values["max_schedules"] = initech + 2  # the run's creates go beyond it
            Tenant.objects.update_or_create(slug=slug, defaults={"name": slug, **values})
            self.history.add({"type": "tenant", "slug": slug, **values})

    def create_all(self) -> None:
        self.t0 = now()
        self.history.add({"type": "t0", "at": self.t0})
        for spec in self.plan.schedules:
            self.create(spec)

    def timing_of(self, spec: SchedulePlan, base: datetime) -> dict[str, Any]:
        t = spec.timing
        if "cron" in t:
            return {"cron": t["cron"], "timezone": t["timezone"]}
        if "interval" in t:
            start = base + timedelta(seconds=t["anchor"])
            return {"interval": t["interval"], "start_at": start.replace(microsecond=0)}
        # One-offs count from their own creation, so they are not born in the past.
        return {"run_at": (now() + timedelta(seconds=t["run_at"])).replace(microsecond=0)}

    def create(self, spec: SchedulePlan, base: datetime | None = None) -> Model:
        from celery_scheduler import api

        model = Model(plan=spec, duration=spec.duration, window=spec.flexible_window)
        model.timing = self.timing_of(spec, base or self.t0)
        fields: dict[str, Any] = {
            "name": spec.key,
            "task": TASK,
            "tenant": spec.tenant,
            "args": [spec.key, spec.tenant, spec.duration, spec.poison, spec.long],
            "overlap_policy": spec.overlap_policy,
            "concurrency_limit": spec.concurrency_limit,
            "concurrency_group": spec.concurrency_group,
            "flexible_window": spec.flexible_window,
            "misfire_policy": spec.misfire_policy,
            "max_lateness": spec.max_lateness,
        }
        start = now()
        record: dict[str, Any] = {
            "type": "create",
            "key": spec.key,
            "tenant": spec.tenant,
            "start": start,
            "timing": model.timing,
            "duration": spec.duration,
            "window": spec.flexible_window,
            "overlap_policy": spec.overlap_policy,
            "concurrency_limit": spec.concurrency_limit,
            "concurrency_group": spec.concurrency_group,
            "misfire_policy": spec.misfire_policy,
            "max_lateness": spec.max_lateness,
            "poison": spec.poison,
            "long": spec.long,
        }
        try:
            schedule = api.create_schedule(**fields, **_api_timing(model.timing))
        except Exception as exc:
            record.update(end=now(), ok=False, error=_error(exc))
        else:
            model.schedule_id = str(schedule.id)
            record.update(
                end=now(),
                ok=True,
                schedule_id=model.schedule_id,
                version=schedule.version,
                state=schedule.state,
            )
            model.state = schedule.state
            self.models[spec.key] = model
        self.history.add(record)
        self._count("create" if record["ok"] else "create (refused)")
        return model

    # -- the run --------------------------------------------------------------------------

    def run(self, chaos_seconds: float) -> None:
        """Play the plan from now for ``chaos_seconds``; revive everything at the end."""
        start = time.monotonic()
        queue: list[tuple[float, int, str, Any]] = []
        for n, action in enumerate(self.plan.actions):
            heapq.heappush(queue, (action.at, n, "action", action))
        seq = len(self.plan.actions)
        while queue:
            at, _, kind, item = heapq.heappop(queue)
            if at > chaos_seconds and kind == "action":
                continue
            delay = at - (time.monotonic() - start)
            if delay > 0:
                time.sleep(delay)
            try:
                if kind == "recover":
                    item()
                    continue
                recover = self.act(item)
            except Exception:
                self.history.add(
                    {"type": "driver_error", "at": now(), "error": traceback.format_exc()[-2000:]}
                )
                continue
            if recover is not None:
                delay_s, fn = recover
                seq += 1
                heapq.heappush(queue, (time.monotonic() - start + delay_s, seq, "recover", fn))
        for what in self.cluster.revive_all():
            self.history.add({"type": "revive", "at": now(), "what": what})

    def act(self, action: Action) -> tuple[float, Any] | None:
        op = action.op
        if op in ("update", "pause", "resume", "cancel", "run_now", "replay", "create"):
            getattr(self, f"do_{op}")(action)
            return None
        return getattr(self, f"fault_{op}")(action)

    # -- lifecycle calls ------------------------------------------------------------------

    def _pick(self, action: Action, states: tuple[str, ...]) -> Model | None:
        eligible = [m for k, m in sorted(self.models.items()) if m.state in states]
        if not eligible:
            return None
        return eligible[int(action.pick * len(eligible))]

    def _call(self, op: str, model: Model, fn: Any, **extra: Any) -> tuple[bool, Any]:
        start = now()
        record: dict[str, Any] = {
            "type": "call",
            "op": op,
            "key": model.plan.key,
            "schedule_id": model.schedule_id,
            "start": start,
            **extra,
        }
        try:
            result = fn()
        except Exception as exc:
            record.update(end=now(), ok=False, error=_error(exc))
            self.history.add(record)
            self._count(f"{op} (refused)")
            return False, exc
        record.update(end=now(), ok=True)
        if hasattr(result, "version") and hasattr(result, "state"):
            record.update(
                version=result.version,
                state=result.state,
                changed=getattr(result, "changed", True),
                invalidated=getattr(result, "invalidated", None),
            )
            model.state = result.state
        self._count(op)
        return True, (result, record)

    def _finish(self, ok_result: tuple[bool, Any]) -> None:
        ok, payload = ok_result
        if ok:
            self.history.add(payload[1])

    def do_update(self, action: Action) -> None:
        from celery_scheduler import api

        model = self._pick(action, ("ACTIVE", "PAUSED"))
        if model is None:
            return
        spec, value = model.plan, action.params["value"]
        change = action.params["change"]
        changes: dict[str, Any] = {}
        new_timing = None
        if change == "rename":
            changes["name"] = f"{spec.key} r{model.renames + 1}"
        elif change == "args":
            cap = 1.2 * spec.duration
            duration = round(min(cap, spec.duration * (0.6 + 0.6 * value)), 3)
            changes["args"] = [spec.key, spec.tenant, duration, spec.poison, spec.long]
        elif change == "window" and spec.overlap_policy == "ALLOW" and not spec.concurrency_limit:
            changes["flexible_window"] = 0 if model.window else int(5 + 30 * value)
        else:  # timing
            new_timing = self._new_timing(model, value)
            changes.update(_api_timing(new_timing))
        ok, payload = self._call(
            "update",
            model,
            lambda: api.update_schedule(model.schedule_id, **changes),
            change=change,
            changes=changes,
            timing=new_timing or model.timing,
        )
        if ok:
            if change == "rename":
                model.renames += 1
            elif change == "args":
                model.duration = changes["args"][2]
            elif "flexible_window" in changes:
                model.window = changes["flexible_window"]
            elif new_timing is not None:
                model.timing = new_timing
            payload[1]["window"] = model.window
            self.history.add(payload[1])

    def _new_timing(self, model: Model, value: float) -> dict[str, Any]:
        t = model.timing
        if "cron" in t:
            if value < 0.5:
                return {
                    "cron": t["cron"],
                    "timezone": "Asia/Kolkata" if t["timezone"] != "Asia/Kolkata" else "UTC",
                }
            cron = "*/2 * * * *" if t["cron"] == "* * * * *" else "* * * * *"
            return {"cron": cron, "timezone": t["timezone"]}
        if "interval" in t:
            iv = int(model.plan.timing["interval"])
            every = max(1, int(iv * (1 + 0.5 * value)))
            start_at = (now() + timedelta(seconds=value * every)).replace(microsecond=0)
            return {"interval": every, "start_at": start_at}
        return {"run_at": (now() + timedelta(seconds=5 + 40 * value)).replace(microsecond=0)}

    def do_pause(self, action: Action) -> None:
        from celery_scheduler import api

        model = self._pick(action, ("ACTIVE",))
        if model is not None:
            self._finish(self._call("pause", model, lambda: api.pause_schedule(model.schedule_id)))

    def do_resume(self, action: Action) -> None:
        from celery_scheduler import api

        model = self._pick(action, ("PAUSED",))
        if model is not None:
            self._finish(
                self._call("resume", model, lambda: api.resume_schedule(model.schedule_id))
            )

    def do_cancel(self, action: Action) -> None:
        from celery_scheduler import api

        model = self._pick(action, ("ACTIVE", "PAUSED"))
        if model is not None:
            self._finish(
                self._call("cancel", model, lambda: api.cancel_schedule(model.schedule_id))
            )

    def do_run_now(self, action: Action) -> None:
        from celery_scheduler import api

        model = self._pick(action, ("ACTIVE", "PAUSED"))
        if model is None:
            return
        ok, payload = self._call("run_now", model, lambda: api.run_now(model.schedule_id))
        if ok:
            occ = payload[0]
            payload[1].update(
                occurrence_id=str(occ.id),
                scheduled_for=occ.scheduled_for,
                version=occ.schedule_version,
                window=model.window,
            )
            self.history.add(payload[1])

    def do_replay(self, action: Action) -> None:
        """Cure a DEAD occurrence's fire time in the effect log's table, then replay it."""
        from django.db import connection

        from celery_scheduler import api
        from django_app.models import Occurrence, Schedule

        ours = {m.schedule_id: m for m in self.models.values()}
        dead = list(
            Occurrence.objects.filter(state="DEAD", schedule_id__in=list(ours))
            .order_by("scheduled_for", "id")
            .values_list("id", "schedule_id", "schedule_version", "scheduled_for", "manual")
        )
        if not dead:
            self._count("replay (nothing DEAD)")
            return
        occ_id, schedule_id, version, scheduled_for, manual = dead[int(action.pick * len(dead))]
        model = ours[str(schedule_id)]
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO chaos.cured (schedule_id, scheduled_for) VALUES (%s, %s)"
                " ON CONFLICT DO NOTHING",
                [schedule_id, scheduled_for],
            )
        current = Schedule.objects.values_list("version", flat=True).get(pk=schedule_id)
        self._finish(
            self._call(
                "replay",
                model,
                lambda: api.replay_occurrence(occ_id),
                occurrence_id=str(occ_id),
                scheduled_for=scheduled_for,
                occurrence_version=version,
                schedule_version=current,
                manual=manual,
            )
        )

    def do_create(self, action: Action) -> None:
        p = action.params
        spec = SchedulePlan(
            key=f"n{len(self.models):03d}",
            tenant=p["tenant"],
            timing={"interval": p["interval"], "anchor": action.pick * p["interval"]},
            duration=p["duration"],
        )
        self.plan.schedules.append(spec)
        self.create(spec, base=now())

    # -- faults ---------------------------------------------------------------------------

    def _procs(self, role: str) -> list[Proc]:
        return [
            p
            for p in self.cluster.procs.values()
            if p.role == role and p.alive() and p.stopped_since is None
        ]

    def _target(self, action: Action, role: str) -> Proc | None:
        procs = self._procs(role)
        return procs[int(action.pick * len(procs))] if procs else None

    def _fault(self, kind: str, target: str, pid: int | None, **detail: Any) -> dict[str, Any]:
        self.faults[kind] = self.faults.get(kind, 0) + 1
        record = {
            "type": "fault",
            "kind": kind,
            "target": target,
            "pid": pid,
            "start": now(),
            **detail,
        }
        self.history.add(record)
        return record

    def _ended(self, record: dict[str, Any], **detail: Any) -> None:
        self.history.add(
            {
                "type": "fault_end",
                "kind": record["kind"],
                "target": record["target"],
                "pid": record["pid"],
                "start": record["start"],
                "end": now(),
                **detail,
            }
        )

    def _kill(self, action: Action, role: str, kind: str) -> tuple[float, Any] | None:
        proc = self._target(action, role)
        if proc is None:
            return None
        record = self._fault(kind, proc.name, proc.pid)
        self.cluster.signal(proc, signal.SIGKILL)

        def restart() -> None:
            self.cluster.start(proc)
            self._ended(record, new_pid=proc.pid)

        return action.params["down"], restart

    def _stop(
        self, action: Action, role: str, kind: str, seconds: float
    ) -> tuple[float, Any] | None:
        proc = self._target(action, role)
        if proc is None:
            return None
        record = self._fault(kind, proc.name, proc.pid, seconds=round(seconds, 2))
        self.cluster.signal(proc, signal.SIGSTOP)

        def resume() -> None:
            self.cluster.signal(proc, signal.SIGCONT)
            self._ended(record)

        return seconds, resume

    def fault_beat_kill(self, action: Action) -> tuple[float, Any] | None:
        return self._kill(action, "beat", "beat_kill")

    def fault_worker_kill(self, action: Action) -> tuple[float, Any] | None:
        return self._kill(action, "worker", "worker_kill")

    def fault_beat_stop(self, action: Action) -> tuple[float, Any] | None:
        past_lease = action.params["variant"] < 0.5
        seconds = self.lease + 2 + action.params["down"] if past_lease else action.params["down"]
        return self._stop(action, "beat", "beat_stop", seconds)

    def fault_worker_stall(self, action: Action) -> tuple[float, Any] | None:
        return self._stop(action, "worker", "worker_stall", self.lease + 2 + action.params["down"])

    def fault_pg_terminate(self, action: Action) -> tuple[float, Any] | None:
        role = "beat" if action.params["variant"] < 0.5 else "worker"
        proc = self._target(action, role)
        if proc is None:
            return None
        record = self._fault("pg_terminate", proc.name, proc.pid)
        record["terminated"] = self.cluster.terminate_connections(proc)
        self._ended(record, terminated=record["terminated"])
        return None

    def fault_redis_restart(self, action: Action) -> tuple[float, Any] | None:
        record = self._fault("redis_restart", "broker", None)
        detail = self.cluster.restart_redis(min(3.0, action.params["down"]))
        self._ended(record, detail=detail)
        return None

    def fault_broker_flush(self, action: Action) -> tuple[float, Any] | None:
        record = self._fault("broker_flush", "broker", None)
        self.cluster.flush_broker()
        self._ended(record)
        return None

    def _count(self, what: str) -> None:
        self.calls[what] = self.calls.get(what, 0) + 1


def _api_timing(timing: dict[str, Any]) -> dict[str, Any]:
    if "cron" in timing:
        return {"cron": timing["cron"], "timezone": timing["timezone"]}
    if "interval" in timing:
        return {"interval": timing["interval"], "start_at": timing["start_at"]}
    return {"run_at": timing["run_at"]}
