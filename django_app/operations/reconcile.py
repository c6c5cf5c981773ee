"""The offline reconciler: which occurrences should exist, and what became of each.

Expected occurrences come from ``ScheduleVersion`` rows and the time rules ALONE (never from
the occurrence table or the schedule's cursor), so a bug that silently skips a fire time
shows up as ABSENT rather than being explained away.

Contract of ``ScheduleVersion`` (written by ``django_app.schedules.lifecycle``): version ``v`` of a
schedule, with the timing fields it had, is expected to fire at every fire time ``t`` of its
trigger with ``valid_from <= t < valid_to`` (``valid_to`` NULL = still live), also bounded by
its ``start_at``/``end_at`` (``end_at`` inclusive). Pause and cancel close the interval;
resume and update open a new row for the new version. Times when no version was live are not
expected.

A time that an older version of the schedule claimed or finished is never planned again by
a newer one (``django_app.schedules.replan``): the older version's occurrence answers for it.

Statuses of an expected occurrence: succeeded, failed (DEAD), canceled, missed, skipped
(SKIPPED_OVERLAP), pending (SCHEDULED / ENQUEUED / RUNNING / RETRY_WAIT), skipped_by_policy
(no row, but inside a ``SkippedSpan`` the materializer recorded when the misfire policy jumped
over more than ``max_missed_per_pass`` late times), ABSENT (no row and its time has passed),
upcoming (no row yet, its time is after "now"). Occurrences in the window whose key is not
expected (manual ones excluded) are listed as unexpected.

Scale: :func:`iter_reconcile` streams. It walks schedules in chunks by id (keyset), reads one
chunk's versions, spans and occurrences (ordered by the ``occurrence_schedule_time`` index,
fetched through a server-side cursor) and merge-joins each schedule's expected times with its
rows, so memory is bounded by the chunk, not by the window.
"""

from __future__ import annotations

import heapq
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from itertools import chain, groupby
from typing import Any

from django.db.models import QuerySet

from celery_scheduler.core import ids
from celery_scheduler.core.enums import OccurrenceState as S
from celery_scheduler.core.timemath import fire_times
from django_app.materialize.per_schedule import trigger_for
from django_app.models import Occurrence, Schedule, ScheduleVersion, SkippedSpan
from django_app.schedules import replan
from django_app.schedules.backfill import BACKFILL_VERSION

ABSENT = "ABSENT"
UPCOMING = "upcoming"
SKIPPED_BY_POLICY = "skipped_by_policy"
UNEXPECTED = "unexpected"
#: Schedules per chunk: bounds what one step holds (their versions and spans).
DEFAULT_CHUNK_SIZE = 500
#: Occurrence rows fetched per round trip of the server-side cursor.
FETCH_SIZE = 5_000
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


@dataclass(frozen=True, kw_only=True)
class VersionWindow:
    """The timing of one schedule version and when it was live (a ScheduleVersion, detached)."""

    schedule_id: uuid.UUID
    version: int
    kind: str
    cron: str
    timezone: str
    dst_gap: str
    dst_fold: str
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
    def skipped_by_policy(self) -> list[Item]:
        return [i for i in self.expected if i.status == SKIPPED_BY_POLICY]

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


def _window(v: ScheduleVersion, created_at: datetime) -> VersionWindow:
    return VersionWindow(
        schedule_id=v.schedule_id,
        version=v.version,
        kind=v.kind,
        cron=v.cron,
        timezone=v.timezone,
        dst_gap=v.dst_gap,
        dst_fold=v.dst_fold,
        interval_seconds=v.interval_seconds,
        run_at=v.run_at,
        start_at=v.start_at,
        end_at=v.end_at,
        created_at=created_at,
        valid_from=v.valid_from,
        valid_to=v.valid_to,
    )


@dataclass(frozen=True, kw_only=True)
class Progress:
    """Where a streaming run is, handed to ``on_progress`` after each chunk."""

    schedules_done: int
    schedules_total: int
    items: int
    rows_read: int


#: id, schedule, version, scheduled_for, state, manual, attempt_count
_Row = tuple[uuid.UUID, uuid.UUID, int, datetime, str, bool, int]
_ROW_FIELDS = ("id", "schedule_id", "schedule_version", "scheduled_for", "state", "manual",
               "attempt_count")  # fmt: skip


