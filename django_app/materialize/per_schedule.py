"""Materialize due schedules into occurrences and outbox rows, one transaction per schedule.

The database decides who materialized what: occurrence ids are deterministic, inserts use
``INSERT ... ON CONFLICT DO NOTHING RETURNING id`` (a conflict means another node already did
it), and the cursor moves only by a conditional UPDATE on the version and cursor that were
read. Any number of nodes may run this at once; the worst a race costs is a rolled-back
transaction.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Collection, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, Protocol

from django.db import connection, models, transaction
from django.db.models import Model, Q

from celery_scheduler.core import ids
from celery_scheduler.core.clock import Clock
from celery_scheduler.core.enums import (
    MisfirePolicy,
    OccurrenceState,
    ScheduleKind,
    ScheduleState,
)
from celery_scheduler.core.policies import PassPlan, plan_pass
from celery_scheduler.core.reports import MaterializeReport
from celery_scheduler.core.timemath import Trigger, trigger_of
from celery_scheduler.errors import SchedulerError
from celery_scheduler.faults import fault_point
from django_app import conf, observe
from django_app.materialize import queries
from django_app.models import (
    Occurrence,
    OutboxEntry,
    Schedule,
    ScheduleCursor,
    ScheduleVersion,
    ShardLease,
    SkippedSpan,
    Tenant,
)
from django_app.tenancy import budget

logger = logging.getLogger(__name__)

#: Rows per multi-row INSERT; 40 rows x ~22 columns stays under SQLite's 999 parameters.
_INSERT_CHUNK = 40


class Planned(Protocol):
    """What writing a schedule's plan reads of it: a :class:`Schedule`, or the set-based
    materializer's row (:class:`django_app.materialize.set_based.DueSchedule`)."""

    @property
    def id(self) -> uuid.UUID: ...
    @property
    def version(self) -> int: ...
    @property
    def tenant_id(self) -> int: ...
    @property
    def tenant(self) -> Tenant: ...
    @property
    def misfire_policy(self) -> str: ...
    @property
    def max_lateness_seconds(self) -> int: ...
    @property
    def flexible_window_seconds(self) -> int: ...


class _Rollback(SchedulerError):
    """Internal: abort the schedule's transaction (stale cursor or lost fencing)."""

    def __init__(self, kind: str, conflicts: int) -> None:
        super().__init__(kind)
        self.kind = kind
        self.conflicts = conflicts


def trigger_for(schedule: Any, *, created_at: datetime | None = None) -> Trigger:
    """The trigger of a Schedule (or ScheduleVersion: anything with the timing fields).

    CRON -> ``CronTrigger(cron, timezone, dst_gap, dst_fold)``; INTERVAL ->
    ``IntervalTrigger(every, anchor=start_at or created_at)``; ONE_OFF ->
    ``OneOffTrigger(run_at)``. Pass ``created_at`` for objects without one (a ScheduleVersion
    uses its schedule's).
    """
    interval = ScheduleKind(schedule.kind) is ScheduleKind.INTERVAL
    return trigger_of(
        schedule.kind, cron=schedule.cron, timezone=schedule.timezone or "UTC",
        dst_gap=schedule.dst_gap, dst_fold=schedule.dst_fold,
        every=timedelta(seconds=schedule.interval_seconds) if interval else None,
        anchor=(schedule.start_at or created_at or schedule.created_at) if interval else None,
        run_at=schedule.run_at,
    )  # fmt: skip


