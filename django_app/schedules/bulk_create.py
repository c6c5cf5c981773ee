"""Create or sync many schedules in one call: validated like single creates, all or nothing.

:func:`create_schedules` validates every item exactly as ``lifecycle.create_schedule`` does
(an error names the item's index and field: ``items[3].cron``), then, in one transaction
under the tenant's row lock, looks the idempotency keys up in one query per chunk and writes
every table set-based, one insert per table per chunk: schedules, their first versions,
their tags, and the audit entries. Each row is computed by the same functions a single create
uses (``lifecycle.new_schedule``/``first_version``/``new_tags``), so a schedule created in
bulk cannot be told from one created singly. On PostgreSQL the inserts are ``COPY`` (the
wire format PostgreSQL loads fastest), but the audit entries, which differ only in their
schedule, are built by the server from the chunk's ids; elsewhere they are Django's
``bulk_create``. Values many items share (task name, cron, interval, time zone) are
checked once per call (``validation.BatchMemo``).

:func:`sync_schedules` is the declarative layer over it: the items are the wanted state,
keyed by idempotency key.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, models, transaction
from django.utils import timezone

from celery_scheduler import errors
from celery_scheduler.api_types import BulkCreateReport, ScheduleSyncReport
from celery_scheduler.core.clock import SYSTEM_CLOCK, Clock
from celery_scheduler.core.enums import ScheduleKind, ScheduleState
from django_app import conf
from django_app.db.retry import retry_lock_conflicts
from django_app.models import (
    AuditEntry,
    Schedule,
    ScheduleCursor,
    ScheduleTag,
    ScheduleVersion,
    Tenant,
)
from django_app.schedules import audited, lifecycle, queries, validation

#: Rows per insert statement (and per key lookup): big enough that a round trip is cheap
#: per row, small enough to keep one statement's memory modest.
CHUNK = 5_000

#: The source of the schedules sync creates; ``prune`` only ever cancels these.
SYNC_SOURCE = "sync"

#: Keys an item may carry besides the schedule fields: the rest is per call.
_ITEM_KEYS = validation.INPUT_FIELDS | validation.EXTRA_FIELDS | {"idempotency_key"}


@dataclass(kw_only=True)
class _Item:
    """One validated item."""

    index: int
    spec: validation.ScheduleSpec
    extras: dict[str, Any]
    key: str | None
    digest: str


def _at(index: int, exc: errors.ValidationError) -> errors.ValidationError:
    """The same error class, its message and field prefixed with the item's index."""
    name = f"items[{index}].{exc.field}" if exc.field else f"items[{index}]"
    return type(exc)(f"items[{index}]: {exc}", field=name)


def validate_items(
    items: Iterable[Mapping[str, Any]], *, now: datetime, settings: conf.SchedulerSettings
) -> list[_Item]:
    """Every item through create_schedule's validation, or the first bad one's error."""
    return list(iter_validated(items, now=now, settings=settings))


def iter_validated(
    items: Iterable[Mapping[str, Any]], *, now: datetime, settings: conf.SchedulerSettings
) -> Iterator[_Item]:
    """:func:`validate_items` one item at a time (a bulk create writes while it validates)."""
    json_depth = validation.max_json_depth()
    memo = validation.BatchMemo()  # the task and trigger checks once per distinct value
    for index, item in enumerate(items):
        try:
            if not isinstance(item, Mapping):
                raise errors.ValidationError(
                    f"an item must be a mapping of create_schedule arguments, got "
                    f"{type(item).__name__}"
                )
            values = dict(item)
            unknown = sorted(set(values) - _ITEM_KEYS)
            if unknown:
                raise errors.ValidationError(
                    f"Unknown schedule field(s) {unknown}; allowed: {sorted(_ITEM_KEYS)} "
                    "(tenant, actor and reason are given once per call)",
                    field=unknown[0],
                )
            key = values.pop("idempotency_key", None)
            extras = validation.validate_extras(
                {k: values.pop(k) for k in list(values) if k in validation.EXTRA_FIELDS}
            )
            spec = validation.validate(
                now=now, settings=settings, json_depth=json_depth, memo=memo,
                late_run_at_ok=key is not None, **values,
            )  # fmt: skip
            if key is not None:
                key = validation.checked_text(key, "idempotency_key", required=True)
        except errors.ValidationError as exc:
            raise _at(index, exc) from exc
        digest = lifecycle.content_hash(spec, extras)
        yield _Item(index=index, spec=spec, extras=extras, key=key, digest=digest)


