"""The queries written in several places, named once: the managers of the data-plane models.

``Schedule.objects.due(until, shards)``: ACTIVE schedules whose cursor is at or before
``until`` (the materializer's work; the ``schedule_cursor_due`` index of the cursor rows);
``live()``: not COMPLETED or CANCELED. The cursor is the ``cursor`` row (ScheduleCursor):
the queryset reads the old spelling ``next_run_at`` there, and keeps the row in step.

``Occurrence.objects``: ``unclaimed()`` (may still be invalidated), ``running_leased(now)``
and ``lease_expired(now)`` (RUNNING under a live or an expired lease), and
``transition(target, ...)``: the one conditional state UPDATE, ``WHERE state IN
sources_of(target) [AND fencing_token = ...]``, returning the row count. The module's
:func:`transition` is its single-row form, with the row-count check.

``OutboxEntry.objects``: ``unsent()``, ``due(until)`` (unsent and available by ``until``)
and ``claimable(now, token)`` (no other relay holds the row).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Self, TypeVar

from django.db import connections, models, transaction
from django.db.models import F, Q

from celery_scheduler.core.enums import OccurrenceState as S
from celery_scheduler.core.enums import ScheduleState
from celery_scheduler.core.states import UNCLAIMED, sources_of, state_values

_UNSET: Any = object()
#: A queryset of a model with the partition key ``scheduled_for`` (occurrence, attempt,
#: outbox entry).
KeyedRows = TypeVar("KeyedRows", bound=models.QuerySet[Any])


def _cursor_lookup(name: str) -> str:
    """``next_run_at[__lookup]`` (or ``-next_run_at``) on the cursor row."""
    bare = name.lstrip("-")
    if bare == "next_run_at" or bare.startswith("next_run_at__"):
        return name[: len(name) - len(bare)] + "cursor__" + bare
    return name


#: Schedule states that are not an end (COMPLETED, CANCELED).
LIVE_SCHEDULE_STATES = (ScheduleState.ACTIVE, ScheduleState.PAUSED, ScheduleState.PARKED)

if TYPE_CHECKING:  # the models import this module: the names are for the type checker
    from django_app.models import Occurrence, OutboxEntry, Schedule  # noqa: F401


class ScheduleQuerySet(models.QuerySet["Schedule"]):
    """Schedules; the cursor (``next_run_at``) is the ``cursor`` row (ScheduleCursor), so
    lookups spell it ``cursor__next_run_at``. What this queryset writes keeps that row in
    step: ``update`` and ``bulk_create`` write the cursor rows too, and a blocking
    ``select_for_update`` locks them after the schedules (the order every writer takes)."""

    def due(self, until: datetime, shards: Collection[int] | None = None) -> ScheduleQuerySet:
        """ACTIVE schedules (of ``shards``, if given) with ``next_run_at <= until``."""
        due = self.filter(cursor__active=True, cursor__next_run_at__lte=until)
        return due if shards is None else due.filter(cursor__shard__in=list(shards))

    def _filter_or_exclude(self, negate: bool, args: Any, kwargs: Any) -> ScheduleQuerySet:
        # The cursor's old spelling (``next_run_at__lte=...``) still reads the cursor row.
        kwargs = {_cursor_lookup(k): v for k, v in kwargs.items()}
        return super()._filter_or_exclude(negate, args, kwargs)  # type: ignore[misc]

    def values_list(self, *fields: Any, **kwargs: Any) -> Any:
        fields = tuple(_cursor_lookup(f) if isinstance(f, str) else f for f in fields)
        return super().values_list(*fields, **kwargs)

    def values(self, *fields: Any, **expressions: Any) -> Any:
        if "next_run_at" in fields:
            fields = tuple(f for f in fields if f != "next_run_at")
            expressions["next_run_at"] = models.F("cursor__next_run_at")
        return super().values(*fields, **expressions)

    def order_by(self, *names: Any) -> Self:
        return super().order_by(*(_cursor_lookup(n) if isinstance(n, str) else n for n in names))

    def update(self, **kwargs: Any) -> int:
        """``UPDATE``; ``next_run_at`` and the columns the cursor row copies are written to
        the cursor rows of the schedules updated as well (one transaction)."""
        # deferred (manager): the models name their managers, defined here
        from django_app.models import CURSOR_COPIES, ScheduleCursor

        cursor_value = kwargs.pop("next_run_at", _UNSET)
        if cursor_value is _UNSET and not kwargs.keys() & CURSOR_COPIES:
            return super().update(**kwargs)
        with transaction.atomic(savepoint=False):
            # Locked as read: the updates below name the rows by key, so a row that changed
            # between this read and them (a lifecycle call held it) is judged by this set's
            # conditions as it is now, not as it was before the wait.
            # OF the schedule alone where the database has OF: a filter on a missing cursor
            # (``next_run_at=None``) joins it outer, and its nullable side cannot be locked.
            of = ("self",) if connections[self.db].features.has_select_for_update_of else ()
            ids = list(self.order_by().select_for_update(of=of).values_list("pk", flat=True))
            if not ids:
                return 0
            rows = self.model._default_manager.filter(pk__in=ids)
            moved = super(ScheduleQuerySet, rows).update(**kwargs) if kwargs else len(ids)
            cursor: dict[str, Any] = {}
            if cursor_value is not _UNSET:
                cursor["next_run_at"] = cursor_value
            if "state" in kwargs:
                cursor["active"] = kwargs["state"] == ScheduleState.ACTIVE.value
            cursor.update({k: kwargs[k] for k in ("shard", "version") if k in kwargs})
            # An F() expression (version=F("version") + 1) reads the schedule's new value.
            for name in ("shard", "version"):
                if name in cursor and hasattr(cursor[name], "resolve_expression"):
                    cursor[name] = models.Subquery(
                        rows.filter(pk=models.OuterRef("pk")).values(name)[:1]
                    )
            ScheduleCursor.objects.filter(pk__in=ids).update(**cursor)
        return moved

    def bulk_create(self, objs: Iterable[Any], *args: Any, **kwargs: Any) -> list[Any]:
        """``bulk_create``, and each schedule's cursor row."""
        # deferred (manager): the models name their managers, defined here
        from django_app.models import ScheduleCursor, cursor_values

        made = super().bulk_create(objs, *args, **kwargs)
        ScheduleCursor.objects.bulk_create(
            [ScheduleCursor(schedule_id=s.pk, **cursor_values(s)) for s in made],
            ignore_conflicts=bool(kwargs.get("ignore_conflicts")),
        )
        return made

    def _fetch_all(self) -> None:
        fresh = self._result_cache is None
        super()._fetch_all()
        query = self.query
        if not (fresh and query.select_for_update and not query.select_for_update_skip_locked):
            return
        if query.select_for_update_of:  # only the rows named (a claim's lock of "self")
            return
        if self._iterable_class is not models.query.ModelIterable or not self._result_cache:
            return
        # deferred (manager): the models name their managers, defined here
        from django_app.models import ScheduleCursor

        # Lock the cursor rows too (after the schedules, as every writer does): the
        # materializer's cursor move then waits for this transaction and sees its writes
        # (on PostgreSQL the set-based materializer locks the schedule rows; elsewhere
        # its cursor move is the row it checks).
        found = ScheduleCursor.objects.select_for_update(nowait=query.select_for_update_nowait)
        cursors = found.in_bulk([s.pk for s in self._result_cache])
        for schedule in self._result_cache:
            if schedule.pk in cursors:
                type(schedule).cursor.related.set_cached_value(schedule, cursors[schedule.pk])

    def live(self) -> ScheduleQuerySet:
        """Not ended (ACTIVE, PAUSED, PARKED): what counts against ``max_schedules``."""
        return self.filter(state__in=[s.value for s in LIVE_SCHEDULE_STATES])


