"""Typed results of the management API (``celery_scheduler.api``): frozen dataclasses.

Plain values only (str, int, datetime, UUID, lists, dicts of them), so a caller can turn
any of them into JSON with :func:`as_json` and no Django model ever leaks out. Datetimes
are aware; ``*_utc`` fields are in UTC.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, TypedDict


def as_json(value: Any) -> Any:
    """A JSON-ready copy of a result: datetimes as ISO 8601, UUIDs as strings."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: as_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dict):
        return {str(k): as_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [as_json(v) for v in value]
    return value


#: A duration argument: seconds, or a timedelta.
Seconds = int | timedelta


class ScheduleFilter(TypedDict, total=False):
    """The schedule filters of ``list_schedules`` and the bulk verbs, every one optional.

    The one spec of these keywords: the API takes them as ``**filters:
    Unpack[ScheduleFilter]``, and the HTTP filter fields and ``manage.py schedules list``
    are checked against :data:`SCHEDULE_FILTERS`. What each one means:
    :func:`django_app.api.list_schedules`.
    """

    tenant: str | None
    state: str | None
    task: str | None
    tag: str | Mapping[str, str] | None
    name_contains: str | None
    next_run_before: datetime | None
    next_run_after: datetime | None


#: The keywords of :class:`ScheduleFilter`, in its order.
SCHEDULE_FILTERS: tuple[str, ...] = tuple(ScheduleFilter.__annotations__)


@dataclass(frozen=True, kw_only=True)
class FireTime:
    """One future fire time: UTC, the schedule's local time, and a DST note if any."""

    utc: datetime
    local: datetime
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class OccurrenceSummary:
    """One occurrence as ``describe_schedule`` shows it.

    ``lag_seconds`` is ``enqueued_at - scheduled_for`` (None until published);
    ``attempts`` counts every try (retries included); ``origin`` is ``scheduled``,
    ``run_now`` or ``backfill``. ``task_id`` is the Celery task id of every delivery of this
    occurrence (the occurrence id as a string): ``AsyncResult(task_id)``, Flower and the
    worker log name the run by it.
    """

    id: uuid.UUID
    scheduled_for: datetime
    version: int
    state: str
    origin: str
    attempts: int
    lag_seconds: float | None
    enqueued_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    reason: str = ""
    last_error: str = ""

    task_id: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "task_id", str(self.id))


@dataclass(frozen=True, kw_only=True)
class ScheduleCounters:
    """Totals over the schedule's whole stored history (every version).

    ``runs``: occurrences that started a body (retries of one occurrence are one run);
    ``succeeded``; ``failures``: attempts that failed (retried, dead or lost their lease);
    ``dead``: occurrences dead-lettered; ``missed``: fire times the misfire policy dropped;
    ``skipped_overlap``: dropped by the overlap policy; ``skipped``: skipped by an operator
    (``skip_occurrence``); ``canceled``: invalidated by a version change or cancel (skips
    not included); ``pending``: scheduled, enqueued, running or waiting for a retry.
    """

    runs: int = 0
    succeeded: int = 0
    failures: int = 0
    dead: int = 0
    missed: int = 0
    skipped_overlap: int = 0
    skipped: int = 0
    canceled: int = 0
    pending: int = 0


@dataclass(frozen=True, kw_only=True)
class ScheduleSummary:
    """One schedule as ``list_schedules`` returns it (and the head of a description).

    ``state_reason`` says why the schedule is PAUSED (the operator's note or the automatic
    reason) or PARKED; empty otherwise. ``remaining_runs`` is None without ``max_runs``.
    """

    id: uuid.UUID
    tenant: str
    name: str
    task: str
    kind: str
    cron: str
    timezone: str
    dst_gap: str = "SKIP"
    dst_fold: str = "FIRST"
    interval_seconds: int | None
    run_at: datetime | None
    state: str
    state_reason: str
    version: int
    next_run_at: datetime | None
    created_at: datetime
    updated_at: datetime
    tags: dict[str, str] = field(default_factory=dict)
    max_runs: int | None = None
    remaining_runs: int | None = None


@dataclass(frozen=True, kw_only=True)
class VersionInfo:
    """The live (or last) version's timing and the interval in which it was live."""

    version: int
    kind: str
    cron: str
    timezone: str
    dst_gap: str = "SKIP"
    dst_fold: str = "FIRST"
    interval_seconds: int | None
    run_at: datetime | None
    start_at: datetime | None
    end_at: datetime | None
    valid_from: datetime
    valid_to: datetime | None