def materialize_due(
    *,
    clock: Clock,
    shards: Collection[int] | None = None,
    shard_fencing: Mapping[int, int] | None = None,
    horizon: timedelta | None = None,
    batch_size: int | None = None,
    node: str = "",
    settings: conf.SchedulerSettings | None = None,
) -> MaterializeReport:
    """Materialize every ACTIVE schedule with ``next_run_at <= now + horizon``, one
    transaction per schedule (``django_app.wiring.materialize_due`` picks this or the
    set-based materializer for the database).

    See the module docstring and :func:`materialize_one` for the per-schedule contract.
    ``shards`` limits the scan (default: every shard, or the keys of ``shard_fencing``);
    ``shard_fencing`` maps shard -> fencing token, and each transaction for such a shard
    commits only if the ShardLease row still carries that token. ``settings``: the value
    the caller read (beat: once per step); a direct call (a test) leaves it out.
    """
    cfg = settings or conf.get()
    horizon = timedelta(seconds=cfg.horizon_seconds) if horizon is None else horizon
    batch_size = batch_size or cfg.batch_size
    fencing = dict(shard_fencing or {})
    if shards is None and shard_fencing is not None:
        # An empty mapping means "no shards held", never "every shard, unfenced".
        shards = list(fencing)
    now = clock.now()
    until = now + horizon
    due = (
        Schedule.objects.due(until, shards)
        .select_related("tenant", "cursor")
        .order_by("cursor__next_run_at", "id")
    )
    report = MaterializeReport()
    lost: set[int] = set()
    last: tuple[datetime, uuid.UUID] | None = None
    oldest: datetime | None = None
    while True:
        page = due
        if last is not None:
            page = due.filter(after_cursor(*last))
        batch = list(page[:batch_size])
        if last is None and batch:
            oldest = batch[0].next_run_at
        for schedule in batch:
            if schedule.shard in lost:
                continue
            one = materialize_one(
                schedule,
                now=now,
                until=until,
                fencing_token=fencing.get(schedule.shard),
                max_missed=cfg.max_missed_per_pass,
            )
            if one.fenced:
                lost.add(schedule.shard)
            report += one
        if len(batch) < batch_size:
            break
        assert batch[-1].next_run_at is not None
        last = (batch[-1].next_run_at, batch[-1].id)
    observe.materialized(report, oldest_cursor=oldest, now=now)
    if report.stale_cursor or report.fenced or report.history_jumped or report.invalid:
        logger.info("materialize node=%s %s", node, report)
    return report


def count_due_schedules(*, until: datetime, shards: Collection[int] | None, limit: int) -> int:
    """ACTIVE schedules of ``shards`` with a cursor at or before ``until``, counted up to
    ``limit`` (an index range: the cost grows with the schedules due, not with all)."""
    due = ScheduleCursor.objects.filter(active=True, next_run_at__lte=until)
    if shards is not None:
        due = due.filter(shard__in=list(shards))
    # Only indexed columns: an index-only range where the visibility map allows it.
    return due.values("shard", "next_run_at")[:limit].count()


def after_cursor(at: datetime, schedule_id: uuid.UUID) -> Q:
    """Schedules after ``(at, schedule_id)`` in the due order (keyset paging)."""
    return Q(cursor__next_run_at__gt=at) | Q(cursor__next_run_at=at, id__gt=schedule_id)