class OccurrenceQuerySet(models.QuerySet["Occurrence"]):
    def unclaimed(self) -> OccurrenceQuerySet:
        """Not claimed yet (SCHEDULED, ENQUEUED, RETRY_WAIT): may still be invalidated."""
        return self.filter(state__in=state_values(UNCLAIMED))

    def running_leased(self, now: datetime) -> OccurrenceQuerySet:
        """RUNNING under a lease still live at ``now`` (its worker is presumed alive)."""
        return self.filter(state=S.RUNNING.value, lease_expires_at__gt=now)

    def lease_expired(self, now: datetime) -> OccurrenceQuerySet:
        """RUNNING under a lease that expired before ``now`` (the reaper's work)."""
        return self.filter(state=S.RUNNING.value, lease_expires_at__lt=now)

    def sent_scheduled_between(self, since: datetime, until: datetime) -> OccurrenceQuerySet:
        """Sent occurrences (``enqueued_at`` set) scheduled in ``[since, until]``, newest
        first: the lag samples of the admin overview and of ``scheduler_status``.

        The window is on ``scheduled_for``, the history's partition key, so the read stays in
        the slots that hold it and walks ``occurrence_enqueued_time`` from its end, whatever
        the retention window keeps. (A window on ``enqueued_at`` read every slot whole.)
        """
        return self.filter(
            enqueued_at__isnull=False, scheduled_for__gte=since, scheduled_for__lte=until
        ).order_by("-scheduled_for")

    def transition(
        self,
        target: S,
        *,
        only_from: S | Iterable[S] | None = None,
        if_token: int | None = None,
        **fields: Any,
    ) -> int:
        """``UPDATE ... SET state = target, <fields> WHERE <this set> AND state IN
        sources_of(target) [AND fencing_token = if_token]``; returns the row count.

        ``only_from`` narrows the sources (the state read under a lock, or a writer's own
        set such as UNCLAIMED); it never widens them, so an illegal move matches no row.
        ``fields`` are the columns written besides the state (``fencing_token`` among them
        sets the new token; ``if_token`` is the condition).
        """
        # A state value read from a row (a str) or a member: one source, never its letters.
        within = (S(only_from),) if isinstance(only_from, str) else only_from
        rows = self.filter(state__in=state_values(sources_of(target, within=within)))
        if if_token is not None:
            rows = rows.filter(fencing_token=if_token)
        return rows.update(state=target.value, **fields)


