"""The read side of the management API: describe one schedule, list schedules by page.

Both return the plain dataclasses of :mod:`celery_scheduler.api_types`. A ``tenant`` given
scopes the call: another tenant's schedule is "not found", never "forbidden", so an id
guessed across tenants reveals nothing.

``list_schedules`` pages by keyset on ``(created_at, id)`` (indexes ``schedule_keyset`` and
``schedule_tenant_keyset``): each page is one index range scan from the cursor, so page
10,000 costs what page 1 costs, and rows created while paging neither repeat nor shift
the pages already read.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Unpack
from zoneinfo import ZoneInfo

from django.db.models import Count, Exists, OuterRef, Q, QuerySet, Value
from django.db.models.functions import Lower

from celery_scheduler import errors
from celery_scheduler.api_types import (
    SCHEDULE_FILTERS,
    FireTime,
    OccurrenceSummary,
    ScheduleCounters,
    ScheduleDescription,
    ScheduleFilter,
    SchedulePage,
    ScheduleSummary,
    VersionInfo,
)
from celery_scheduler.core import timemath
from celery_scheduler.core.enums import AttemptOutcome, ScheduleState
from celery_scheduler.core.enums import OccurrenceState as S
from django_app.materialize.per_schedule import trigger_for
from django_app.models import Attempt, Occurrence, Schedule, ScheduleTag, ScheduleVersion, Tenant
from django_app.querysets import SAME_SLOT
from django_app.schedules import validation

MAX_NEXT = 100
MAX_LAST = 1000
MAX_PAGE = 1000
#: Reason prefix of an occurrence canceled by ``skip_occurrence``.
SKIP_REASON = "skipped by operator"
BACKFILL_REASON = "backfill"
_PENDING = {S.SCHEDULED, S.ENQUEUED, S.RUNNING, S.RETRY_WAIT}


def tenant_by_slug(slug: str | None, *, field: str = "tenant") -> Tenant | None:
    """The tenant of a slug (None for None); an unknown slug is a ValidationError."""
    if slug is None:
        return None
    if isinstance(slug, Tenant):
        return slug
    if not isinstance(slug, str) or not slug:
        raise errors.ValidationError(f"{field} must be a tenant slug, got {slug!r}", field=field)
    validation.check_storable(slug, field, errors.ValidationError)  # the lookup would fail
    tenant = Tenant.objects.filter(slug=slug).first()
    if tenant is None:
        raise errors.ValidationError(f"Unknown tenant {slug!r}", field=field)
    return tenant


def get_schedule(schedule_id: uuid.UUID | str, tenant: str | None = None) -> Schedule:
    """The schedule with that id (in ``tenant`` if given), or ScheduleNotFound."""
    try:
        pk = uuid.UUID(str(schedule_id))
    except ValueError:
        raise errors.ScheduleNotFound(f"No schedule with id {schedule_id!s}") from None
    qs = Schedule.objects.select_related("tenant").filter(pk=pk)
    if tenant is not None:
        qs = qs.filter(tenant__slug=tenant.slug if isinstance(tenant, Tenant) else tenant)
    schedule = qs.first()
    if schedule is None:
        raise errors.ScheduleNotFound(f"No schedule with id {schedule_id!s}")
    return schedule


def _count(value: Any, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise errors.ValidationError(
            f"{name} must be an integer from {low} to {high}, got {value!r}", field=name
        )
    return value


def state_reason(schedule: Schedule) -> str:
    if schedule.state == ScheduleState.PAUSED:
        return schedule.pause_reason
    if schedule.state == ScheduleState.PARKED:
        return schedule.parked_reason
    return ""


def remaining_runs(schedule: Schedule) -> int | None:
    if schedule.max_runs is None:
        return None
    return max(schedule.max_runs - schedule.runs_count, 0)


def summary(schedule: Schedule, tags: Mapping[str, str] | None = None) -> ScheduleSummary:
    if tags is None:
        tags = dict(schedule.tags.values_list("key", "value"))
    return ScheduleSummary(
        id=schedule.id,
        tenant=schedule.tenant.slug,
        name=schedule.name,
        task=schedule.task,
        kind=schedule.kind,
        cron=schedule.cron,
        timezone=schedule.timezone,
        dst_gap=schedule.dst_gap,
        dst_fold=schedule.dst_fold,
        interval_seconds=schedule.interval_seconds,
        run_at=schedule.run_at,
        state=schedule.state,
        state_reason=state_reason(schedule),
        version=schedule.version,
        next_run_at=schedule.next_run_at,
        created_at=schedule.created_at,
        updated_at=schedule.updated_at,
        tags=dict(tags),
        max_runs=schedule.max_runs,
        remaining_runs=remaining_runs(schedule),
    )


def describe_schedule(
    schedule_id: uuid.UUID | str,
    *,
    tenant: str | None = None,
    next_count: int = 5,
    last_count: int = 10,
    now: datetime,
) -> ScheduleDescription:
    """See :func:`celery_scheduler.api.describe_schedule`."""
    next_count = _count(next_count, "next_count", 1, MAX_NEXT)
    last_count = _count(last_count, "last_count", 0, MAX_LAST)
    schedule = get_schedule(schedule_id, tenant)
    version = ScheduleVersion.objects.filter(schedule=schedule).order_by("-version").first()
    recent = list(
        Occurrence.objects.filter(schedule=schedule).order_by("-scheduled_for", "-created_at")[
            :last_count
        ]
    )
    return ScheduleDescription(
        schedule=summary(schedule),
        settings=_settings(schedule),
        current_version=None if version is None else _version_info(version),
        paused_at=schedule.paused_at if schedule.state == ScheduleState.PAUSED else None,
        next_fire_times=next_fire_times(schedule, next_count, now=now),
        recent=[occurrence_summary(o) for o in recent],
        counters=counters(schedule),
        runs_counted=schedule.runs_count,
        pause_after_failures=schedule.pause_after_failures,
        consecutive_failures=schedule.consecutive_failures,
        skipped_times=sorted(datetime.fromisoformat(t) for t in schedule.skip_times or []),
    )


def _settings(schedule: Schedule) -> dict[str, Any]:
    values = validation.spec_to_input(validation.spec_of(schedule))
    values["misfire_policy"] = str(values["misfire_policy"])
    values["overlap_policy"] = str(values["overlap_policy"])
    values.update(max_runs=schedule.max_runs, pause_after_failures=schedule.pause_after_failures)
    return values


def _version_info(v: ScheduleVersion) -> VersionInfo:
    return VersionInfo(
        version=v.version, kind=v.kind, cron=v.cron, timezone=v.timezone,
        dst_gap=v.dst_gap, dst_fold=v.dst_fold, interval_seconds=v.interval_seconds,
        run_at=v.run_at, start_at=v.start_at, end_at=v.end_at, valid_from=v.valid_from,
        valid_to=v.valid_to,
    )  # fmt: skip


def origin_of(occurrence: Occurrence) -> str:
    if not occurrence.manual:
        return "scheduled"
    # Backfilled occurrences live under schedule_version 0 (django_app.schedules.backfill).
    return "backfill" if occurrence.schedule_version == 0 else "run_now"


def occurrence_summary(o: Occurrence) -> OccurrenceSummary:
    return OccurrenceSummary(
        id=o.id, scheduled_for=o.scheduled_for, version=o.schedule_version, state=o.state,
        origin=origin_of(o), attempts=o.attempt_count, lag_seconds=o.lag_seconds,
        enqueued_at=o.enqueued_at, started_at=o.started_at, finished_at=o.finished_at,
        reason=o.reason, last_error=o.last_error,
    )  # fmt: skip


def counters(schedule: Schedule) -> ScheduleCounters:
    """Two grouped counts through the (schedule, state) index plus one over attempts."""
    occurrences = Occurrence.objects.filter(schedule=schedule)
    by_state = dict(occurrences.values_list("state").annotate(n=Count("id")).order_by())
    skipped = occurrences.filter(state=S.CANCELED.value, reason__startswith=SKIP_REASON).count()
    runs = occurrences.filter(started_at__isnull=False).count()
    failures = Attempt.objects.filter(
        SAME_SLOT,
        occurrence__schedule=schedule,
        outcome__in=[AttemptOutcome.FAILED, AttemptOutcome.RETRY, AttemptOutcome.LOST],
    ).count()
    return ScheduleCounters(
        runs=runs,
        succeeded=by_state.get(S.SUCCEEDED.value, 0),
        failures=failures,
        dead=by_state.get(S.DEAD.value, 0),
        missed=by_state.get(S.MISSED.value, 0),
        skipped_overlap=by_state.get(S.SKIPPED_OVERLAP.value, 0),
        skipped=skipped,
        canceled=by_state.get(S.CANCELED.value, 0) - skipped,
        pending=sum(by_state.get(s.value, 0) for s in _PENDING),
    )


def next_fire_times(schedule: Schedule, count: int, *, now: datetime) -> list[FireTime]:
    """The next ``count`` times that will fire: pending ones first, then from the cursor.

    Empty unless ACTIVE. Skipped times, times after ``end_at`` and times beyond the
    remaining runs are left out.
    """
    if schedule.state != ScheduleState.ACTIVE:
        return []
    remaining = remaining_runs(schedule)
    if remaining is not None:
        count = min(count, remaining)
    if count <= 0:
        return []
    zone = _zone(schedule.timezone)
    pending = list(
        Occurrence.objects.filter(
            schedule=schedule, schedule_version=schedule.version, manual=False,
            state__in=[S.SCHEDULED.value, S.ENQUEUED.value],
        ).order_by("scheduled_for").values_list("scheduled_for", flat=True)[:count]
    )  # fmt: skip
    times = [FireTime(utc=t, local=t.astimezone(zone)) for t in pending]
    cursor = schedule.next_run_at
    if cursor is None or len(times) >= count:
        return times[:count]
    skips = set(schedule.skip_times or [])
    try:
        rows = timemath.preview(
            trigger_for(schedule),
            start=cursor - timedelta(microseconds=1),
            count=min(count + len(skips), timemath.MAX_PREVIEW),
        )
    except (errors.SchedulerError, ValueError):
        return times  # a timing that cannot be planned: the schedule will be parked
    for row in rows:
        if len(times) >= count or (schedule.end_at is not None and row.utc > schedule.end_at):
            break
        if skip_key(row.utc) in skips:
            continue
        times.append(FireTime(utc=row.utc, local=row.utc.astimezone(zone), note=row.note))
    return times


def skip_key(instant: datetime) -> str:
    """How a skipped fire time is stored in ``Schedule.skip_times`` (UTC, ISO 8601)."""
    return instant.astimezone(UTC).isoformat()


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name or "UTC")
    except (ValueError, KeyError, OSError):
        return ZoneInfo("UTC")


# -- list ------------------------------------------------------------------------------


#: The list whose pages a cursor continues: list_schedules' (``schedules/`` over HTTP), or
#: one schedule's occurrences (:func:`occurrence_list`).
SCHEDULE_LIST = "schedules"


def occurrence_list(schedule_id: uuid.UUID) -> str:
    return f"occurrences:{schedule_id}"


def _described(page_list: str) -> str:
    if page_list == SCHEDULE_LIST:
        return "the schedule list"
    kind, _, schedule_id = page_list.partition(":")
    if kind != "occurrences":
        raise ValueError(f"no such list: {page_list!r}")
    return f"the occurrence list of schedule {uuid.UUID(schedule_id)}"


def encode_cursor(at: datetime, pk: uuid.UUID, page_list: str = SCHEDULE_LIST) -> str:
    """The opaque cursor after the row (at, pk) of ``page_list``.

    It names its list: each list orders by another time (created_at ascending, scheduled_for
    descending), so read on another list its position would give a wrong or empty page
    instead of an error."""
    raw = json.dumps([page_list, at.isoformat(), str(pk)]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def renamed_cursor_error(exc: errors.ValidationError, name: str) -> errors.ValidationError:
    """``list_schedules``'s error, with its ``after`` argument called ``name`` (what the
    HTTP API and the command call the cursor); any other error as it is."""
    if exc.field != "after":
        return exc
    text = str(exc).removeprefix("after")
    return errors.ValidationError(name + text if text != str(exc) else text, field=name)


def decode_cursor(
    cursor: str, page_list: str = SCHEDULE_LIST, *, field: str = "after"
) -> tuple[datetime, uuid.UUID]:
    """The (at, pk) of a cursor of ``page_list``; a ValidationError on ``field`` for any
    other string, a cursor of another list included (the message names both lists)."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        decoded = json.loads(base64.urlsafe_b64decode(padded.encode()))
        if isinstance(decoded, list) and len(decoded) == 2:
            # A cursor from before cursors named their list ([at, pk]): both lists issued
            # that shape, so each takes it as its own, as it did (a caller paging across
            # the upgrade goes on); which list it came from cannot be told.
            decoded = [page_list, *decoded]
        issued_by, at, pk = decoded
        issuer = _described(issued_by)
        when = datetime.fromisoformat(at)
        if when.tzinfo is None:
            raise ValueError("naive")
        # A cursor made up far from any real row (year 1 or 9999 with an offset) would
        # overflow in the database's datetime conversion.
        timemath.check_instant(when, field)
        position = when, uuid.UUID(pk)
    except (
        binascii.Error, ValueError, TypeError, UnicodeDecodeError, AttributeError,
        errors.ValidationError,
    ):  # fmt: skip
        raise errors.ValidationError(
            f"{field} is not a next_cursor of {_described(page_list)}", field=field
        ) from None
    if issued_by != page_list:
        raise errors.ValidationError(
            f"{field} is a next_cursor of {issuer}, not of {_described(page_list)}: pass "
            "the next_cursor of the list you are reading",
            field=field,
        )
    return position