def _chunks(rows: Sequence[Any], size: int = CHUNK) -> Iterator[Sequence[Any]]:
    for start in range(0, len(rows), size):
        yield rows[start : start + size]


def _existing_by_key(tenant: Tenant, keys: Sequence[str]) -> dict[str, tuple[uuid.UUID, str]]:
    """key -> (schedule id, content hash) of the tenant's schedules with those keys."""
    found: dict[str, tuple[uuid.UUID, str]] = {}
    for chunk in _chunks(sorted(set(keys))):
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    queries.existing_by_key(), {"tenant": tenant.pk, "keys": list(chunk)}
                )
                rows: Iterable[tuple[Any, Any, Any]] = cursor.fetchall()
        else:
            rows = Schedule.objects.filter(tenant=tenant, idempotency_key__in=chunk).values_list(
                "idempotency_key", "id", "content_hash"
            )
        found.update({str(k): (pk, digest) for k, pk, digest in rows})
    return found


def _conflict(index: int, key: str, schedule_id: uuid.UUID) -> errors.IdempotencyConflict:
    # The single create's message, prefixed with the item's index.
    return errors.IdempotencyConflict(
        f"items[{index}]: idempotency key {key!r} was already used for schedule "
        f"{schedule_id} with different content; use a new key or update_schedule()"
    )


def create_schedules(
    items: Iterable[Mapping[str, Any]],
    *,
    tenant: Tenant | str | None = None,
    source: str = "api",
    actor: str = "",
    reason: str = "",
    clock: Clock | None = None,
    settings: conf.SchedulerSettings,
) -> BulkCreateReport:
    """Create every item (see the module docstring); nothing is written if one is refused.

    Items are validated while the schedules are written (PostgreSQL loads one chunk while
    the next is validated); the first refused item rolls the transaction back.
    ``settings``: the value the facade read for this call.
    """
    now = (clock or SYSTEM_CLOCK).now()
    items = list(items)
    if not isinstance(tenant, Tenant):
        lifecycle.tenant_slug(tenant)  # a bad slug is refused before the transaction
    with transaction.atomic():
        return _create(
            iter_validated(items, now=now, settings=settings), _raw_keys(items), tenant=tenant,
            source=source, actor=actor, reason=reason, now=now,
            shard_count=settings.shard_count,
        )  # fmt: skip


def _raw_keys(items: Sequence[Any]) -> list[str]:
    """The keys the items name, as validation will read them (to look them up first)."""
    keys = (item.get("idempotency_key") for item in items if isinstance(item, Mapping))
    return [key.strip() for key in keys if isinstance(key, str)]


def _create(
    validated: Iterable[_Item],
    keys: Sequence[str],
    *,
    tenant: Tenant | str | None,
    source: str,
    actor: str,
    reason: str,
    now: datetime,
    shard_count: int,
) -> BulkCreateReport:
    """The writes of create_schedules, in the caller's transaction."""
    # The tenant lock serialises this batch with single creates (they take it too) for the
    # key lookups and the quota: no concurrent create can slip a key in between.
    tenant_obj = lifecycle.locked_tenant(tenant)
    existing = _existing_by_key(tenant_obj, keys)
    ids: list[uuid.UUID] = []
    versions: list[dict[str, Any]] = []
    tags: list[dict[str, Any]] = []
    cursors: list[dict[str, Any]] = []
    replayed = 0
    with _Writer(Schedule) as schedules:
        for item in validated:
            if item.key is not None and item.key in existing:
                schedule_id, digest = existing[item.key]
                if digest != item.digest:
                    raise _conflict(item.index, item.key, schedule_id)
                ids.append(schedule_id)
                replayed += 1
                continue
            spec = item.spec  # a keyed item's late run_at is refused once its key is not a replay
            late = validation.late_run_at(spec.run_at, spec.max_lateness_seconds, now=now)
            if late is not None:
                raise _at(item.index, late)
            row = lifecycle.new_schedule_values(
                tenant_obj.pk, item.spec, item.extras, idempotency_key=item.key,
                digest=item.digest, source=source, now=now, shard_count=shard_count,
                copy_arguments=False,  # the spec is this call's own; the rows only serialise it
            )  # fmt: skip
            if item.key is not None:  # a later item with the same key replays this one
                existing[item.key] = (row["id"], item.digest)
            schedules.add(row)
            cursors.append(cursor_row(row))
            ids.append(row["id"])
            versions.append(lifecycle.first_version_values(row, now))
            if item.extras.get("tags"):
                for tag in lifecycle.tag_values(row["id"], tenant_obj.pk, item.extras["tags"]):
                    tag["schedule_id"] = row["id"]
                    tags.append(tag)
    created = len(versions)
    _check_quota(tenant_obj, created)  # refused: the transaction rolls the rows back
    _write(ScheduleCursor, cursors)
    _write(ScheduleVersion, versions)
    _write(ScheduleTag, tags)
    # One audit entry per item, as one create_schedule call per item writes (a replay too);
    # ``detail`` is left to its default ({}), encoded once per chunk rather than per row.
    entry = {"at": now, "tenant_id": tenant_obj.pk, "action": "create", "actor": actor,
             "reason": reason, "occurrence_id": None}  # fmt: skip
    if connection.vendor == "postgresql":
        _audit_pg(entry, ids)
    else:
        _write(AuditEntry, [{**entry, "schedule_id": schedule_id} for schedule_id in ids])
    return BulkCreateReport(schedule_ids=ids, created=created, existing=replayed)