def occurrence_window(
    schedule_ids: list[uuid.UUID], start: datetime, end: datetime
) -> QuerySet[Any, _Row]:
    """The occurrences of ``schedule_ids`` in ``[start, end)``, in merge-join order.

    Ordered by (schedule, scheduled_for, version): the ``occurrence_schedule_time`` index
    answers it without a sort of the window.
    """
    return (
        Occurrence.objects.filter(
            schedule_id__in=schedule_ids, scheduled_for__gte=start, scheduled_for__lt=end
        )
        .order_by("schedule_id", "scheduled_for", "schedule_version")
        .values_list(*_ROW_FIELDS)
    )


def count_schedules(schedule_ids: Iterable[uuid.UUID] | None = None) -> int:
    """How many schedules a run walks (for progress and estimates)."""
    qs = Schedule.objects.all()
    if schedule_ids is not None:
        qs = qs.filter(id__in=list(schedule_ids))
    return qs.count()


def _schedule_chunks(
    schedule_ids: list[uuid.UUID] | None, chunk_size: int
) -> Iterator[list[uuid.UUID]]:
    """Schedule ids in ascending order, ``chunk_size`` at a time (keyset: no OFFSET)."""
    base = Schedule.objects.order_by("id")
    if schedule_ids is not None:
        base = base.filter(id__in=schedule_ids)
    last: uuid.UUID | None = None
    while True:
        page = base if last is None else base.filter(id__gt=last)
        chunk = list(page.values_list("id", flat=True)[:chunk_size])
        if chunk:
            yield chunk
        if len(chunk) < chunk_size:
            return
        last = chunk[-1]


def iter_reconcile(
    *,
    start: datetime,
    end: datetime,
    now: datetime,
    schedule_ids: Iterable[uuid.UUID] | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    on_progress: Callable[[Progress], None] | None = None,
) -> Iterator[Item]:
    """Every expected occurrence of ``[start, end)`` and every unexpected row, streamed.

    Grouped by schedule (ascending id), each schedule's items in time order. Memory is
    bounded by ``chunk_size`` schedules' versions and spans plus one fetch of rows.
    """
    ids_filter = None if schedule_ids is None else list(schedule_ids)
    total = count_schedules(ids_filter)
    done = items = rows_read = 0
    for chunk in _schedule_chunks(ids_filter, chunk_size):
        windows: dict[uuid.UUID, list[VersionWindow]] = {}
        versions = ScheduleVersion.objects.filter(schedule_id__in=chunk).order_by(
            "schedule_id", "version"
        )
        for v in versions.select_related("schedule"):
            windows.setdefault(v.schedule_id, []).append(_window(v, v.schedule.created_at))
        spans: dict[tuple[uuid.UUID, int], list[tuple[datetime, datetime]]] = {}
        for sid, ver, lo, hi in SkippedSpan.objects.filter(
            schedule_id__in=chunk, resume_at__gt=start, first_at__lt=end
        ).values_list("schedule_id", "schedule_version", "first_at", "resume_at"):
            spans.setdefault((sid, ver), []).append((lo, hi))
        counter = _Counter()
        rows = occurrence_window(chunk, start, end).iterator(chunk_size=FETCH_SIZE)
        groups = groupby(counter.through(rows), key=lambda r: r[1])
        group = next(groups, None)
        # Both sides in the database's uuid order: ``chunk`` comes ordered by id from the
        # database. (Not Python's order: MariaDB 10.7+ stores a native UUID type that sorts
        # by its time-like groups, not by the hex text.)
        for sid in chunk:
            mine: Iterable[_Row] = ()
            if group is not None and group[0] == sid:
                mine, group = group[1], None
            for item in _judge(sid, windows.get(sid, []), spans, mine, start, end, now):
                items += 1
                yield item
            if group is None:
                group = next(groups, None)
        if group is not None:  # never silently drop rows if the orders ever disagreed
            raise RuntimeError(f"occurrence rows of schedule {group[0]} were not judged")
        rows_read += counter.n
        done += len(chunk)
        if on_progress is not None:
            on_progress(Progress(schedules_done=done, schedules_total=total, items=items,
                                 rows_read=rows_read))  # fmt: skip


class _Counter:
    """Counts the rows a generator passes through (for progress)."""

    def __init__(self) -> None:
        self.n = 0

    def through(self, rows: Iterable[_Row]) -> Iterator[_Row]:
        for row in rows:
            self.n += 1
            yield row


