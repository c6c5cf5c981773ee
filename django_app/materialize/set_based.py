"""Set-based materializer for PostgreSQL: one transaction per batch of due schedules.

Same contract as :mod:`django_app.materialize.per_schedule` (same rows, same cursor moves,
same misfire plans), with the per-schedule round trips replaced by a handful of statements per
batch:

1. up to ``bulk_batch_size`` due schedules in ``(next_run_at, id)`` order, each locked by
   its key (``FOR UPDATE SKIP LOCKED``) as its cursor comes up (:func:`queries.due_batch`):
   nodes take disjoint rows, and lifecycle calls (which lock the same rows) serialise with
   the batch instead of racing it;
2. the fencing check: the batch's shard lease rows are locked in shard order and their
   tokens compared; schedules of a shard whose token moved on are left untouched;
3. fault point ``materialize.before_insert`` (once per batch); the catch-up slots of the
   batch's tenants, reserved in one locked budget read-and-update
   (:func:`django_app.materialize.per_schedule.reserve_catchup`);
4. the firing and MISSED occurrences, ``INSERT ... SELECT FROM unnest(...) ON CONFLICT DO
   NOTHING RETURNING id`` in chunks; one outbox INSERT for the created firing ids;
5. ``UPDATE schedulecursor ... FROM unnest(...) WHERE id, version, next_run_at, active``
   match what was read (the narrow cursor row only; the schedules that have no further fire
   time then COMPLETE); the row count must equal the batch's (the rows are locked, so it
   does). If it does not, the batch rolls back and its schedules go through the per-schedule path.

After commit: fault point ``materialize.after_commit`` (once per batch). Elsewhere than on
PostgreSQL :func:`materialize_due_bulk` is
:func:`django_app.materialize.per_schedule.materialize_due`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction

from celery_scheduler.core.clock import Clock
from celery_scheduler.core.enums import MisfirePolicy, ScheduleKind
from celery_scheduler.core.policies import PassPlan, plan_pass
from celery_scheduler.errors import SchedulerError
from celery_scheduler.faults import fault_point
from django_app import conf, observe
from django_app.db.queries import TIMESTAMPTZ, array_literal
from django_app.materialize import per_schedule as single
from django_app.materialize import queries
from django_app.models import Occurrence, OutboxEntry, Schedule, ShardLease, Tenant

logger = logging.getLogger(__name__)

#: Rows per INSERT statement (arrays per column: the parameter count does not grow).
INSERT_CHUNK = 5_000


class _BatchRejected(SchedulerError):
    """Internal: the batch's cursor UPDATE matched fewer rows than it planned."""


@dataclass(slots=True)
class DueSchedule:
    """What planning reads of a due schedule: its tenant, then one row of
    :func:`queries.due_batch` in its column order. Not a model instance: building one per
    row (and its cursor's) was a third of the client's time per planned row."""

    tenant: Tenant
    id: uuid.UUID
    tenant_id: int
    shard: int
    version: int
    priority: int
    kind: str
    cron: str
    timezone: str
    dst_gap: str
    dst_fold: str
    interval_seconds: int | None
    run_at: datetime | None
    start_at: datetime | None
    end_at: datetime | None
    misfire_policy: str
    max_lateness_seconds: int
    catchup_cap: int
    flexible_window_seconds: int
    #: Read for an interval only (its anchor when it has no ``start_at``).
    created_at: datetime | None
    next_run_at: datetime


@dataclass(slots=True, frozen=True)
class _Page:
    """Which due schedules one batch reads: up to ``size`` after the keyset ``after``."""

    until: datetime
    shards: Collection[int] | None
    lost: set[int]
    after: tuple[datetime, uuid.UUID] | None
    size: int


@dataclass(slots=True)
class _Planned:
    schedule: DueSchedule
    plan: PassPlan