def transition(
    occurrence_id: uuid.UUID,
    target: S,
    *,
    only_from: S | Iterable[S] | None = None,
    if_token: int | None = None,
    stale: Callable[[], Exception] | None = None,
    scheduled_for: datetime | None = None,
    **fields: Any,
) -> bool:
    """Move one occurrence to ``target`` by the conditional UPDATE and check the row count.

    True when the row moved. When it did not (another writer got there first: a newer
    attempt, the reaper, a lifecycle call), raises ``stale()`` if given, else returns False;
    it never overwrites. ``scheduled_for``, the row's own (as a claim read it), is the
    partitioned history's key: the UPDATE then reads one slot, not every slot's id index.
    """
    # deferred (manager): the models name their managers, defined here
    from django_app.models import Occurrence

    moved = by_key(Occurrence.objects.filter(pk=occurrence_id), scheduled_for).transition(
        target, only_from=only_from, if_token=if_token, **fields
    )
    if moved == 1:
        return True
    if stale is not None:
        raise stale()
    return False


#: An attempt's or outbox row's join to its occurrence on the whole key, not the id alone:
#: on the partitioned history an id alone is looked up in every slot's index.
SAME_SLOT = Q(scheduled_for=F("occurrence__scheduled_for"))


def by_key(rows: KeyedRows, scheduled_for: datetime | None) -> KeyedRows:
    """``rows`` narrowed to the partition key ``scheduled_for`` when it is known (the
    occurrence's own time; its attempts and outbox row carry the same)."""
    return rows if scheduled_for is None else rows.filter(scheduled_for=scheduled_for)


def fill_partition_key(rows: Iterable[Any]) -> None:
    """Set ``scheduled_for`` from the occurrence on rows whose caller left it out (one query).

    The scheduler's own writers pass it; this keeps ``Attempt.objects.create(occurrence=o,
    ...)`` and a ``bulk_create`` of hand-made rows working on every database."""
    missing = [r for r in rows if r.scheduled_for is None and r.occurrence_id is not None]
    if not missing:
        return
    occurrence = missing[0]._meta.get_field("occurrence").related_model
    ids = {r.occurrence_id for r in missing}
    times = dict(occurrence.objects.filter(pk__in=ids).values_list("pk", "scheduled_for"))
    for r in missing:
        r.scheduled_for = times.get(r.occurrence_id)


class PartitionKeyQuerySet(models.QuerySet[Any]):
    """Rows that carry their occurrence's ``scheduled_for`` (Attempt, OutboxEntry)."""

    def bulk_create(self, objs: Iterable[Any], *args: Any, **kwargs: Any) -> list[Any]:
        objs = list(objs)
        fill_partition_key(objs)
        return super().bulk_create(objs, *args, **kwargs)


class OutboxQuerySet(PartitionKeyQuerySet):
    def unsent(self) -> OutboxQuerySet:
        return self.filter(sent_at__isnull=True)

    def published_since(self, since: datetime, now: datetime) -> OutboxQuerySet:
        """Rows published in ``(since, now]`` (the ``outbox_sent_at`` index). ``publish_count >
        0``: closed rows (invalidated, dropped, skipped) carry a ``sent_at`` too."""
        return self.filter(sent_at__gt=since, sent_at__lte=now, publish_count__gt=0)

    def due(self, until: datetime) -> OutboxQuerySet:
        """Unsent rows available at or before ``until`` (the partial ``outbox_due`` index)."""
        return self.filter(sent_at__isnull=True, available_at__lte=until)

    def claimable(self, now: datetime, token: str) -> OutboxQuerySet:
        """Rows nobody else holds: unclaimed, claimed by ``token``, or whose claim expired.

        ``claimed_by`` stays on a sent row (who sent it) while its expiry is cleared, so a
        row the worker side re-opens for a retry (``sent_at = NULL``) is free again at once.
        """
        return self.filter(
            Q(claimed_by="")
            | Q(claimed_by=token)
            | Q(claim_expires_at__isnull=True)
            | Q(claim_expires_at__lt=now)
        )