def _judge(
    sid: uuid.UUID,
    windows: list[VersionWindow],
    spans: dict[tuple[uuid.UUID, int], list[tuple[datetime, datetime]]],
    rows: Iterable[_Row],
    start: datetime,
    end: datetime,
    now: datetime,
) -> Iterator[Item]:
    """Merge-join one schedule's expected (time, version) keys with its rows (same order).

    A key with no row of its own is answered by an older version's row at the same time
    that was claimed or finished, or by a backfill of that time
    (``django_app.schedules.replan`` never plans such a time again); rows
    of one time come in version order, so that row has been read when the key comes up.
    """
    expected = heapq.merge(*(_keyed(w, start, end) for w in windows))
    want = next(expected, None)
    took: _Row | None = None  # the latest claimed-or-finished row read, for older versions
    for row in rows:
        oid, _, ver, at, state, manual, attempts = row
        have = (at, ver)
        while want is not None and want < have:
            yield _missing(sid, want, spans, now, took)
            want = next(expected, None)
        # A backfill (version 0, manual) takes its time too: a later version re-planned
        # around it (django_app.schedules.replan).
        if (not manual or ver == BACKFILL_VERSION) and replan.is_taken(state, attempts):
            took = row
        if want == have:
            yield Item(schedule_id=sid, version=ver, scheduled_for=at, occurrence_id=oid,
                       status=STATUS_OF_STATE.get(state, state), state=state)  # fmt: skip
            want = next(expected, None)
        elif not manual:
            yield Item(schedule_id=sid, version=ver, scheduled_for=at, occurrence_id=oid,
                       status=UNEXPECTED, state=state)  # fmt: skip
    while want is not None:
        yield _missing(sid, want, spans, now, took)
        want = next(expected, None)


def _keyed(window: VersionWindow, start: datetime, end: datetime) -> Iterator[tuple[datetime, int]]:
    for t in expected_times(window, start, end):
        yield t, window.version


def _missing(
    sid: uuid.UUID,
    key: tuple[datetime, int],
    spans: dict[tuple[uuid.UUID, int], list[tuple[datetime, datetime]]],
    now: datetime,
    took: _Row | None,
) -> Item:
    at, ver = key
    if took is not None and took[3] == at and took[2] < ver:
        oid, state = took[0], took[4]
        return Item(schedule_id=sid, version=ver, scheduled_for=at, occurrence_id=oid,
                    status=STATUS_OF_STATE.get(state, state), state=state)  # fmt: skip
    if at > now:
        status = UPCOMING
    elif any(lo <= at < hi for lo, hi in spans.get((sid, ver), ())):
        status = SKIPPED_BY_POLICY
    else:
        status = ABSENT
    return Item(schedule_id=sid, version=ver, scheduled_for=at,
                occurrence_id=ids.occurrence_id(sid, ver, at), status=status)  # fmt: skip


def reconcile(
    *,
    start: datetime,
    end: datetime,
    now: datetime,
    schedule_ids: Iterable[uuid.UUID] | None = None,
) -> ReconcileReport:
    """Compare the expected occurrences in ``[start, end)`` with the occurrence table.

    Collects :func:`iter_reconcile` into lists (sorted by time): for small windows and tests.
    The command streams instead.
    """
    expected: list[Item] = []
    unexpected: list[Item] = []
    for item in iter_reconcile(start=start, end=end, now=now, schedule_ids=schedule_ids):
        (unexpected if item.status == UNEXPECTED else expected).append(item)
    expected.sort(key=lambda i: (i.scheduled_for, str(i.schedule_id), i.version))
    unexpected.sort(key=lambda i: i.scheduled_for)
    counts = Counter(i.status for i in expected)
    counts[UNEXPECTED] = len(unexpected)
    return ReconcileReport(
        start=start, end=end, expected=expected, unexpected=unexpected, counts=dict(counts)
    )


def schedules_without_history(schedule_ids: Iterable[uuid.UUID] | None = None) -> list[uuid.UUID]:
    """Schedules with no ScheduleVersion row: the reconciler cannot expect anything of them."""
    qs = Schedule.objects.filter(versions__isnull=True)
    if schedule_ids is not None:
        qs = qs.filter(id__in=list(schedule_ids))
    return list(qs.values_list("id", flat=True))