def materialize_due_bulk(
    *,
    clock: Clock,
    shards: Collection[int] | None = None,
    shard_fencing: Mapping[int, int] | None = None,
    horizon: timedelta | None = None,
    batch_size: int | None = None,
    node: str = "",
    settings: conf.SchedulerSettings | None = None,
) -> single.MaterializeReport:
    """:func:`~django_app.materialize.per_schedule.materialize_due`, batch by batch (see module)."""
    if connection.vendor != "postgresql":
        return single.materialize_due(
            clock=clock,
            shards=shards,
            shard_fencing=shard_fencing,
            horizon=horizon,
            batch_size=batch_size,
            node=node,
            settings=settings,
        )
    cfg = settings or conf.get()
    horizon = timedelta(seconds=cfg.horizon_seconds) if horizon is None else horizon
    batch_size = batch_size or cfg.bulk_batch_size
    fencing = dict(shard_fencing or {})
    if shards is None and shard_fencing is not None:
        shards = list(fencing)  # an empty mapping means "no shards held"
    now = clock.now()
    until = now + horizon
    report = single.MaterializeReport()
    lost: set[int] = set()
    last: tuple[datetime, uuid.UUID] | None = None
    oldest: datetime | None = None
    while True:
        page = _Page(until=until, shards=shards, lost=lost, after=last, size=batch_size)
        one, read = _batch(
            page,
            now=now,
            until=until,
            fencing=fencing,
            lost=lost,
            max_missed=cfg.max_missed_per_pass,
        )
        report += one
        if read and oldest is None:
            oldest = read[0].next_run_at
        if len(read) < batch_size:
            break
        last = (read[-1].next_run_at, read[-1].id)
    observe.materialized(report, oldest_cursor=oldest, now=now)
    if report.stale_cursor or report.fenced or report.history_jumped or report.invalid:
        logger.info("materialize(bulk) node=%s %s", node, report)
    return report


def _batch(
    page: _Page,
    *,
    now: datetime,
    until: datetime,
    fencing: dict[int, int],
    lost: set[int],
    max_missed: int,
) -> tuple[single.MaterializeReport, list[DueSchedule]]:
    """One batch transaction; returns its counts and the schedules it read (for paging)."""
    read: list[DueSchedule] = []
    parked: list[tuple[Schedule, str, Exception]] = []
    try:
        with transaction.atomic():
            read = _read(page)
            report = _write_batch(
                read,
                now=now,
                until=until,
                fencing=fencing,
                lost=lost,
                max_missed=max_missed,
                parked=parked,
            )
    except _BatchRejected:
        # The batch rolled back, its catch-up slots with it: each schedule reserves anew.
        logger.warning("bulk materializer: a batch's cursors moved; per-schedule fallback")
        report = single.MaterializeReport()
        for schedule in _models(r.id for r in read if r.shard not in lost):
            if schedule.shard in lost:
                continue
            one = single.materialize_one(
                schedule,
                now=now,
                until=until,
                fencing_token=fencing.get(schedule.shard),
                max_missed=max_missed,
            )
            if one.fenced:
                lost.add(schedule.shard)
            report += one
        return report, read
    for schedule, reason, exc in parked:
        single.announce_parked(schedule, reason, exc)
    fault_point("materialize.after_commit")
    return report, read


def _read(page: _Page) -> list[DueSchedule]:
    """Lock and read one batch of due schedules (:func:`queries.due_batch`), with their
    tenants from one read of the batch's few tenants."""
    params: dict[str, Any] = {
        "until": page.until,
        "interval": ScheduleKind.INTERVAL.value,
        "size": page.size,
        "shards": list(page.shards) if page.shards is not None else None,
        "lost": sorted(page.lost),
        "at": page.after[0] if page.after else None,
        "after_id": page.after[1] if page.after else None,
    }
    sql = queries.due_batch(
        shards=page.shards is not None, lost=bool(page.lost), after=page.after is not None
    )
    with connection.cursor() as cur:
        cur.execute(sql, params)
        rows = cur.fetchall()
    tenants = Tenant.objects.in_bulk({row[1] for row in rows})
    return [DueSchedule(tenants[row[1]], *row) for row in rows]


def _models(ids: Iterable[uuid.UUID]) -> list[Schedule]:
    """The Schedule instances of ``ids`` in due order, for the per-schedule paths (a
    rejected batch's fallback, a park): rare, so read whole."""
    return list(
        Schedule.objects.filter(id__in=list(ids))
        .select_related("cursor", "tenant")
        .order_by("cursor__next_run_at", "id")
    )