def _audit_pg(entry: dict[str, Any], ids: Sequence[uuid.UUID]) -> None:
    """The audit entries of ``ids`` built by the server from one array of ids per chunk.

    The rows differ only in their schedule: sending the ids alone spares the client a
    ``COPY`` row (eight encoded values) per item. ``WITH ORDINALITY`` keeps the entries' ids
    in item order, as the rows were sent before.
    """
    statement = queries.audit_many()
    with connection.cursor() as cursor:
        for chunk in _chunks(ids):
            cursor.execute(
                statement,
                {"at": entry["at"], "tenant": entry["tenant_id"], "action": entry["action"],
                 "actor": entry["actor"], "reason": entry["reason"], "ids": list(chunk)},
            )  # fmt: skip


def _check_quota(tenant: Tenant, new: int) -> None:
    """After the batch's ``new`` rows were written (in this transaction), refuse if the
    tenant's live schedules now exceed its quota (raising rolls them back)."""
    if not tenant.max_schedules or new == 0:  # None or 0: no limit (django_app.tenants)
        return
    live = -new + Schedule.objects.live().filter(tenant=tenant).count()
    if live + new > tenant.max_schedules:
        raise errors.QuotaExceeded(
            f"tenant {tenant.slug!r} has {live} schedules and this batch adds {new} "
            f"(max_schedules={tenant.max_schedules})"
        )


def cursor_row(row: dict[str, Any]) -> dict[str, Any]:
    """The cursor row of a new schedule's columns (``new_schedule_values``)."""
    state = row.get("state", ScheduleState.ACTIVE.value)
    return {
        "schedule_id": row["id"],
        "shard": row["shard"],
        "version": row.get("version", 1),
        "active": state == ScheduleState.ACTIVE.value,
        "next_run_at": row["next_run_at"],
    }


def _write(model: type[models.Model], rows: Iterable[dict[str, Any]]) -> None:
    with _Writer(model) as writer:
        for row in rows:
            writer.add(row)


