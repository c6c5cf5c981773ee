"""Health and status of the scheduler (``manage.py scheduler_status`` and the HTTP probes).

Three questions, each answered from the database (and the broker for readiness):

* :func:`status` - what an operator looks at: live beat nodes and their shards, unowned
  shards, the outbox backlog, lag p99, parked schedules, enqueued-but-unclaimed occurrences.
* :func:`liveness` - did this node's beat loop finish a step recently (``BeatNode.progress_at``,
  stamped by the loop itself, not by the lease keeper thread)?
* :func:`readiness` - does this node hold shards, and do the database and the broker answer
  within a timeout?

Exit codes of the command (and HTTP codes of the endpoints): 0 / 200 healthy, 1 / 503 not.
"""

from __future__ import annotations

import math
import socket
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from celery import current_app
from django.db import close_old_connections, connection
from django.db.models import Count, Min, QuerySet

from celery_scheduler.core.clock import SYSTEM_CLOCK, Clock
from celery_scheduler.core.enums import ScheduleState
from django_app import conf
from django_app.db import queries
from django_app.models import BeatNode, Occurrence, OutboxEntry, Schedule, ShardLease
from django_app.relay import redelivery

#: Status's bound for an ENQUEUED occurrence's wait for a claim while redelivery is off
#: (``redelivery_timeout_seconds = 0``): the setting's default (seconds).
DEFAULT_REDELIVERY_TIMEOUT = 600.0
#: Liveness: the loop must have finished a step within this many seconds.
DEFAULT_LIVENESS_MAX_AGE = 60.0
#: Readiness: each of the database and the broker must answer within this many seconds.
DEFAULT_PROBE_TIMEOUT = 5.0
#: Occurrences at most that the lag p99 is computed from (the newest ones in the window).
LAG_SAMPLE_LIMIT = 10_000


#: ``unclaimed_past_redelivery`` counts at most this many (a status, not a scan of a flood).
UNCLAIMED_COUNTED_UP_TO = 10_000


def redelivery_timeout(settings: conf.SchedulerSettings) -> float:
    """``redelivery_timeout_seconds`` (or its default when redelivery is turned off)."""
    return float(settings.redelivery_timeout_seconds or DEFAULT_REDELIVERY_TIMEOUT)


@dataclass
class NodeStatus:
    name: str
    last_seen: str
    progress_at: str | None
    alive: bool
    shards: list[int] = field(default_factory=list)


@dataclass
class Status:
    now: str
    shard_count: int
    nodes: list[NodeStatus]
    unowned_shards: list[int]
    outbox_backlog: int
    oldest_due_unsent: str | None
    oldest_due_unsent_age_seconds: float | None
    lag_window_minutes: float
    lag_samples: int
    lag_p99_seconds: float | None
    parked_schedules: int
    unclaimed_past_redelivery: int
    redelivery_timeout_seconds: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def status(*, clock: Clock = SYSTEM_CLOCK, lag_minutes: float = 5.0) -> Status:
    settings = conf.get()
    now = clock.now()
    alive_since = now - timedelta(seconds=settings.lease_seconds)
    held: dict[str, list[int]] = {}
    owned: set[int] = set()
    for shard, owner in (
        ShardLease.objects.filter(shard__lt=settings.shard_count, expires_at__gt=now)
        .exclude(owner="")
        .values_list("shard", "owner")
    ):
        held.setdefault(owner, []).append(shard)
        owned.add(shard)
    nodes = [
        NodeStatus(
            name=node.name,
            last_seen=node.last_seen.isoformat(),
            progress_at=_iso(node.progress_at),
            alive=node.last_seen > alive_since,
            shards=sorted(held.get(node.name, [])),
        )
        for node in BeatNode.objects.order_by("name")
    ]
    due_unsent = OutboxEntry.objects.due(now)
    backlog = due_unsent.aggregate(n=Count("pk"), oldest=Min("available_at"))
    oldest: datetime | None = backlog["oldest"]
    timeout = redelivery_timeout(settings)
    # What the redelivery would publish again: by each message's last publish, not the
    # first (enqueued_at), so a retry or a waiter published again is not counted as lost.
    unclaimed = len(
        redelivery.find_lost(now, timedelta(seconds=timeout), limit=UNCLAIMED_COUNTED_UP_TO)
    )
    lags = _recent_lags(now, lag_minutes)
    return Status(
        now=now.isoformat(),
        shard_count=settings.shard_count,
        nodes=nodes,
        unowned_shards=[s for s in range(settings.shard_count) if s not in owned],
        outbox_backlog=int(backlog["n"] or 0),
        oldest_due_unsent=_iso(oldest),
        oldest_due_unsent_age_seconds=(now - oldest).total_seconds() if oldest else None,
        lag_window_minutes=lag_minutes,
        lag_samples=len(lags),
        lag_p99_seconds=percentile(lags, 0.99),
        parked_schedules=Schedule.objects.filter(state=ScheduleState.PARKED).count(),
        unclaimed_past_redelivery=unclaimed,
        redelivery_timeout_seconds=timeout,
    )


