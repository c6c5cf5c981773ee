"""The lifecycle of schedules: create, update, pause, resume, cancel, run now.

Each call is one database transaction that locks the schedule row, so it serialises with
the materializer's conditional cursor update (``WHERE version = <read>``) and with the
relay's row locks: once a call that bumps the version has committed, no occurrence of an
older version is materialized or published any more. A call that the database chose as a
deadlock victim (InnoDB does, racing the materializer) runs again
(:mod:`django_app.db.retry`). Rows are never deleted; invalidated
occurrences become CANCELED and stay for audit.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import IntegrityError, connection, transaction

from celery_scheduler import errors
from celery_scheduler.core import ids, timemath
from celery_scheduler.core.clock import SYSTEM_CLOCK, Clock
from celery_scheduler.core.enums import (
    MisfirePolicy,
    OccurrenceState,
    ScheduleKind,
    ScheduleState,
)
from celery_scheduler.core.states import UNCLAIMED
from django_app import conf
from django_app.db.retry import retry_lock_conflicts
from django_app.materialize.per_schedule import trigger_for
from django_app.models import (
    ManualRunKey,
    Occurrence,
    OutboxEntry,
    Schedule,
    ScheduleTag,
    ScheduleVersion,
    Tenant,
)
from django_app.schedules import audit, create_pg, replan, validation
from django_app.schedules.skips import mark_skipped_times
from django_app.schedules.validation import spec_of
from django_app.tenancy import waiting


@dataclass(frozen=True, kw_only=True)
class LifecycleResult:
    """What a lifecycle call really did, for the caller to report truthfully."""

    schedule: Schedule
    version: int
    state: str
    invalidated: int = 0
    still_running: list[uuid.UUID] = field(default_factory=list)
    changed: bool = True

    def describe(self) -> str:
        parts = [f"{self.schedule.name}: {self.state.lower()} (version {self.version})"]
        if not self.changed:
            parts[0] = f"{self.schedule.name}: already {self.state.lower()}"
        parts.append(
            f"{self.invalidated} pending occurrence{'s' if self.invalidated != 1 else ''} "
            "invalidated"
        )
        running = len(self.still_running)
        if running:
            parts.append(f"{running} still running")
        return ", ".join(parts)


def resolve_tenant(tenant: Tenant | str | None) -> Tenant:
    """The tenant object for a slug (the default tenant is created on first use)."""
    if isinstance(tenant, Tenant):
        return tenant
    slug = tenant_slug(tenant)
    if slug == conf.get().default_tenant:
        return Tenant.objects.get_or_create(slug=slug, defaults={"name": slug})[0]
    try:
        return Tenant.objects.get(slug=slug)
    except Tenant.DoesNotExist:
        raise errors.ValidationError(f"Unknown tenant {slug!r}", field="tenant") from None


def tenant_slug(tenant: str | None) -> str:
    """The validated slug a caller named (the default tenant's when None or empty)."""
    slug = tenant or conf.get().default_tenant
    if not isinstance(slug, str):
        raise errors.ValidationError(
            f"tenant must be a Tenant or a slug, got {slug!r}", field="tenant"
        )
    # NUL, bad Unicode, longer than the column
    validation.checked_text(slug, "tenant", max_length=64)
    return slug


def locked_tenant(tenant: Tenant | str | None) -> Tenant:
    """:func:`resolve_tenant`, row-locked in the caller's transaction, in one query.

    The lock makes a create's quota check and its insert atomic.
    """
    if isinstance(tenant, Tenant):
        return Tenant.objects.select_for_update().get(pk=tenant.pk)
    slug = tenant_slug(tenant)
    try:
        return Tenant.objects.select_for_update().get(slug=slug)
    except Tenant.DoesNotExist:
        if slug != conf.get().default_tenant:
            raise errors.ValidationError(f"Unknown tenant {slug!r}", field="tenant") from None
    resolve_tenant(slug)  # creates the default tenant on first use
    return Tenant.objects.select_for_update().get(slug=slug)


@retry_lock_conflicts
def create_schedule(
    *,
    tenant: Tenant | str | None = None,
    idempotency_key: str | None = None,
    clock: Clock | None = None,
    source: str = "api",
    audited_by: tuple[str, str] | None = None,
    **values: Any,
) -> Schedule:
    """Validate and create a schedule; the same idempotency key returns the same schedule.

    ``audited_by`` (actor, reason): write the create's audit entry for the schedule (created
    or replayed) in the same transaction, so it commits with it, in one commit.

    Queries: on PostgreSQL one statement that locks the tenant, looks the key up, counts
    the quota and inserts the schedule, its first version, tags and audit entry
    (:mod:`django_app.schedules.create_pg`); elsewhere one query per step.
    """
    now = (clock or SYSTEM_CLOCK).now()
    extras = validation.validate_extras(
        {k: values.pop(k) for k in list(values) if k in validation.EXTRA_FIELDS}
    )
    # A keyed create's retry may come after its one-off's run_at has passed: the key is
    # looked up first, and the lateness refused only if it names no schedule yet.
    spec = validation.validate(now=now, late_run_at_ok=idempotency_key is not None, **values)
    if idempotency_key is not None:
        idempotency_key = validation.checked_text(idempotency_key, "idempotency_key", required=True)
    if not isinstance(tenant, Tenant):
        tenant_slug(tenant)  # a bad slug is a ValidationError before the transaction
    digest = content_hash(spec, extras)
    late = validation.late_run_at(spec.run_at, spec.max_lateness_seconds, now=now)
    if idempotency_key is not None and late is not None:
        return _replay_of_late_create(tenant, idempotency_key, digest, late, now, audited_by)
    if connection.vendor == "postgresql" and ONE_STATEMENT_CREATE:
        return _create_in_one_statement(
            tenant, spec, extras, idempotency_key=idempotency_key, digest=digest,
            source=source, now=now, audited_by=audited_by,
        )  # fmt: skip
    with transaction.atomic():
        tenant_obj = locked_tenant(tenant)
        schedule = _create_step_by_step(
            tenant_obj, spec, extras, idempotency_key=idempotency_key, digest=digest,
            source=source, now=now,
        )  # fmt: skip
        if audited_by is not None:
            actor, reason = audited_by
            audit.entry("create", schedule, actor=actor, reason=reason, at=now).save()
    return schedule


def _replay_of_late_create(
    tenant: Tenant | str | None,
    key: str,
    digest: str,
    refusal: errors.InvalidTiming,
    now: datetime,
    audited_by: tuple[str, str] | None,
) -> Schedule:
    """The schedule ``key`` already made with this content (audited as any replay); else
    ``refusal``, the one-off's ``run_at`` being past its ``max_lateness``."""
    with transaction.atomic():
        tenant_obj = locked_tenant(tenant)
        existing = _by_idempotency_key(tenant_obj, key, digest)
        if existing is None:
            raise refusal
        if audited_by is not None:
            actor, reason = audited_by
            audit.entry("create", existing, actor=actor, reason=reason, at=now).save()
    return existing


#: PostgreSQL creates in one call of ``django_app_create_schedule()`` (tests turn it off to
#: compare the rows of the two paths).
ONE_STATEMENT_CREATE = True


def _create_in_one_statement(
    tenant: Tenant | str | None,
    spec: validation.ScheduleSpec,
    extras: dict[str, Any],
    *,
    idempotency_key: str | None,
    digest: str,
    source: str,
    now: datetime,
    audited_by: tuple[str, str] | None,
) -> Schedule:
    """The create as one statement (:mod:`django_app.schedules.create_pg`): the rows are
    built here, the tenant's id is filled in by the statement that locks it."""
    slug = tenant.slug if isinstance(tenant, Tenant) else tenant_slug(tenant)
    schedule = Schedule(
        **new_schedule_values(
            None, spec, extras, idempotency_key=idempotency_key, digest=digest,
            source=source, now=now,
        )
    )  # fmt: skip
    entry = None
    if audited_by is not None:
        entry = audit.entry("create", schedule, actor=audited_by[0], reason=audited_by[1], at=now)
    tags = sorted((extras.get("tags") or {}).items())
    version = first_version(schedule, now)
    outcome = create_pg.create(slug, schedule, version, tags, entry)
    if outcome.kind == "no_tenant":
        resolve_tenant(slug)  # the default tenant is created on first use; others raise
        outcome = create_pg.create(slug, schedule, version, tags, entry)
    if outcome.kind == "quota":
        raise _quota_exceeded(slug, outcome.live, outcome.max_schedules)
    assert outcome.schedule_id is not None, outcome
    assert outcome.tenant_id is not None, outcome
    if outcome.kind == "conflict":
        raise _idempotency_conflict(idempotency_key, outcome.schedule_id)
    if outcome.kind == "created":
        schedule.tenant_id = outcome.tenant_id
        schedule._state.adding = False
        schedule._state.db = connection.alias
        return schedule
    return Schedule.objects.get(pk=outcome.schedule_id)  # replayed


def _create_step_by_step(
    tenant_obj: Tenant,
    spec: validation.ScheduleSpec,
    extras: dict[str, Any],
    *,
    idempotency_key: str | None,
    digest: str,
    source: str,
    now: datetime,
) -> Schedule:
    """The writes one query at a time (SQLite, MySQL/MariaDB)."""
    if idempotency_key is not None:
        existing = _by_idempotency_key(tenant_obj, idempotency_key, digest)
        if existing is not None:
            return existing
    _check_quota(tenant_obj)
    schedule = new_schedule(
        tenant_obj, spec, extras, idempotency_key=idempotency_key, digest=digest,
        source=source, now=now,
    )  # fmt: skip
    if idempotency_key is None:
        schedule.save(force_insert=True)
    else:
        try:
            with transaction.atomic():
                schedule.save(force_insert=True)
        except IntegrityError:
            # A concurrent create with the same key won the unique constraint.
            winner = _by_idempotency_key(tenant_obj, idempotency_key, digest)
            if winner is None:
                raise
            return winner
    # A new schedule has no version row and no skipped times yet: a plain insert.
    first_version(schedule, now).save(force_insert=True)
    if extras.get("tags"):
        ScheduleTag.objects.bulk_create(new_tags(schedule, extras["tags"]))
    return schedule


def new_schedule(
    tenant: Tenant,
    spec: validation.ScheduleSpec,
    extras: dict[str, Any],
    *,
    idempotency_key: str | None,
    digest: str,
    source: str,
    now: datetime,
) -> Schedule:
    """The unsaved row of a new schedule (see :func:`new_schedule_values`)."""
    values = new_schedule_values(
        tenant.pk, spec, extras, idempotency_key=idempotency_key, digest=digest,
        source=source, now=now,
    )  # fmt: skip
    del values["tenant_id"]
    return Schedule(tenant=tenant, **values)


def new_schedule_values(
    tenant_id: int | None,
    spec: validation.ScheduleSpec,
    extras: dict[str, Any],
    *,
    idempotency_key: str | None,
    digest: str,
    source: str,
    now: datetime,
    shard_count: int | None = None,
    copy_arguments: bool = True,
) -> dict[str, Any]:
    """The columns every create sets on a new schedule: id, cursor, shard, anchor, spec.

    The single create builds its row from these, the bulk create writes them as they are:
    one computation, so the two cannot drift apart. Columns left out take their defaults.
    """
    values = spec.model_fields(copy_arguments=copy_arguments)
    schedule_id = uuid.uuid4()
    values.update(
        id=schedule_id, tenant_id=tenant_id, idempotency_key=idempotency_key,
        content_hash=digest, source=source, max_runs=extras.get("max_runs"),
        pause_after_failures=extras.get("pause_after_failures"),
        shard=ids.shard_for(schedule_id, shard_count or conf.get().shard_count),
    )  # fmt: skip
    if spec.kind is ScheduleKind.INTERVAL and spec.start_at is None:
        values["start_at"] = now  # the interval's anchor must survive restarts
    values["next_run_at"] = first_run(spec, values["start_at"], now)
    return values


_VERSION_COLUMNS = ("kind", "cron", "timezone", "dst_gap", "dst_fold", "interval_seconds", "run_at",
                    "start_at", "end_at")  # fmt: skip


def first_version(schedule: Schedule, now: datetime) -> ScheduleVersion:
    """The unsaved version-1 row of a new schedule (what ``_open_version`` writes)."""
    values = first_version_values({**vars(schedule), "next_run_at": schedule.next_run_at}, now)
    del values["schedule_id"]
    return ScheduleVersion(schedule=schedule, **values)


def first_version_values(schedule: dict[str, Any], now: datetime) -> dict[str, Any]:
    """The version row's columns for a new schedule's columns (``schedule_id`` included)."""
    values = {c: schedule[c] for c in _VERSION_COLUMNS}
    values.update(
        schedule_id=schedule["id"], version=schedule.get("version", 1),
        valid_from=min(now, schedule["next_run_at"] or now), valid_to=None,
    )  # fmt: skip
    return values


def new_tags(schedule: Schedule, tags: dict[str, str]) -> list[ScheduleTag]:
    """The unsaved tag rows of a new schedule."""
    return [
        ScheduleTag(schedule=schedule, **values)
        for values in tag_values(schedule.id, schedule.tenant_id, tags)
    ]


def tag_values(
    schedule_id: uuid.UUID, tenant_id: int, tags: dict[str, str]
) -> list[dict[str, Any]]:
    """The tag rows' columns (but ``schedule_id``) of a schedule's tags, in key order."""
    return [{"tenant_id": tenant_id, "key": k, "value": v} for k, v in sorted(tags.items())]


def content_hash(spec: validation.ScheduleSpec, extras: dict[str, Any]) -> str:
    """The spec's digest; non-default extras are folded in (old digests stay valid)."""
    digest = spec.content_hash()
    given = {k: v for k, v in extras.items() if v}
    if not given:
        return digest
    payload = json.dumps([digest, given], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()


def _set_tags(schedule: Schedule, tags: dict[str, str]) -> None:
    """Replace the schedule's tags with ``tags`` (in the caller's transaction)."""
    ScheduleTag.objects.filter(schedule=schedule).delete()
    ScheduleTag.objects.bulk_create(new_tags(schedule, tags))


def _apply_extras(schedule: Schedule, extras: dict[str, Any]) -> None:
    """Set max_runs / pause_after_failures / tags on the locked row (caller saves)."""
    if "max_runs" in extras:
        limit = extras["max_runs"]
        if limit is not None and limit <= schedule.runs_count:
            raise errors.ValidationError(
                f"max_runs {limit} is not above the {schedule.runs_count} runs already made",
                field="max_runs",
            )
        schedule.max_runs = limit
    if "pause_after_failures" in extras:
        schedule.pause_after_failures = extras["pause_after_failures"]
    if "tags" in extras:
        _set_tags(schedule, extras["tags"])


@retry_lock_conflicts
def update_schedule(
    schedule_id: uuid.UUID | str,
    *,
    clock: Clock | None = None,
    expected_version: int | None = None,
    **changes: Any,
) -> LifecycleResult:
    """Apply ``changes`` as a new version; unclaimed older-version occurrences are canceled.

    With ``expected_version``, raise :class:`errors.VersionConflict` (nothing written) unless
    the schedule is still at that version. ``max_runs``, ``pause_after_failures`` and ``tags``
    are not part of the versioned timing: a change of only those applies in place (no new
    version, nothing invalidated).
    """
    now = (clock or SYSTEM_CLOCK).now()
    extras = validation.validate_extras(
        {k: changes.pop(k) for k in list(changes) if k in validation.EXTRA_FIELDS}
    )
    with transaction.atomic():
        schedule = _locked(schedule_id)
        _check_version(schedule, expected_version)
        if schedule.state in (ScheduleState.CANCELED, ScheduleState.COMPLETED):
            raise errors.InvalidStateTransition(
                f"schedule {schedule.id} is {schedule.state}; it cannot be updated"
            )
        _apply_extras(schedule, extras)
        if not changes:
            schedule.save()
            return LifecycleResult(
                schedule=schedule, version=schedule.version, state=schedule.state
            )
        old_spec = spec_of(schedule)
        current = validation.spec_to_input(old_spec)
        timing = {"cron", "interval", "run_at"} & set(changes)
        if timing:  # a new trigger replaces the old one instead of adding to it
            current.update(cron=None, interval=None, run_at=None)
        given = {name for name in timing if changes[name] is not None}
        if given - {"cron"}:  # an interval or one-off has no DST policy (validation)
            current.update(dst_gap=None, dst_fold=None)
        merged = {**current, **changes}
        spec = validation.validate(now=now, **merged)
        trigger_changed = _timing_of(spec) != _timing_of(old_spec)
        for name, value in spec.model_fields().items():
            setattr(schedule, name, value)
        if spec.kind is ScheduleKind.INTERVAL and spec.start_at is None:
            schedule.start_at = now
        schedule.content_hash = spec.content_hash()
        never_claimed = replan.never_claimed(schedule)
        invalidated_from = min(never_claimed, default=None)
        # The same trigger's runs an older version decided stay decided (a new trigger's
        # span starts at the update instead).
        owed = set() if trigger_changed else never_claimed
        old_cursor = schedule.next_run_at
        closed_at = _materialized_until(schedule, now)
        schedule.version += 1
        result = _invalidate(schedule, now)
        if schedule.state == ScheduleState.PARKED:
            # The merged timing validated above: the schedule can be planned again. Its
            # version was closed when it was parked; the cursor resumes where it stopped.
            _unpark(schedule)
        if schedule.state == ScheduleState.ACTIVE:
            start = old_cursor
            if trigger_changed or old_cursor is None:
                start = first_run(spec, schedule.start_at, now)
            elif invalidated_from is not None:
                # The invalidated times that nobody claimed are planned again; the ones
                # an older version claimed or finished are skipped (django_app.schedules.replan).
                start = min(old_cursor, invalidated_from)
            schedule.next_run_at = replan.start_version_at(schedule, start, now=now, owed=owed)
            _close_version(schedule, closed_at)
            _open_version(schedule, min(now, start or now))
        elif schedule.state == ScheduleState.PAUSED and trigger_changed:
            # The new trigger applies from now on: a resume catches up (by the misfire
            # policy) its times after this update, never the ones before it.
            schedule.next_run_at = first_run(spec, schedule.start_at, now)
        schedule.save()
        return LifecycleResult(
            schedule=schedule, version=schedule.version, state=schedule.state, **result
        )


@retry_lock_conflicts
def pause_schedule(
    schedule_id: uuid.UUID | str, *, note: str = "", clock: Clock | None = None
) -> LifecycleResult:
    """Stop materializing; keep the cursor so resume can apply the misfire policy.

    ``note`` (at most 500 characters) is stored as the pause reason, shown by describe and
    the admin; pausing an already paused schedule with a note replaces its note.
    """
    now = (clock or SYSTEM_CLOCK).now()
    note = validation.checked_text(note, "note", max_length=500)
    with transaction.atomic():
        schedule = _locked(schedule_id)
        if schedule.state == ScheduleState.PAUSED:
            if note and note != schedule.pause_reason:
                schedule.pause_reason = note
                schedule.save(update_fields=["pause_reason", "updated_at"])
            return _unchanged(schedule)
        _require_state(schedule, ScheduleState.ACTIVE, "paused")
        result = pause_locked(schedule, now, note)
        return LifecycleResult(
            schedule=schedule, version=schedule.version, state=schedule.state, **result
        )


def pause_locked(schedule: Schedule, now: datetime, reason: str) -> dict[str, Any]:
    """ACTIVE -> PAUSED on a row the caller locked, in its transaction; saves the row."""
    _close_version(schedule, _materialized_until(schedule, now))
    # The cursor goes back to the first time this pause takes from the workers before
    # they claimed it, so resume plans it again (now, or by the misfire policy if it
    # has passed by then) instead of starting after everything materialized so far.
    never_claimed = replan.earliest_never_claimed(schedule)
    if never_claimed is not None and schedule.next_run_at is not None:
        schedule.next_run_at = min(schedule.next_run_at, never_claimed)
    schedule.version += 1
    schedule.state = ScheduleState.PAUSED.value
    schedule.pause_reason = reason[:500]
    schedule.paused_at = now
    result = _invalidate(schedule, now)
    schedule.save()
    return result


@retry_lock_conflicts
def resume_schedule(schedule_id: uuid.UUID | str, *, clock: Clock | None = None) -> LifecycleResult:
    """Resume from now under the misfire policy.

    Fire times that passed while paused: SKIP drops them; FIRE_ONCE keeps the latest one;
    CATCH_UP keeps the latest ``catchup_cap``. They then fire as late occurrences.
    A PARKED schedule resumes the same way once its stored timing can be planned again
    (the runs it planned before the park and nobody claimed yet still run, under the new
    version); otherwise the ValidationError says why and it stays parked.
    """
    now = (clock or SYSTEM_CLOCK).now()
    with transaction.atomic():
        schedule = _locked(schedule_id)
        if schedule.state == ScheduleState.ACTIVE:
            return _unchanged(schedule)
        parked = schedule.state == ScheduleState.PARKED
        owed: set[datetime] = set()
        if parked:
            _require_plannable(schedule, now)
            _unpark(schedule)
            # A park, unlike a pause, left the runs it had planned to the workers: those
            # not claimed yet are the new version's to run (replan.start_version_at).
            owed = replan.never_claimed(schedule)
        else:
            _require_state(schedule, ScheduleState.PAUSED, "resumed")
        spec = spec_of(schedule)
        trigger = spec.trigger(anchor=schedule.start_at or now)
        schedule.version += 1
        if parked:
            _invalidate(schedule, now)
        schedule.state = ScheduleState.ACTIVE.value
        schedule.pause_reason = ""
        schedule.paused_at = None
        schedule.consecutive_failures = 0  # a fresh start for pause_after_failures
        start = _resume_cursor(schedule, trigger, now)
        schedule.next_run_at = replan.start_version_at(schedule, start, now=now, owed=owed)
        if schedule.next_run_at is None:
            schedule.state = ScheduleState.COMPLETED.value
        if start is not None:
            _open_version(schedule, min(now, start))
        schedule.save()
        return LifecycleResult(schedule=schedule, version=schedule.version, state=schedule.state)


@retry_lock_conflicts
def cancel_schedule(schedule_id: uuid.UUID | str, *, clock: Clock | None = None) -> LifecycleResult:
    """Cancel for good. History stays; RUNNING occurrences are reported, not interrupted."""
    now = (clock or SYSTEM_CLOCK).now()
    with transaction.atomic():
        schedule = _locked(schedule_id)
        if schedule.state == ScheduleState.CANCELED:
            return _unchanged(schedule)
        _close_version(schedule, _materialized_until(schedule, now))
        schedule.version += 1
        schedule.state = ScheduleState.CANCELED.value
        schedule.next_run_at = None
        result = _invalidate(schedule, now)
        schedule.save()
        return LifecycleResult(
            schedule=schedule, version=schedule.version, state=schedule.state, **result
        )


@retry_lock_conflicts
def run_now(
    schedule_id: uuid.UUID | str,
    *,
    idempotency_key: str | None = None,
    clock: Clock | None = None,
) -> Occurrence:
    """A one-off manual occurrence with its own id, delivered through the outbox.

    With ``idempotency_key`` the id comes from (schedule, key): asking again with the same
    key returns the occurrence the first request created, whatever became of it. Once
    retention has pruned that occurrence, the answer is rebuilt from its ManualRunKey row
    (its id, time and final state; not saved) and nothing runs again.
    """
    now = (clock or SYSTEM_CLOCK).now()
    if idempotency_key is not None:
        idempotency_key = validation.checked_text(idempotency_key, "idempotency_key", required=True)
    with transaction.atomic():
        # The schedule row lock serialises two requests with one key: the second sees the
        # first's row here.
        schedule = _locked(schedule_id)
        if idempotency_key is not None:
            occ_id = ids.manual_occurrence_id(schedule.id, idempotency_key)
            existing = Occurrence.objects.filter(pk=occ_id).first()
            if existing is not None:
                return existing
            # Read after the occurrence: retention writes the key's final state in the
            # transaction that deletes the occurrence, so a miss above finds it here.
            pruned = ManualRunKey.objects.filter(pk=occ_id).first()
            if pruned is not None:
                return _pruned_run(pruned)
        else:
            occ_id = ids.occurrence_id(schedule.id, schedule.version, now)
        if schedule.state == ScheduleState.CANCELED:
            raise errors.InvalidStateTransition(f"schedule {schedule.id} is canceled")
        occurrence = Occurrence.objects.create(
            id=occ_id,
            schedule=schedule, schedule_version=schedule.version, tenant_id=schedule.tenant_id,
            scheduled_for=now, available_at=now, manual=True, reason="run now",
        )  # fmt: skip
        OutboxEntry.objects.create(
            occurrence=occurrence, scheduled_for=now, tenant_id=schedule.tenant_id,
            shard=schedule.shard, available_at=now, priority=schedule.priority,
        )  # fmt: skip
        if idempotency_key is not None:
            ManualRunKey.objects.create(
                occurrence_id=occ_id, schedule=schedule, tenant_id=schedule.tenant_id,
                schedule_version=schedule.version, scheduled_for=now,
            )  # fmt: skip
        return occurrence


def _pruned_run(key: ManualRunKey) -> Occurrence:
    return Occurrence(
        id=key.occurrence_id, schedule_id=key.schedule_id, tenant_id=key.tenant_id,
        schedule_version=key.schedule_version, scheduled_for=key.scheduled_for,
        available_at=key.scheduled_for, state=key.state, manual=True, reason="run now",
        finished_at=key.finished_at,
    )  # fmt: skip


def _locked(schedule_id: uuid.UUID | str) -> Schedule:
    try:
        pk = uuid.UUID(str(schedule_id))
        return Schedule.objects.select_for_update().get(pk=pk)
    except (Schedule.DoesNotExist, ValueError):
        raise errors.ScheduleNotFound(f"No schedule with id {schedule_id!s}") from None


def _require_plannable(schedule: Schedule, now: datetime) -> None:
    """Raise a ValidationError naming the field if the stored timing still cannot be planned.

    The same computation that parked it: the materializer's trigger and its next fire time.
    """
    try:
        trigger_for(schedule).first_at_or_after(now)
    except errors.ValidationError:
        raise
    except (errors.SchedulerError, ValueError) as exc:
        raise errors.InvalidTiming(
            f"schedule {schedule.id} is still parked: its stored timing cannot be planned "
            f"({type(exc).__name__}: {exc}); update it with a valid timing",
            field=_TIMING_FIELD.get(schedule.kind, "cron"),
        ) from exc


_TIMING_FIELD = {
    ScheduleKind.CRON.value: "cron",
    ScheduleKind.INTERVAL.value: "interval",
    ScheduleKind.ONE_OFF.value: "run_at",
}


def _unpark(schedule: Schedule) -> None:
    """PARKED -> ACTIVE on the in-memory row (the caller saves it in its transaction)."""
    schedule.state = ScheduleState.ACTIVE.value
    schedule.parked_reason = ""
    schedule.parked_at = None


def _check_version(schedule: Schedule, expected: int | str | None) -> None:
    if expected is None:
        return
    loaded = _version_number(expected)
    if loaded == schedule.version:
        return
    raise errors.VersionConflict(
        f"schedule {schedule.id} was changed since you loaded it: you edited version "
        f"{loaded}, it is now version {schedule.version}; reload it and apply your "
        "change again",
        expected=loaded,
        actual=schedule.version,
    )


def _version_number(expected: object) -> int:
    """``expected_version`` as the version number it names: an int, or its decimal text."""
    if isinstance(expected, str) and expected.strip().isdecimal():
        return int(expected)
    if isinstance(expected, bool) or not isinstance(expected, int):
        raise errors.ValidationError(
            f"expected_version must be the version number you loaded, got "
            f"{timemath.short_repr(expected)}",
            field="expected_version",
        )
    return expected


def _require_state(schedule: Schedule, state: ScheduleState, verb: str) -> None:
    if schedule.state != state:
        raise errors.InvalidStateTransition(
            f"schedule {schedule.id} is {schedule.state}; only a {state} schedule can be {verb}"
        )


def _unchanged(schedule: Schedule) -> LifecycleResult:
    return LifecycleResult(
        schedule=schedule, version=schedule.version, state=schedule.state, changed=False
    )


def _invalidate(schedule: Schedule, now: datetime) -> dict[str, Any]:
    """Cancel unclaimed occurrences of older versions; report the running ones."""
    stale = Occurrence.objects.unclaimed().filter(
        schedule=schedule, schedule_version__lt=schedule.version, manual=False
    )
    stale_rows = list(stale.values_list("id", "tenant_id", "reason"))
    stale_ids = [row[0] for row in stale_rows]
    invalidated = Occurrence.objects.filter(id__in=stale_ids).transition(
        OccurrenceState.CANCELED,
        only_from=UNCLAIMED,
        finished_at=now,
        reason=f"invalidated by version {schedule.version}",
    )
    # A waiter of a slot or max_running line leaves it here, not through a claim.
    waiting.wake_after_leaving(((t, reason) for _, t, reason in stale_rows), now)
    # Their outbox rows will never be published; close them so the backlog stays honest.
    OutboxEntry.objects.unsent().filter(occurrence_id__in=stale_ids).update(
        sent_at=now, claimed_by="invalidated"
    )
    running = list(
        Occurrence.objects.filter(
            schedule=schedule, state=OccurrenceState.RUNNING.value
        ).values_list("id", flat=True)
    )
    return {"invalidated": invalidated, "still_running": running}


def first_run(
    spec: validation.ScheduleSpec, start_at: datetime | None, now: datetime
) -> datetime | None:
    if spec.kind is ScheduleKind.ONE_OFF:
        return spec.run_at
    first = validation.first_fire(
        spec, anchor=start_at or now, at=max(now, start_at) if start_at else now
    )
    if first is not None and spec.end_at is not None and first > spec.end_at:
        return None
    return first


def _resume_cursor(schedule: Schedule, trigger: Any, now: datetime) -> datetime | None:
    """Where materialization restarts after a pause, per the misfire policy."""
    upcoming = trigger.first_at_or_after(now)
    policy = MisfirePolicy(schedule.misfire_policy)
    paused_cursor = schedule.next_run_at
    if paused_cursor is not None and paused_cursor >= now:
        return paused_cursor  # nothing was missed while paused
    if policy is MisfirePolicy.SKIP or paused_cursor is None:
        return upcoming
    keep = 1 if policy is MisfirePolicy.FIRE_ONCE else max(schedule.catchup_cap, 1)
    missed: list[datetime] = []
    instant: datetime | None = paused_cursor
    cap = max(keep, 1) * 4 + 10_000  # bounded walk; older backlog beyond it is dropped
    while instant is not None and instant < now and cap > 0:
        missed.append(instant)
        instant = trigger.next_after(instant)
        cap -= 1
    kept = missed[-keep:]
    return kept[0] if kept else upcoming


def _timing_of(spec: validation.ScheduleSpec) -> tuple[Any, ...]:
    return (spec.kind, spec.cron, spec.timezone, spec.dst_gap, spec.dst_fold,
            spec.interval_seconds, spec.run_at, spec.start_at, spec.end_at)  # fmt: skip


def _open_version(schedule: Schedule, valid_from: datetime) -> None:
    ScheduleVersion.objects.update_or_create(
        schedule=schedule,
        version=schedule.version,
        defaults={
            "kind": schedule.kind, "cron": schedule.cron, "timezone": schedule.timezone,
            "dst_gap": schedule.dst_gap, "dst_fold": schedule.dst_fold,
            "interval_seconds": schedule.interval_seconds, "run_at": schedule.run_at,
            "start_at": schedule.start_at, "end_at": schedule.end_at,
            "valid_from": valid_from, "valid_to": None,
        },
    )  # fmt: skip
    if schedule.skip_times:
        mark_skipped_times(schedule, valid_from)


def _materialized_until(schedule: Schedule, now: datetime) -> datetime:
    """Where the live version's expectations end: now, or the cursor if it lags behind.

    Fire times at or after the cursor were never materialized under this version, so the
    reconciler must not expect them of it once the version is closed.
    """
    cursor = schedule.next_run_at
    return min(now, cursor) if cursor is not None else now


def close_live_version(schedule: Schedule, now: datetime) -> None:
    """Close the live version where planning stopped: every time before the cursor has a
    row (run or canceled), none after it will (used when max_runs completes a schedule)."""
    _close_version(schedule, schedule.next_run_at or now)


def _close_version(schedule: Schedule, at: datetime) -> None:
    ScheduleVersion.objects.filter(schedule=schedule, valid_to__isnull=True).update(valid_to=at)


def _by_idempotency_key(tenant: Tenant, key: str, digest: str) -> Schedule | None:
    existing = Schedule.objects.filter(tenant=tenant, idempotency_key=key).first()
    if existing is not None and existing.content_hash != digest:
        raise _idempotency_conflict(key, existing.id)
    return existing


def _idempotency_conflict(key: str | None, schedule_id: uuid.UUID) -> errors.IdempotencyConflict:
    return errors.IdempotencyConflict(
        f"idempotency key {key!r} was already used for schedule {schedule_id} with "
        "different content; use a new key or update_schedule()"
    )


def _check_quota(tenant: Tenant) -> None:
    if not tenant.max_schedules:  # None or 0: no limit (django_app.tenants)
        return
    live = Schedule.objects.live().filter(tenant=tenant).count()
    if live >= tenant.max_schedules:
        raise _quota_exceeded(tenant.slug, live, tenant.max_schedules)


def _quota_exceeded(slug: str, live: int | None, limit: int | None) -> errors.QuotaExceeded:
    return errors.QuotaExceeded(
        f"tenant {slug!r} already has {live} schedules (max_schedules={limit})"
    )