@dataclass(frozen=True, kw_only=True)
class ScheduleDescription:
    """Everything about one schedule, as Temporal's ``describe`` gives it.

    ``settings`` holds the create/update fields (the same names ``create_schedule``
    takes), ``next_fire_times`` the next N times that will fire (skipped times, times
    after ``end_at`` and times beyond the remaining runs left out), ``recent`` the last N
    occurrences newest first.
    """

    schedule: ScheduleSummary
    settings: dict[str, Any]
    current_version: VersionInfo | None
    paused_at: datetime | None
    next_fire_times: list[FireTime]
    recent: list[OccurrenceSummary]
    counters: ScheduleCounters
    runs_counted: int
    pause_after_failures: int | None
    consecutive_failures: int
    skipped_times: list[datetime]


@dataclass(frozen=True, kw_only=True)
class SchedulePage:
    """One page of ``list_schedules``; pass ``next_cursor`` as ``after=`` for the next.

    ``next_cursor`` is None on the last page. The cursor is opaque (do not parse it).
    """

    items: list[ScheduleSummary]
    next_cursor: str | None


@dataclass(frozen=True, kw_only=True)
class TenantInfo:
    """A tenant's quotas (None: no limit) and relay weight."""

    slug: str
    name: str
    max_schedules: int | None
    max_trigger_rate: int | None
    max_running: int | None
    catchup_rate: int | None
    relay_weight: int
    created_at: datetime


@dataclass(frozen=True, kw_only=True)
class TenantUsage:
    """A tenant and its usage against each quota, measured at ``measured_at``.

    ``schedules``: live schedules (active, paused, parked) against ``max_schedules``;
    ``running``: occurrences RUNNING under a live lease against ``max_running``;
    ``published_last_minute``: messages the relay published in the last 60 s (compare
    with ``max_trigger_rate`` x 60); ``catchup_backlog``: late occurrences not yet
    published (what ``catchup_rate`` paces: a CATCH_UP schedule's late runs and backfills).
    """

    tenant: TenantInfo
    schedules: int
    running: int
    published_last_minute: int
    catchup_backlog: int
    measured_at: datetime


class BulkOutcome(StrEnum):
    CHANGED = "changed"
    UNCHANGED = "unchanged"  # already in the requested state
    REFUSED = "refused"  # the current state does not allow it; ``reason`` says why


@dataclass(frozen=True, kw_only=True)
class BulkItem:
    schedule_id: uuid.UUID
    name: str
    outcome: BulkOutcome
    state: str
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class BulkReport:
    """What a bulk pause/resume/cancel really did, schedule by schedule."""

    action: str
    items: list[BulkItem]

    def _of(self, outcome: BulkOutcome) -> list[BulkItem]:
        return [i for i in self.items if i.outcome is outcome]

    @property
    def changed(self) -> list[BulkItem]:
        return self._of(BulkOutcome.CHANGED)

    @property
    def unchanged(self) -> list[BulkItem]:
        return self._of(BulkOutcome.UNCHANGED)

    @property
    def refused(self) -> list[BulkItem]:
        return self._of(BulkOutcome.REFUSED)


@dataclass(frozen=True, kw_only=True)
class BulkCreateReport:
    """What ``create_schedules`` did: one schedule id per item, in the items' order.

    ``created`` new schedules; ``existing`` items whose idempotency key (with the same
    content) named a schedule already there, or an earlier item of the same call.
    """

    schedule_ids: list[uuid.UUID]
    created: int
    existing: int


@dataclass(frozen=True, kw_only=True)
class ScheduleSyncReport:
    """What ``sync_schedules`` did, by idempotency key (each list in the items' order).

    ``created``: new schedules; ``updated``: changed through ``update_schedule`` (a new
    version when timing or task fields changed); ``unchanged``: already as wanted;
    ``stopped``: canceled or completed schedules with that key, left alone (a key is never
    reused); ``pruned``: schedules canceled because their key was not in the items (in key order;
    ``prune=True``).
    """

    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class SkipResult:
    """The fire time ``skip_occurrence`` skipped and what became of its occurrence.

    ``occurrence_id`` is set when the time was already materialized (that occurrence is
    now CANCELED with the reason); otherwise the skip is recorded on the schedule and the
    time is never materialized to run.
    """

    schedule_id: uuid.UUID
    scheduled_for: datetime
    occurrence_id: uuid.UUID | None
    reason: str


@dataclass(frozen=True, kw_only=True)
class BackfillReport:
    """What ``backfill`` did for the fire times in ``[start, end)``.

    ``created``: new backfill occurrences (their ids); ``already_backfilled``: times an
    earlier backfill of the same schedule already created; ``already_ran``: times a
    scheduled occurrence already ran or is pending (never run twice); ``releases_from`` /
    ``releases_until``: when the first and last created occurrence become publishable
    (paced at the tenant's ``catchup_rate``).
    """

    schedule_id: uuid.UUID
    start: datetime
    end: datetime
    fire_times: int
    created: list[uuid.UUID]
    already_backfilled: int
    already_ran: int
    releases_from: datetime | None
    releases_until: datetime | None