def parse_tag(tag: str | Mapping[str, str] | None, *, field: str = "tag") -> dict[str, str | None]:
    """``"key=value"``, ``"key"`` (any value) or a mapping -> {key: value or None}."""
    if tag is None:
        return {}
    if isinstance(tag, str):
        key, sep, value = tag.partition("=")
        pairs: dict[str, str | None] = {key.strip(): value if sep else None}
    elif isinstance(tag, Mapping):
        pairs = {str(k): v for k, v in tag.items()}
    else:
        raise errors.ValidationError(
            f"{field} must be 'key=value', 'key' or a mapping, got {tag!r}", field=field
        )
    if len(pairs) > validation.MAX_TAGS:  # a schedule has no more: more cannot all match
        raise errors.ValidationError(
            f"{field} names {len(pairs)} keys; at most {validation.MAX_TAGS}", field=field
        )
    for name, wanted in pairs.items():
        if not name.strip() or len(name) > 100:
            raise errors.ValidationError(f"{field} has an empty or bad key: {tag!r}", field=field)
        if wanted is not None and (not isinstance(wanted, str) or len(wanted) > 200):
            raise errors.ValidationError(f"{field} has a bad value: {tag!r}", field=field)
        validation.check_storable(name, field, errors.ValidationError)
        if wanted is not None:
            validation.check_storable(wanted, field, errors.ValidationError)
    return pairs