def materialize_one(
    schedule: Schedule,
    *,
    now: datetime,
    until: datetime,
    fencing_token: int | None,
    max_missed: int,
) -> MaterializeReport:
    """One transaction for one due schedule; returns its counts.

    Inside the transaction, in this order: the fencing check (if a token is given: a no-op
    ``UPDATE shard_lease ... WHERE shard=.. AND fencing_token=..`` that must match one row
    and holds the lease row lock until commit, so a new owner's token bump waits for us);
    fault point ``materialize.before_insert``; the tenant's catch-up slots for the late
    firing times (:func:`reserve_catchup`); the firing occurrences and the MISSED ones,
    each ``ON CONFLICT DO NOTHING``; one outbox row per firing occurrence this transaction
    created; then (if the schedule has no further fire time: ``UPDATE schedule SET
    state=COMPLETED``) ``UPDATE schedulecursor SET next_run_at=<new>, active=<not done>
    WHERE schedule_id=.. AND version=<read> AND next_run_at=<read> AND active``. If that
    matches no row
    the whole transaction rolls back (a stale node never moves the cursor back nor writes
    occurrences of an old version). After commit: fault point ``materialize.after_commit``.
    """
    cursor = schedule.next_run_at
    assert cursor is not None
    try:
        plan = plan_pass(
            trigger_for(schedule),
            cursor,
            now=now,
            until=until,
            policy=MisfirePolicy(schedule.misfire_policy),
            max_lateness=timedelta(seconds=schedule.max_lateness_seconds),
            catchup_cap=schedule.catchup_cap,
            max_missed=max_missed,
            start_at=schedule.start_at,
            end_at=schedule.end_at,
        )
    except (SchedulerError, ValueError) as exc:
        # One unreadable schedule must not stop every other schedule of the shard, nor be
        # re-planned (and logged) on every pass: park it until resume/update fixes it.
        return _park_one(schedule, exc, now=now, fencing_token=fencing_token)
    if not plan.fire and not plan.missed and plan.next_cursor == cursor:
        return MaterializeReport(schedules_seen=1)
    conflicts = 0
    try:
        with transaction.atomic():
            if fencing_token is not None:
                _check_fence(schedule.shard, fencing_token)
            fault_point("materialize.before_insert")
            releases = reserve_catchup([(schedule, plan)], now=now)
            fire_rows = build_fire_rows(schedule, plan, now=now, releases=releases)
            created = insert_ignore(Occurrence, fire_rows)
            missed_rows = build_missed_rows(schedule, plan, now=now)
            created_missed = insert_ignore(Occurrence, missed_rows)
            conflicts = len(fire_rows) + len(missed_rows) - len(created) - len(created_missed)
            write_outbox(schedule, fire_rows, created)
            record_skipped_spans([(schedule, plan)], now=now, max_missed=max_missed)
            done = plan.next_cursor is None
            if done:  # the schedule row first, as every writer locks it
                complete_schedules([schedule.id], now=now)
            # The cursor row carries the version and state copies: one row checked.
            moved = ScheduleCursor.objects.filter(
                pk=schedule.id, version=schedule.version, next_run_at=cursor, active=True
            ).update(next_run_at=plan.next_cursor, active=not done)
            if moved != 1:
                raise _Rollback("stale_cursor", conflicts)
    except _Rollback as rollback:
        return MaterializeReport(
            schedules_seen=1,
            conflicts=rollback.conflicts,
            stale_cursor=int(rollback.kind == "stale_cursor"),
            fenced=int(rollback.kind == "fenced"),
        )
    fault_point("materialize.after_commit")
    if plan.jumped is not None:
        logger.warning(
            "schedule %s: late fire times in [%s, %s) passed over without MISSED rows",
            schedule.id,
            plan.jumped[0].isoformat(),
            plan.jumped[1].isoformat(),
        )
    return MaterializeReport(
        schedules_seen=1,
        occurrences_created=len(created),
        conflicts=conflicts,
        missed=len(created_missed),
        completed=int(done),
        history_jumped=int(plan.jumped is not None),
    )


def complete_schedules(ids: list[uuid.UUID], *, now: datetime) -> None:
    """The schedules whose cursor just moved to None (no further fire time) COMPLETE; their
    cursor rows already say inactive (the cursor move wrote it)."""
    models.QuerySet(Schedule).filter(id__in=ids, state=ScheduleState.ACTIVE.value).update(
        state=ScheduleState.COMPLETED.value, updated_at=now
    )


def _park_one(
    schedule: Schedule, exc: Exception, *, now: datetime, fencing_token: int | None
) -> MaterializeReport:
    """Park ``schedule`` in its own transaction (fenced like a materialization)."""
    try:
        with transaction.atomic():
            if fencing_token is not None:
                _check_fence(schedule.shard, fencing_token)
            reason = park(schedule, exc, now=now)
    except _Rollback:
        return MaterializeReport(schedules_seen=1, invalid=1, fenced=1)
    if reason:
        announce_parked(schedule, reason, exc)
    return MaterializeReport(schedules_seen=1, invalid=1, parked=int(bool(reason)))