def _write_batch(
    read: list[DueSchedule],
    *,
    now: datetime,
    until: datetime,
    fencing: dict[int, int],
    lost: set[int],
    max_missed: int,
    parked: list[tuple[Schedule, str, Exception]],
) -> single.MaterializeReport:
    """Plan, park and write one locked batch; fills ``parked`` for the caller to announce
    after commit (a rolled-back batch parks nothing: the per-schedule fallback does)."""
    fenced = _fence(sorted({s.shard for s in read if s.shard in fencing}), fencing)
    lost.update(fenced)
    seen = sum(s.shard not in fenced for s in read) + len(fenced)
    invalid = 0
    planned: list[_Planned] = []
    memo: dict[tuple[Any, ...], PassPlan] = {}
    for schedule in read:
        if schedule.shard in fenced:
            continue
        try:
            plan = _plan(schedule, now=now, until=until, max_missed=max_missed, memo=memo)
        except (SchedulerError, ValueError) as exc:
            # Park it (the row is locked and its shard fenced by this batch) instead of
            # re-planning and logging it on every pass.
            invalid += 1
            (whole,) = _models([schedule.id])
            reason = single.park(whole, exc, now=now)
            if reason:
                parked.append((whole, reason, exc))
            continue
        if plan.fire or plan.missed or plan.next_cursor != schedule.next_run_at:
            planned.append(_Planned(schedule, plan))
    if not planned:
        return single.MaterializeReport(
            schedules_seen=seen, invalid=invalid, parked=len(parked), fenced=len(fenced)
        )
    fault_point("materialize.before_insert")
    # The batch's catch-up slots, for every tenant at once (one budget UPDATE per batch).
    releases = single.reserve_catchup(((p.schedule, p.plan) for p in planned), now=now)
    fire_rows: list[dict[str, Any]] = []
    missed_rows: list[dict[str, Any]] = []
    owner: dict[uuid.UUID, DueSchedule] = {}
    for item in planned:
        rows = single.build_fire_rows(item.schedule, item.plan, now=now, releases=releases)
        fire_rows += rows
        missed_rows += single.build_missed_rows(item.schedule, item.plan, now=now)
        owner.update((row["id"], item.schedule) for row in rows)
    created = insert_ignore(Occurrence, fire_rows)
    created_missed = insert_ignore(Occurrence, missed_rows)
    _insert_outbox([r for r in fire_rows if r["id"] in created], owner, now=now)
    single.record_skipped_spans(
        [(item.schedule, item.plan) for item in planned], now=now, max_missed=max_missed
    )
    done = _advance(planned, now=now)
    for item in planned:
        if item.plan.jumped is not None:
            logger.warning(
                "schedule %s: late fire times in [%s, %s) passed over without MISSED rows",
                item.schedule.id,
                item.plan.jumped[0].isoformat(),
                item.plan.jumped[1].isoformat(),
            )
    return single.MaterializeReport(
        schedules_seen=seen,
        occurrences_created=len(created),
        conflicts=len(fire_rows) + len(missed_rows) - len(created) - len(created_missed),
        missed=len(created_missed),
        completed=done,
        fenced=len(fenced),
        history_jumped=sum(item.plan.jumped is not None for item in planned),
        invalid=invalid,
        parked=len(parked),
    )


def _plan(
    schedule: DueSchedule,
    *,
    now: datetime,
    until: datetime,
    max_missed: int,
    memo: dict[tuple[Any, ...], PassPlan],
) -> PassPlan:
    """The schedule's pass plan; ``memo`` shares it between the batch's schedules with the
    same timing and cursor (plans are pure and read-only: the top of the hour is mostly
    a few expressions, such as ``0 * * * *``, over and over)."""
    # created_at only anchors an interval without start_at (single.trigger_for).
    anchor = schedule.created_at if schedule.kind == ScheduleKind.INTERVAL.value else None
    key = (
        schedule.kind, schedule.cron, schedule.timezone, schedule.dst_gap, schedule.dst_fold,
        schedule.interval_seconds,
        schedule.start_at, anchor, schedule.run_at, schedule.end_at,
        schedule.next_run_at, schedule.misfire_policy, schedule.max_lateness_seconds,
        schedule.catchup_cap,
    )  # fmt: skip
    if key not in memo:
        memo[key] = _plan_one(schedule, now=now, until=until, max_missed=max_missed)
    return memo[key]


def _plan_one(
    schedule: DueSchedule, *, now: datetime, until: datetime, max_missed: int
) -> PassPlan:
    return plan_pass(
        single.trigger_for(schedule),
        schedule.next_run_at,
        now=now,
        until=until,
        policy=MisfirePolicy(schedule.misfire_policy),
        max_lateness=timedelta(seconds=schedule.max_lateness_seconds),
        catchup_cap=schedule.catchup_cap,
        max_missed=max_missed,
        start_at=schedule.start_at,
        end_at=schedule.end_at,
    )