def check_filter_keywords(filters: Mapping[str, Any], caller: str) -> None:
    """TypeError for a keyword that is not one of :data:`SCHEDULE_FILTERS` (as Python would
    raise for a signature that spelled them out)."""
    for name in filters:
        if name not in SCHEDULE_FILTERS:
            raise TypeError(f"{caller}() got an unexpected keyword argument {name!r}")


def filtered(**filters: Unpack[ScheduleFilter]) -> QuerySet[Schedule]:
    """Schedules matching every filter given (validated; ValidationError names the field)."""
    check_filter_keywords(filters, "filtered")
    tenant, state, task = filters.get("tenant"), filters.get("state"), filters.get("task")
    name_contains = filters.get("name_contains")
    qs = Schedule.objects.select_related("cursor")
    tenant_obj = tenant_by_slug(tenant)
    if tenant_obj is not None:
        qs = qs.filter(tenant=tenant_obj)
    if state is not None:
        valid = {s.value for s in ScheduleState}
        if not isinstance(state, str) or state.upper() not in valid:
            raise errors.ValidationError(
                f"state {state!r} is not one of {', '.join(sorted(valid))}", field="state"
            )
        qs = qs.filter(state=state.upper())
    if task is not None:
        qs = qs.filter(task=validation.checked_text(task, "task", required=True))
    if name_contains is not None:
        needle = validation.checked_text(name_contains, "name_contains")
        # Lowered on both sides in SQL rather than ``icontains``: Django's MySQL backend spells
        # that as a plain LIKE, which is case-sensitive under the utf8mb4_bin collation the
        # docs ("Choose a database") ask MySQL/MariaDB databases to use.
        qs = qs.alias(name_lower=Lower("name")).filter(name_lower__contains=Lower(Value(needle)))
    before = validation.aware_datetime(filters.get("next_run_before"), "next_run_before")
    after = validation.aware_datetime(filters.get("next_run_after"), "next_run_after")
    if before is not None:
        qs = qs.filter(cursor__next_run_at__lt=before)
    if after is not None:
        qs = qs.filter(cursor__next_run_at__gte=after)
    for key, value in parse_tag(filters.get("tag")).items():
        match = ScheduleTag.objects.filter(schedule=OuterRef("pk"), key=key)
        if tenant_obj is not None:
            match = match.filter(tenant=tenant_obj)  # uses (tenant, key, value)
        if value is not None:
            match = match.filter(value=value)
        qs = qs.filter(Exists(match))
    return qs