def park(schedule: Schedule, exc: Exception, *, now: datetime) -> str:
    """ACTIVE -> PARKED with the reason, in the caller's transaction; returns the reason.

    Conditional on the version, cursor and state that were read (like a cursor move): a
    schedule changed since ("" returned) is left to the next pass. The live version's
    interval closes at the cursor, the first time that was not planned, as a pause
    would close it, so a later resume or update opens the next version cleanly.
    """
    reason = f"cannot plan the stored timing: {type(exc).__name__}: {exc}"[:500]
    cursor = schedule.next_run_at
    moved = Schedule.objects.filter(
        id=schedule.id,
        version=schedule.version,
        cursor__next_run_at=cursor,
        state=ScheduleState.ACTIVE.value,
    ).update(state=ScheduleState.PARKED.value, parked_reason=reason, parked_at=now, updated_at=now)
    if moved != 1:
        return ""
    closed_at = min(now, cursor) if cursor is not None else now
    ScheduleVersion.objects.filter(schedule_id=schedule.id, valid_to__isnull=True).update(
        valid_to=closed_at
    )
    return reason


def announce_parked(schedule: Schedule, reason: str, exc: Exception) -> None:
    """After the park committed: one log line (with the traceback, once) and the metric."""
    logger.warning(
        "schedule %s (%s) parked: %s; resume or update it with a valid timing",
        schedule.id,
        schedule.name,
        reason,
        exc_info=exc,
        extra={"event": "schedule_parked", "schedule_id": str(schedule.id)},
    )
    observe.parked(schedule.tenant.slug)


def record_skipped_spans(
    planned: Iterable[tuple[Planned, PassPlan]], *, now: datetime, max_missed: int
) -> None:
    """Record each plan's jumped-over span (inside the caller's transaction).

    Durable so the reconciler can tell history the policy skipped on purpose from lost
    occurrences; written with the cursor move, so a rolled-back pass records nothing.
    """
    spans = [
        SkippedSpan(
            schedule_id=schedule.id,
            schedule_version=schedule.version,
            first_at=plan.jumped[0],
            resume_at=plan.jumped[1],
            recorded_at=now,
            reason=f"misfire {schedule.misfire_policy}: more than max_missed_per_pass="
            f"{max_missed} late fire times",
        )
        for schedule, plan in planned
        if plan.jumped is not None
    ]
    if spans:
        SkippedSpan.objects.bulk_create(spans, ignore_conflicts=True)


def _check_fence(shard: int, token: int) -> None:
    if not ShardLease.objects.filter(shard=shard, fencing_token=token).update(fencing_token=token):
        raise _Rollback("fenced", 0)


def _base_row(schedule: Planned, t: datetime, *, now: datetime) -> dict[str, Any]:
    return {
        "id": ids.occurrence_id(schedule.id, schedule.version, t),
        "schedule_id": schedule.id,
        "schedule_version": schedule.version,
        "tenant_id": schedule.tenant_id,
        "scheduled_for": t,
        "created_at": now,
    }


def _catchup_rate(schedule: Planned) -> int:
    """The tenant's catch-up rate (per minute) if it applies to this schedule, else 0."""
    if schedule.misfire_policy != MisfirePolicy.CATCH_UP.value:
        return 0
    return int(schedule.tenant.catchup_rate or 0)


def reserve_catchup(
    planned: Iterable[tuple[Planned, PassPlan]], *, now: datetime
) -> dict[int, datetime]:
    """Reserve the tenants' catch-up slots for the late firing times of ``planned``.

    One locked budget read-and-update for all tenants of the transaction
    (:func:`django_app.tenancy.budget.reserve_catchup`); returns tenant -> first slot, which
    :func:`build_fire_rows` hands out in order. Slots are the tenant's across every shard and
    node: a transaction that rolls back gives them back.
    """
    wanted: dict[int, tuple[int, int]] = {}
    for schedule, plan in planned:
        rate = _catchup_rate(schedule)
        late = sum(t in plan.late for t in plan.fire) if rate else 0
        if late:
            k = wanted.get(schedule.tenant_id, (rate, 0))[1]
            wanted[schedule.tenant_id] = (rate, k + late)
    return budget.reserve_catchup(wanted, now)


