"""The offline reconciler: which occurrences should exist, and what became of each.

Expected occurrences come from ``ScheduleVersion`` rows and the time rules ALONE (never from
the occurrence table or the schedule's cursor), so a bug that silently skips a fire time
shows up as ABSENT rather than being explained away.

Contract of ``ScheduleVersion`` (written by ``django_app.lifecycle``): version ``v`` of a
schedule, with the timing fields it had, is expected to fire at every fire time ``t`` of its
trigger with ``valid_from <= t < valid_to`` (``valid_to`` NULL = still live), also bounded by
its ``start_at``/``end_at`` (``end_at`` inclusive). Pause and cancel close the interval;
resume and update open a new row for the new version. Times when no version was live are not
expected.

Statuses of an expected occurrence: succeeded, failed (DEAD), canceled, missed, skipped
(SKIPPED_OVERLAP), pending (SCHEDULED / ENQUEUED / RUNNING / RETRY_WAIT), ABSENT (no row and
its time has passed), upcoming (no row yet, its time is after "now"). Occurrences in the
window whose key is not expected (manual ones excluded) are listed as unexpected.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from itertools import chain
from typing import Any

from celery_scheduler.core import ids
from celery_scheduler.core.enums import OccurrenceState as S
from celery_scheduler.core.timemath import fire_times
from django_app.materializer import trigger_for
from django_app.models import Occurrence, Schedule, ScheduleVersion

ABSENT = "ABSENT"
UPCOMING = "upcoming"
STATUS_OF_STATE: dict[str, str] = {
    S.SUCCEEDED: "succeeded",
    S.DEAD: "failed",
    S.CANCELED: "canceled",
    S.MISSED: "missed",
    S.SKIPPED_OVERLAP: "skipped",
    S.SCHEDULED: "pending",
    S.ENQUEUED: "pending",
    S.RUNNING: "pending",
    S.RETRY_WAIT: "pending",
}

Key = tuple[uuid.UUID, int, datetime]


@dataclass(frozen=True, kw_only=True)
class VersionWindow:
    """The timing of one schedule version and when it was live (a ScheduleVersion, detached)."""

    schedule_id: uuid.UUID
    version: int
    kind: str
    cron: str
    timezone: str
    interval_seconds: int | None
    run_at: datetime | None
    start_at: datetime | None
    end_at: datetime | None
    created_at: datetime
    valid_from: datetime
    valid_to: datetime | None


@dataclass(frozen=True, kw_only=True)
class Item:
    schedule_id: uuid.UUID
    version: int
    scheduled_for: datetime
    occurrence_id: uuid.UUID
    status: str
    state: str = ""

    def as_json(self) -> dict[str, Any]:
        return {
            "schedule_id": str(self.schedule_id),
            "version": self.version,
            "scheduled_for": self.scheduled_for.isoformat(),
            "occurrence_id": str(self.occurrence_id),
            "status": self.status,
            "state": self.state,
        }


@dataclass(frozen=True, kw_only=True)
class ReconcileReport:
    start: datetime
    end: datetime
    expected: list[Item]
    unexpected: list[Item]
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def absent(self) -> list[Item]:
        return [i for i in self.expected if i.status == ABSENT]

    @property
    def ok(self) -> bool:
        return not self.absent

    def as_json(self) -> dict[str, Any]:
        return {
            "from": self.start.isoformat(),
            "to": self.end.isoformat(),
            "ok": self.ok,
            "counts": self.counts,
            "expected": [i.as_json() for i in self.expected],
            "unexpected": [i.as_json() for i in self.unexpected],
        }


def expected_times(window: VersionWindow, start: datetime, end: datetime) -> Iterator[datetime]:
    """Fire times of ``window``'s version in ``[start, end)`` while the version was live."""
    lo = max(start, window.valid_from)
    if window.start_at is not None:
        lo = max(lo, window.start_at)
    hi = end if window.valid_to is None else min(end, window.valid_to)
    if lo >= hi:
        return
    trigger = trigger_for(window, created_at=window.created_at)
    first = trigger.first_at_or_after(lo)
    if first is None or first >= hi:
        return
    for t in chain([first], fire_times(trigger, first, until=hi)):
        if t >= hi or (window.end_at is not None and t > window.end_at):
            return
        yield t