class _Writer:
    """Inserts rows (column values by attribute name; absent ones take the model's
    defaults) as they come: one statement per ``CHUNK`` rows, ``COPY`` on PostgreSQL (the
    rows stream to the server while the next ones are computed), ``bulk_create`` elsewhere.
    """

    def __init__(self, model: type[models.Model]) -> None:
        self.model = model
        self.postgres = connection.vendor == "postgresql"
        self.pending: list[dict[str, Any]] = []
        self.copy: Any = None
        self.cursor: Any = None
        self.count = 0
        if self.postgres:
            fields = [
                f
                for f in model._meta.concrete_fields
                if not (f.primary_key and isinstance(f, models.AutoField | models.BigAutoField))
            ]
            columns = ", ".join(connection.ops.quote_name(str(f.column)) for f in fields)
            self.statement = (
                f"COPY {connection.ops.quote_name(model._meta.db_table)} ({columns}) FROM STDIN"
            )
            self.fields = fields
            self.names = [f.attname for f in fields]
            self.json_positions = [
                (i, f.attname) for i, f in enumerate(fields) if isinstance(f, models.JSONField)
            ]
            self.defaults = self._defaults()

    def _defaults(self) -> dict[str, Any]:
        # What save() gives a column the row leaves out: auto_now(_add) the current time
        # (read once per chunk), else the field's default (JSON ones as JSON text).
        now = timezone.now()
        defaults: dict[str, Any] = {}
        for f in self.fields:
            if getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False):
                defaults[f.attname] = now
            elif isinstance(f, models.JSONField):
                defaults[f.attname] = json.dumps(f.get_default())
            else:
                defaults[f.attname] = f.get_default()
        return defaults

    def __enter__(self) -> _Writer:
        return self

    def add(self, row: dict[str, Any]) -> None:
        if not self.postgres:
            self.pending.append(row)
            if len(self.pending) >= CHUNK:
                self._flush()
            return
        if self.copy is None:
            self.cursor = connection.cursor()
            raw = self.cursor.cursor  # psycopg's cursor: Django's wrapper has no copy()
            self.copy_context = raw.copy(self.statement)
            self.copy = self.copy_context.__enter__()
        defaults = self.defaults
        values = [row[name] if name in row else defaults[name] for name in self.names]
        for position, name in self.json_positions:
            if name in row:  # as Django's JSONField sends it
                values[position] = json.dumps(values[position])
        self.copy.write_row(values)
        self.count += 1
        if self.count >= CHUNK:
            self._end_copy(None)

    def _end_copy(self, exc: BaseException | None) -> None:
        if self.copy is not None:
            self.copy = None
            self.count = 0
            try:
                self.copy_context.__exit__(type(exc) if exc else None, exc, None)
            finally:
                self.cursor.close()
            self.defaults = self._defaults()

    def _flush(self) -> None:
        if self.pending:
            # The plain QuerySet's: each row's cursor is written as a row of its own here.
            rows = [self.model(**r) for r in self.pending]
            models.QuerySet(self.model).bulk_create(rows)  # type: ignore[arg-type]
            self.pending = []

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if self.postgres:
            self._end_copy(exc)
        elif exc is None:
            self._flush()


_STOPPED = {ScheduleState.CANCELED.value, ScheduleState.COMPLETED.value}
_TIMING = ("cron", "interval", "run_at")


def sync_schedules(
    items: Iterable[Mapping[str, Any]],
    *,
    tenant: Tenant | str | None = None,
    prune: bool = False,
    actor: str = "",
    reason: str = "",
    clock: Clock | None = None,
    settings: conf.SchedulerSettings,
) -> ScheduleSyncReport:
    """Upsert ``items`` by idempotency key (see ``celery_scheduler.api.sync_schedules``);
    ``settings``: the value the facade read for this call."""
    now = (clock or SYSTEM_CLOCK).now()
    if prune is None:  # not given (HTTP's null)
        prune = False
    if not isinstance(prune, bool):  # it cancels schedules: never read a value by its truth
        raise errors.ValidationError(
            f"prune must be True or False, got {prune!r}"[:200], field="prune"
        )
    validated = validate_items(items, now=now, settings=settings)
    first_index: dict[str, int] = {}
    for item in validated:
        where = f"items[{item.index}].idempotency_key"
        if item.key is None:
            raise errors.ValidationError(
                f"items[{item.index}]: idempotency_key is required: sync matches schedules by it",
                field=where,
            )
        if item.key in first_index:
            raise errors.ValidationError(
                f"items[{item.index}]: idempotency key {item.key!r} is also the key of "
                f"items[{first_index[item.key]}]; keys must be unique in a sync",
                field=where,
            )
        first_index[item.key] = item.index
    if not isinstance(tenant, Tenant):
        lifecycle.tenant_slug(tenant)
    return _apply_sync(
        validated, list(first_index), tenant=tenant, prune=prune, actor=actor, reason=reason,
        clock=clock, now=now, shard_count=settings.shard_count,
    )  # fmt: skip