def build_fire_rows(
    schedule: Planned, plan: PassPlan, *, now: datetime, releases: dict[int, datetime]
) -> list[dict[str, Any]]:
    """Rows of the firing occurrences; late ones of a CATCH_UP schedule whose tenant has a
    ``catchup_rate`` take the next of the slots reserved in ``releases`` (tenant -> next)."""
    rate = _catchup_rate(schedule)
    rows = []
    for t in plan.fire:
        row = _base_row(schedule, t, now=now)
        at = ids.available_at(row["id"], t, schedule.flexible_window_seconds)
        if rate and t in plan.late:
            slot = releases[schedule.tenant_id]
            releases[schedule.tenant_id] = slot + budget.catchup_interval(rate)
            at = max(at, slot)
        row.update(available_at=at, state=OccurrenceState.SCHEDULED.value)
        rows.append(row)
    return rows


def build_missed_rows(schedule: Planned, plan: PassPlan, *, now: datetime) -> list[dict[str, Any]]:
    policy = schedule.misfire_policy
    lateness = schedule.max_lateness_seconds
    rows = []
    for t in plan.missed:
        row = _base_row(schedule, t, now=now)
        late_by = int((now - t).total_seconds())
        row.update(
            available_at=t,
            state=OccurrenceState.MISSED.value,
            finished_at=now,
            reason=f"misfire {policy}: {late_by}s late (max lateness {lateness}s)",
        )
        rows.append(row)
    return rows


def write_outbox(schedule: Schedule, fire_rows: list[dict[str, Any]], created: set[Any]) -> None:
    """The outbox rows of the fire rows this transaction inserted (``created``: their ids)."""
    OutboxEntry.objects.bulk_create(
        OutboxEntry(
            occurrence_id=row["id"],
            scheduled_for=row["scheduled_for"],
            tenant_id=schedule.tenant_id,
            shard=schedule.shard,
            available_at=row["available_at"],
            priority=schedule.priority,
        )
        for row in fire_rows
        if row["id"] in created
    )


def insert_ignore(model: type[Model], rows: list[dict[str, Any]]) -> set[Any]:
    """Insert rows, skipping any that hit a unique constraint; return the pks inserted.

    One statement per chunk: ``INSERT ... ON CONFLICT DO NOTHING RETURNING pk`` (PostgreSQL,
    and SQLite >= 3.35). A conflict never raises, so it cannot abort the transaction. MySQL
    and MariaDB: see :func:`_insert_ignore_mysql`.
    """
    if not rows:
        return set()
    meta = model._meta
    columns = list(meta.concrete_fields)
    pk = meta.pk
    assert pk is not None
    if connection.vendor == "mysql":
        return _insert_ignore_mysql(model, columns, pk, rows)
    created: set[Any] = set()
    for start in range(0, len(rows), _INSERT_CHUNK):
        chunk = rows[start : start + _INSERT_CHUNK]
        params: list[Any] = []
        for row in chunk:
            params.extend(_db_value(field, row) for field in columns)
        sql = queries.insert_values_returning(model, columns, len(chunk))
        with connection.cursor() as cur:
            cur.execute(sql, params)
            created.update(pk.to_python(value) for (value,) in cur.fetchall())
    return created


def _insert_ignore_mysql(
    model: type[Model], columns: list[Any], pk: Any, rows: list[dict[str, Any]]
) -> set[Any]:
    """MySQL 8 / MariaDB: ``INSERT IGNORE`` one row at a time; a row count of 1 means created.

    MySQL has no ``RETURNING``, and a multi-row ``INSERT IGNORE`` only says how many rows
    went in, not which. Like ``ON CONFLICT``, a duplicate key waits for the other inserter's
    transaction and is then skipped without an error. (Django's ``ignore_conflicts`` is the
    same ``INSERT IGNORE``.) A row per statement is the price of the portable path; the
    per-schedule materializer writes a handful of rows per schedule and pass.
    """
    sql = queries.insert_ignore_one(model, columns)
    created: set[Any] = set()
    with connection.cursor() as cur:
        for row in rows:
            cur.execute(sql, [_db_value(field, row) for field in columns])
            if cur.rowcount == 1:
                created.add(row[pk.attname])
    return created


def _db_value(field: Any, row: Mapping[str, Any]) -> Any:
    value = row[field.attname] if field.attname in row else field.get_default()
    return field.get_db_prep_save(value, connection)