def _fence(shards: list[int], fencing: dict[int, int]) -> set[int]:
    """Lock the lease rows (in shard order: no deadlock between nodes) and compare tokens.

    The locks last until commit, so a takeover cannot bump a token between this check and
    the batch's writes. Returns the shards whose token moved on.
    """
    if not shards:
        return set()
    rows = ShardLease.objects.select_for_update().filter(shard__in=shards).order_by("shard")
    current = dict(rows.values_list("shard", "fencing_token"))
    return {s for s in shards if current.get(s) != fencing[s]}


def _pg_type(field: Any) -> str:
    kind = str(field.db_type(connection))
    return "varchar" if kind.startswith("varchar") else kind


def insert_ignore(model: Any, rows: list[dict[str, Any]]) -> set[Any]:
    """``INSERT ... ON CONFLICT DO NOTHING RETURNING pk`` of ``rows``; returns the pks
    inserted (see :func:`_insert_sql` for the statement's shape)."""
    created: set[Any] = set()
    for start in range(0, len(rows), INSERT_CHUNK):
        sql, params = _insert_sql(model, rows[start : start + INSERT_CHUNK], skip={})
        with connection.cursor() as cur:
            cur.execute(queries.returning_created(sql, model), params)
            created.update(value for (value,) in cur.fetchall())
    return created


def _insert_sql(
    model: Any, chunk: list[dict[str, Any]], *, skip: Collection[str]
) -> tuple[str, list[Any]]:
    """``INSERT INTO t (cols) SELECT v.*, <constants> FROM unnest(<arrays>) v``.

    Python values go to psycopg as they are (uuid, aware datetime, int, str): Django's
    per-value preparation cost more than the statement. A column with one value in every
    row is a scalar parameter, not an array (most columns of a fresh occurrence); a
    nullable column that is NULL in every row is left out (NULL default).
    """
    varying: list[tuple[Any, list[Any]]] = []
    constant: list[tuple[Any, Any]] = []
    # Rows built by one function carry the same keys: a column none of them names is its
    # default in every row, with no need to look at each row.
    keys = chunk[0].keys()
    uniform = all(row.keys() == keys for row in chunk)
    for field in model._meta.concrete_fields:
        if field.attname in skip:
            continue
        default = field.get_default()
        if uniform and field.attname not in keys:
            if default is not None or not field.null:
                constant.append((field, default))
            continue
        values = [row.get(field.attname, default) for row in chunk]
        first = values[0]
        if all(v == first and type(v) is type(first) for v in values):
            if first is not None or not field.null:
                constant.append((field, first))
        else:
            varying.append((field, values))
    sql = queries.insert_from_arrays(
        model,
        [(f, _pg_type(f)) for f, _ in varying],
        [(f, _pg_type(f)) for f, _ in constant],
        len(chunk),
    )
    arrays = [array_literal(v, _pg_type(f)) for f, v in varying]
    params = [v for _, v in constant] + arrays  # placeholder order
    return sql, params


def _insert_outbox(
    rows: list[dict[str, Any]], owner: dict[uuid.UUID, DueSchedule], *, now: datetime
) -> None:
    entries = [
        {
            "occurrence_id": row["id"],
            "scheduled_for": row["scheduled_for"],
            "tenant_id": owner[row["id"]].tenant_id,
            "shard": owner[row["id"]].shard,
            "available_at": row["available_at"],
            "priority": owner[row["id"]].priority,
            "created_at": now,
        }
        for row in rows
    ]
    for start in range(0, len(entries), INSERT_CHUNK):
        sql, params = _insert_sql(OutboxEntry, entries[start : start + INSERT_CHUNK], skip={"id"})
        with connection.cursor() as cur:
            cur.execute(sql, params)


def _advance(planned: list[_Planned], *, now: datetime) -> int:
    """The conditional cursor UPDATE for the whole batch (the narrow cursor rows only);
    then the schedules with no further fire time COMPLETE. Returns how many did."""
    params: dict[str, Any] = {
        "ids": array_literal([p.schedule.id for p in planned], "uuid"),
        "versions": array_literal([p.schedule.version for p in planned], "integer"),
        "cursors": array_literal([p.schedule.next_run_at for p in planned], TIMESTAMPTZ),
        "nexts": array_literal([p.plan.next_cursor for p in planned], TIMESTAMPTZ),
    }
    with connection.cursor() as cur:
        cur.execute(queries.advance(), params)
        moved = cur.rowcount
    if moved != len(planned):
        raise _BatchRejected(f"cursor UPDATE matched {moved} of {len(planned)} schedule(s)")
    done = [p.schedule.id for p in planned if p.plan.next_cursor is None]
    if done:
        single.complete_schedules(done, now=now)
    return len(done)