def lag_window(now: datetime, minutes: float) -> QuerySet[Any]:
    """(enqueued_at, scheduled_for) of the newest LAG_SAMPLE_LIMIT non-manual occurrences
    scheduled in the last ``minutes`` and sent: the admin overview's window, shorter.

    An occurrence still unsent is not in it (the outbox backlog and its oldest due row
    are); neither is one scheduled before the window and sent late in it, whose lateness
    the oldest due row showed while it waited.
    """
    since = now - timedelta(minutes=minutes)
    sent = Occurrence.objects.filter(manual=False).sent_scheduled_between(since, now)
    return sent.values_list("enqueued_at", "scheduled_for")[:LAG_SAMPLE_LIMIT]


def _recent_lags(now: datetime, minutes: float) -> list[float]:
    """``enqueued_at - scheduled_for`` over :func:`lag_window`."""
    rows = lag_window(now, minutes)
    return [max(0.0, (enq - sched).total_seconds()) for enq, sched in rows if enq is not None]


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (``None`` for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


@dataclass
class ProbeResult:
    ok: bool
    checks: dict[str, str]

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1


def local_nodes(node: str | None) -> list[str]:
    """The node named, or every beat node of this host (a probe runs in the beat's pod)."""
    if node:
        return [node]
    prefix = f"beat@{socket.gethostname()}:"
    return list(
        BeatNode.objects.filter(name__startswith=prefix)
        .order_by("name")
        .values_list("name", flat=True)
    )


def liveness(
    node: str | None = None,
    *,
    max_age: float = DEFAULT_LIVENESS_MAX_AGE,
    clock: Clock = SYSTEM_CLOCK,
) -> ProbeResult:
    names = local_nodes(node)
    if not names:
        return ProbeResult(False, {"node": "no beat node registered on this host"})
    now = clock.now()
    progress = dict(BeatNode.objects.filter(name__in=names).values_list("name", "progress_at"))
    checks: dict[str, str] = {}
    ok = True
    for name in names:
        at = progress.get(name)
        if at is None:
            ok = False
            checks[name] = "no progress recorded"
            continue
        age = (now - at).total_seconds()
        fresh = age <= max_age
        ok = ok and fresh
        checks[name] = (
            f"{'ok' if fresh else 'stale'}: last step {age:.1f} s ago (bound {max_age} s)"
        )
    return ProbeResult(ok, checks)


def readiness(
    node: str | None = None,
    *,
    timeout: float = DEFAULT_PROBE_TIMEOUT,
    app: Any = None,
    clock: Clock = SYSTEM_CLOCK,
) -> ProbeResult:
    checks: dict[str, str] = {}
    db_ok, checks["database"] = _within(timeout, _ping_database)
    broker_ok, checks["broker"] = _within(timeout, lambda: _ping_broker(app, timeout))
    shards_ok = False
    if db_ok:
        shards_ok, checks["shards"] = _holds_shards(node, clock)
    else:
        checks["shards"] = "unknown: database unreachable"
    return ProbeResult(db_ok and broker_ok and shards_ok, checks)


def readiness_of_worker(*, timeout: float = DEFAULT_PROBE_TIMEOUT, app: Any = None) -> ProbeResult:
    """A worker is ready when it reaches the database and the broker within ``timeout``."""
    checks: dict[str, str] = {}
    db_ok, checks["database"] = _within(timeout, _ping_database)
    broker_ok, checks["broker"] = _within(timeout, lambda: _ping_broker(app, timeout))
    return ProbeResult(db_ok and broker_ok, checks)


def _holds_shards(node: str | None, clock: Clock) -> tuple[bool, str]:
    names = local_nodes(node)
    if not names:
        return False, "no beat node registered on this host"
    settings = conf.get()
    now = clock.now()
    alive = BeatNode.objects.filter(
        last_seen__gt=now - timedelta(seconds=settings.lease_seconds)
    ).count()
    counts = dict(
        ShardLease.objects.filter(
            owner__in=names, expires_at__gt=now, shard__lt=settings.shard_count
        )
        .values_list("owner")
        .annotate(n=Count("pk"))
        .values_list("owner", "n")
    )
    # More live nodes than shards: some nodes rightly hold none.
    spare_ok = alive > settings.shard_count
    missing = [name for name in names if not counts.get(name) and not spare_ok]
    detail = ", ".join(f"{name}={counts.get(name, 0)}" for name in names)
    if missing:
        return False, f"holds no shard: {detail}"
    return True, f"ok: {detail}"


def _within(timeout: float, check: Callable[[], None]) -> tuple[bool, str]:
    """Run ``check`` on a thread; a hang past ``timeout`` fails the probe instead of it."""
    outcome: list[str] = []

    def run() -> None:
        try:
            check()
            outcome.append("ok")
        except Exception as exc:  # any failure is the probe's answer, not its crash
            outcome.append(f"error: {type(exc).__name__}: {exc}")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    if not outcome:
        return False, f"timeout after {timeout} s"
    return outcome[0] == "ok", outcome[0]


def _ping_database() -> None:
    try:
        with connection.cursor() as cursor:
            cursor.execute(queries.PING)
    finally:
        close_old_connections()
        connection.close()  # this thread's connection: never leave it open


def _ping_broker(app: Any, timeout: float) -> None:
    if app is None:
        app = current_app
    with app.connection_for_write(connect_timeout=timeout) as conn:
        conn.ensure_connection(max_retries=1, timeout=timeout)