@retry_lock_conflicts
def _apply_sync(
    validated: Sequence[_Item],
    keys: Sequence[str],
    *,
    tenant: Tenant | str | None,
    prune: bool,
    actor: str,
    reason: str,
    clock: Clock | None,
    now: datetime,
    shard_count: int,
) -> ScheduleSyncReport:
    """Write a validated sync in one transaction: it locks the tenant, then each schedule it
    updates, so on InnoDB it can be the deadlock victim of a writer holding a schedule row;
    the items are a list by now, so it runs again whole."""
    report = ScheduleSyncReport()
    with transaction.atomic():
        tenant_obj = lifecycle.locked_tenant(tenant)
        stored = _stored_by_key(tenant_obj, keys)
        tags = _tags_of([s.id for s in stored.values()])
        new: list[_Item] = []
        for item in validated:
            assert item.key is not None
            schedule = stored.get(item.key)
            if schedule is None:
                new.append(item)
                report.created.append(item.key)
            elif schedule.state in _STOPPED:
                report.stopped.append(item.key)
            else:
                changes = _changes(schedule, item, tags.get(schedule.id, {}))
                if not changes:
                    report.unchanged.append(item.key)
                    continue
                _update(schedule, item, changes, actor=actor, reason=reason, clock=clock)
                report.updated.append(item.key)
        if new:
            _create(
                new, [i.key for i in new if i.key is not None], tenant=tenant_obj,
                source=SYNC_SOURCE, actor=actor, reason=reason, now=now,
                shard_count=shard_count,
            )  # fmt: skip
        if prune:
            report.pruned.extend(
                _prune(tenant_obj, set(keys), actor=actor, reason=reason, clock=clock)
            )
    return report


def _stored_by_key(tenant: Tenant, keys: Sequence[str]) -> dict[str, Schedule]:
    found: dict[str, Schedule] = {}
    for chunk in _chunks(sorted(keys)):
        for schedule in Schedule.objects.filter(tenant=tenant, idempotency_key__in=chunk):
            assert schedule.idempotency_key is not None
            found[schedule.idempotency_key] = schedule
    return found


def _tags_of(schedule_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, dict[str, str]]:
    out: dict[uuid.UUID, dict[str, str]] = {}
    for chunk in _chunks(schedule_ids):
        rows = ScheduleTag.objects.filter(schedule_id__in=chunk).values_list(
            "schedule_id", "key", "value"
        )
        for schedule_id, key, value in rows:
            out.setdefault(schedule_id, {})[key] = value
    return out


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _changes(schedule: Schedule, item: _Item, tags: dict[str, str]) -> dict[str, Any]:
    """The ``update_schedule`` arguments that make ``schedule`` what ``item`` asks for."""
    current = validation.spec_of(schedule)
    wanted = item.spec
    if (
        wanted.kind is ScheduleKind.INTERVAL
        and wanted.start_at is None
        and current.kind is ScheduleKind.INTERVAL
    ):
        # Without start_at an interval is anchored at its creation: keep that anchor
        # rather than restart the interval from the time of every sync.
        wanted = dataclasses.replace(wanted, start_at=current.start_at)
    have, want = validation.spec_to_input(current), validation.spec_to_input(wanted)
    changes = {k: v for k, v in want.items() if _json(v) != _json(have[k])}
    if set(_TIMING) & set(changes):
        # A new trigger replaces the old one: name all three (the absent ones as None).
        changes.update({k: want[k] for k in _TIMING})
    extras = {
        "max_runs": item.extras.get("max_runs"),
        "pause_after_failures": item.extras.get("pause_after_failures"),
    }
    changes.update({k: v for k, v in extras.items() if getattr(schedule, k) != v})
    wanted_tags = item.extras.get("tags") or {}
    if wanted_tags != tags:
        changes["tags"] = wanted_tags
    return changes


def _update(
    schedule: Schedule,
    item: _Item,
    changes: dict[str, Any],
    *,
    actor: str,
    reason: str,
    clock: Clock | None,
) -> None:
    """The normal update path (version bump, replan, audit); errors name the item."""
    try:
        audited.update_schedule(schedule.id, actor=actor, reason=reason, clock=clock, **changes)
    except errors.ValidationError as exc:
        raise _at(item.index, exc) from exc


def _prune(
    tenant: Tenant, keep: set[str], *, actor: str, reason: str, clock: Clock | None
) -> list[str]:
    """Cancel the tenant's live sync-made schedules whose key is not in ``keep``."""
    live = Schedule.objects.live().filter(tenant=tenant, source=SYNC_SOURCE)
    pruned: list[str] = []
    for schedule_id, key in live.order_by("idempotency_key").values_list("id", "idempotency_key"):
        if key is None or key in keep:
            continue
        audited.cancel_schedule(schedule_id, actor=actor, reason=reason, clock=clock)
        pruned.append(key)
    return pruned