def list_schedules(*, limit: int = 50, after: str | None = None, **filters: Any) -> SchedulePage:
    """See :func:`celery_scheduler.api.list_schedules`."""
    limit = _count(limit, "limit", 1, MAX_PAGE)
    qs = filtered(**filters)
    if after is not None:
        if not isinstance(after, str):
            raise errors.ValidationError("after must be a cursor string", field="after")
        at, pk = decode_cursor(after)
        # (created_at, id) > (at, pk), spelled so that the planner sees the range start
        # (created_at >= at) and scans the keyset index from the cursor; the OR alone is
        # not an index bound, and a page deep in the table then re-scans what precedes it.
        qs = qs.filter(created_at__gte=at).filter(Q(created_at__gt=at) | Q(id__gt=pk))
    rows = list(qs.select_related("tenant").order_by("created_at", "id")[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    tags: dict[uuid.UUID, dict[str, str]] = {}
    for sid, key, value in ScheduleTag.objects.filter(
        schedule_id__in=[r.id for r in rows]
    ).values_list("schedule_id", "key", "value"):
        tags.setdefault(sid, {})[key] = value
    items = [summary(r, tags.get(r.id, {})) for r in rows]
    cursor = encode_cursor(rows[-1].created_at, rows[-1].id) if more and rows else None
    return SchedulePage(items=items, next_cursor=cursor)