def expected_keys(windows: Iterable[VersionWindow], start: datetime, end: datetime) -> list[Key]:
    """Every (schedule, version, scheduled_for) that should exist in ``[start, end)``, sorted."""
    keys = {(w.schedule_id, w.version, t) for w in windows for t in expected_times(w, start, end)}
    return sorted(keys, key=lambda k: (k[2], str(k[0]), k[1]))


def load_windows(schedule_ids: Iterable[uuid.UUID] | None = None) -> list[VersionWindow]:
    rows = ScheduleVersion.objects.select_related("schedule").order_by("schedule_id", "version")
    if schedule_ids is not None:
        rows = rows.filter(schedule_id__in=list(schedule_ids))
    return [
        VersionWindow(
            schedule_id=v.schedule_id,
            version=v.version,
            kind=v.kind,
            cron=v.cron,
            timezone=v.timezone,
            interval_seconds=v.interval_seconds,
            run_at=v.run_at,
            start_at=v.start_at,
            end_at=v.end_at,
            created_at=v.schedule.created_at,
            valid_from=v.valid_from,
            valid_to=v.valid_to,
        )
        for v in rows
    ]


def reconcile(
    *,
    start: datetime,
    end: datetime,
    now: datetime,
    schedule_ids: Iterable[uuid.UUID] | None = None,
) -> ReconcileReport:
    """Compare the expected occurrences in ``[start, end)`` with the occurrence table."""
    ids_filter = None if schedule_ids is None else list(schedule_ids)
    keys = expected_keys(load_windows(ids_filter), start, end)
    rows = Occurrence.objects.filter(scheduled_for__gte=start, scheduled_for__lt=end)
    if ids_filter is not None:
        rows = rows.filter(schedule_id__in=ids_filter)
    found: dict[Key, tuple[uuid.UUID, str, bool]] = {
        (sid, ver, at): (oid, state, manual)
        for oid, sid, ver, at, state, manual in rows.values_list(
            "id", "schedule_id", "schedule_version", "scheduled_for", "state", "manual"
        )
    }
    expected = []
    for key in keys:
        sid, ver, at = key
        hit = found.get(key)
        if hit is None:
            status = UPCOMING if at > now else ABSENT
            occ_id, state = ids.occurrence_id(sid, ver, at), ""
        else:
            occ_id, state, _ = hit
            status = STATUS_OF_STATE.get(state, state)
        expected.append(
            Item(
                schedule_id=sid,
                version=ver,
                scheduled_for=at,
                occurrence_id=occ_id,
                status=status,
                state=state,
            )
        )
    wanted = set(keys)
    unexpected = [
        Item(
            schedule_id=sid,
            version=ver,
            scheduled_for=at,
            occurrence_id=oid,
            status="unexpected",
            state=state,
        )
        for (sid, ver, at), (oid, state, manual) in sorted(found.items(), key=lambda kv: kv[0][2])
        if not manual and (sid, ver, at) not in wanted
    ]
    counts = Counter(i.status for i in expected)
    counts["unexpected"] = len(unexpected)
    return ReconcileReport(
        start=start, end=end, expected=expected, unexpected=unexpected, counts=dict(counts)
    )


def schedules_without_history(schedule_ids: Iterable[uuid.UUID] | None = None) -> list[uuid.UUID]:
    """Schedules with no ScheduleVersion row: the reconciler cannot expect anything of them."""
    qs = Schedule.objects.filter(versions__isnull=True)
    if schedule_ids is not None:
        qs = qs.filter(id__in=list(schedule_ids))
    return list(qs.values_list("id", flat=True))
