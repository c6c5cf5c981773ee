"""Retention: delete old finished occurrences (with their attempts and sent outbox rows).

What may go, and why only that:

- Occurrences in a terminal state (SUCCEEDED, MISSED, CANCELED, SKIPPED_OVERLAP; DEAD only
  when asked, because DEAD rows are the dead-letter queue an operator replays from) whose
  ``scheduled_for`` and ``finished_at`` (when set) are both before the cutoff. Their Attempt
  rows and their (sent) OutboxEntry rows go with them.
- Never a non-terminal occurrence, and never an occurrence whose outbox row is still unsent:
  that row is the relay's promise to publish, and deleting it would silently break it.
- Never an occurrence the materializer has not passed yet: a row of the schedule's live
  version at or after its cursor (``next_run_at``). Such a row is a marker, not history: an
  operator's skip of a future time is a CANCELED row whose ``finished_at`` is the moment of
  the skip, and the materializer's ``ON CONFLICT DO NOTHING`` insert is what keeps that time
  from running. Deleting it would let the time run (issue 25). Once the cursor has moved
  past the time, no materializer writes that key again and the row is history like any.
- IdempotencyRecord rows only on a separate, explicit cutoff, and never one whose occurrence
  still exists and can run again (non-terminal or DEAD): deleting a business key reopens the
  door to a duplicate effect when a late redelivery of that occurrence arrives.
- ScheduleVersion rows are kept: the reconciler recomputes expected occurrences from them.

What must be written before anything goes, in the same transaction: :func:`record_pruned`.
Two decisions read history (run now with an idempotency key, backfill's "already ran"), and
that function leaves them what they need once the rows are gone. Every path that deletes
occurrences (these batches, a dropped partition) calls it.

Each batch is its own short transaction (select at most ``batch_size`` ids, locked with
``FOR UPDATE SKIP LOCKED`` on PostgreSQL, then delete by id), so a running scheduler waits
at most one batch for any row and a worker touching a row is skipped, not blocked on.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.models import Count, Exists, Max, Min, OuterRef, Q, QuerySet, Subquery

from celery_scheduler.core import timeset
from celery_scheduler.core.enums import OccurrenceState as S
from celery_scheduler.core.states import PRUNABLE_STATES
from celery_scheduler.errors import ValidationError
from django_app.models import (
    Attempt,
    IdempotencyRecord,
    ManualRunKey,
    Occurrence,
    OutboxEntry,
    PrunedHistory,
    ScheduleCursor,
)
from django_app.schedules import replan
from django_app.schedules.backfill import BACKFILL_VERSION, RAN_STATES

MAX_BATCH = 10_000  # keeps every ``IN (...)`` under SQLite's parameter limit
_SPAN_CHUNK = 5_000  # schedules per PrunedHistory read (a partition holds many)
_ROWS_CHUNK = 500_000  # occurrences per chunk of record_pruned (a day of per-second ones)


@dataclass(frozen=True, kw_only=True)
class PruneReport:
    """What a prune deleted (or, with ``dry_run``, would delete)."""

    cutoff: datetime
    dry_run: bool
    include_dead: bool
    occurrences: dict[str, int]
    attempts: int
    outbox: int
    #: Old terminal occurrences kept because their outbox row is still unsent.
    kept_unsent_outbox: int
    batches: int
    idempotency_cutoff: datetime | None = None
    #: None when idempotency records were not in scope.
    idempotency_records: int | None = None
    states: tuple[str, ...] = field(default=PRUNABLE_STATES)

    @property
    def total_occurrences(self) -> int:
        return sum(self.occurrences.values())

    def as_json(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "cutoff": self.cutoff.isoformat(),
            "include_dead": self.include_dead,
            "states": list(self.states),
            "occurrences": {state: self.occurrences.get(state, 0) for state in self.states},
            "occurrences_total": self.total_occurrences,
            "attempts": self.attempts,
            "outbox": self.outbox,
            "kept_unsent_outbox": self.kept_unsent_outbox,
            "batches": self.batches,
            "idempotency_cutoff": (
                None if self.idempotency_cutoff is None else self.idempotency_cutoff.isoformat()
            ),
            "idempotency_records": self.idempotency_records,
        }


def _old_terminal(states: tuple[str, ...], cutoff: datetime) -> QuerySet[Occurrence]:
    # A row's age is the later of its time and its finish: a skip marker finishes when the
    # skip is made, possibly long before its time, and stays until its time is old too (as
    # a dropped partition, which goes by time, keeps it).
    old = Occurrence.objects.filter(state__in=states, scheduled_for__lt=cutoff).filter(
        Q(finished_at__lt=cutoff) | Q(finished_at__isnull=True)
    )
    return old.filter(~_ahead_of_cursor())


def _ahead_of_cursor() -> Q:
    """The row is one the materializer may still try to insert (a skip marker, a time it
    materialized ahead): live version, not manual, at or after the schedule's cursor.

    Every lifecycle change opens a new version, so rows of older versions (and manual
    rows, which have ids of their own) are never written again by the materializers."""
    # The cursor row carries the version: the narrow table alone answers.
    return Exists(
        ScheduleCursor.objects.filter(
            pk=OuterRef("schedule_id"),
            version=OuterRef("schedule_version"),
            next_run_at__isnull=False,
            next_run_at__lte=OuterRef("scheduled_for"),
        )
    ) & Q(manual=False)


def _unsent_outbox() -> Exists:
    # By the whole key (the row's time too, or none: written before it carried one), so
    # that on PostgreSQL's partitioned history the probe reads the row's slot alone.
    same_slot = Q(scheduled_for=OuterRef("scheduled_for")) | Q(scheduled_for__isnull=True)
    return Exists(OutboxEntry.objects.unsent().filter(same_slot, occurrence=OuterRef("pk")))


def prunable_occurrences(states: tuple[str, ...], cutoff: datetime) -> QuerySet[Occurrence]:
    """Occurrences in ``states`` due and finished before ``cutoff``, outbox sent."""
    return _old_terminal(states, cutoff).filter(~_unsent_outbox())


def prunable_idempotency_records(cutoff: datetime) -> QuerySet[IdempotencyRecord]:
    """Records older than ``cutoff`` whose occurrence is gone or can never run again."""
    can_run_again = Occurrence.objects.filter(id=OuterRef("occurrence_id")).exclude(
        state__in=PRUNABLE_STATES
    )
    return IdempotencyRecord.objects.filter(created_at__lt=cutoff).filter(~Exists(can_run_again))


def prune(
    *,
    now: datetime,
    older_than: timedelta,
    batch_size: int = 1000,
    include_dead: bool = False,
    idempotency_older_than: timedelta | None = None,
    dry_run: bool = False,
) -> PruneReport:
    """Delete (or count, with ``dry_run``) what the retention rules allow; see the module doc."""
    _check_age("older_than", older_than)
    if idempotency_older_than is not None:
        _check_age("idempotency_older_than", idempotency_older_than)
    if not 1 <= batch_size <= MAX_BATCH:
        raise ValidationError(
            f"batch_size must be between 1 and {MAX_BATCH}, got {batch_size}", field="batch_size"
        )
    states = (*PRUNABLE_STATES, S.DEAD.value) if include_dead else PRUNABLE_STATES
    cutoff = now - older_than
    idem_cutoff = None if idempotency_older_than is None else now - idempotency_older_than
    kept = _kept_unsent(states, cutoff)
    if dry_run:
        eligible = prunable_occurrences(states, cutoff)
        per_state = eligible.order_by().values_list("state").annotate(n=Count("id"))
        return PruneReport(
            cutoff=cutoff,
            dry_run=True,
            include_dead=include_dead,
            states=states,
            occurrences=dict(per_state),
            attempts=Attempt.objects.filter(occurrence__in=eligible).count(),
            outbox=OutboxEntry.objects.filter(occurrence__in=eligible).count(),
            kept_unsent_outbox=kept,
            batches=0,
            idempotency_cutoff=idem_cutoff,
            idempotency_records=(
                None if idem_cutoff is None else prunable_idempotency_records(idem_cutoff).count()
            ),
        )
    deleted: Counter[str] = Counter()
    attempts = outbox = batches = 0
    # Per state, oldest first: each batch walks the (state, scheduled_for) index from the
    # old end, where the prunable rows are, instead of rescanning the whole table.
    for state in states:
        while True:
            n_occ, n_att, n_out = _delete_occurrence_batch(state, cutoff, batch_size)
            if not n_occ:
                break
            batches += 1
            deleted[state] += n_occ
            attempts += n_att
            outbox += n_out
    idem_deleted = None
    if idem_cutoff is not None:
        idem_deleted = 0
        while n := _delete_idempotency_batch(idem_cutoff, batch_size):
            batches += 1
            idem_deleted += n
    return PruneReport(
        cutoff=cutoff,
        dry_run=False,
        include_dead=include_dead,
        states=states,
        occurrences=dict(deleted),
        attempts=attempts,
        outbox=outbox,
        kept_unsent_outbox=kept,
        batches=batches,
        idempotency_cutoff=idem_cutoff,
        idempotency_records=idem_deleted,
    )


def _check_age(name: str, age: timedelta) -> None:
    if age <= timedelta(0):
        raise ValidationError(f"{name} must be a positive age, got {age}", field=name)


def _kept_unsent(states: tuple[str, ...], cutoff: datetime) -> int:
    return _old_terminal(states, cutoff).filter(_unsent_outbox()).count()


def _locked(qs: QuerySet[Any]) -> QuerySet[Any]:
    # Rows another transaction holds (a replay of a DEAD row, a relay mark) are skipped
    # this run rather than waited for; the eligibility filter is re-read under the lock.
    if connection.features.has_select_for_update_skip_locked:
        return qs.select_for_update(skip_locked=True)
    return qs


def _delete_occurrence_batch(state: str, cutoff: datetime, size: int) -> tuple[int, int, int]:
    with transaction.atomic():
        candidates = _locked(prunable_occurrences((state,), cutoff).order_by("scheduled_for"))
        rows = list(candidates.values_list("id", "scheduled_for")[:size])
        if not rows:
            return 0, 0, 0
        ids = [occurrence for occurrence, _ in rows]
        batch = Occurrence.objects.filter(id__in=ids)
        keyed = Q()
        if connection.vendor == "postgresql":
            # The batch's span of time (it is taken in time order, so narrow): on the
            # partitioned history each statement below reads the slots the batch is in, not
            # every slot's index. Attempt and outbox rows written before they carried the
            # time (NULL, a plain table not converted yet) are still matched. Not on
            # MariaDB: there, with the range beside the ids, a batch waited for a row another
            # transaction held (test_a_row_locked_by_another_transaction_is_skipped_...).
            span = (rows[0][1], rows[-1][1])
            keyed = Q(scheduled_for__range=span) | Q(scheduled_for__isnull=True)
            batch = batch.filter(scheduled_for__range=span)
        record_pruned(batch)
        attempts, _ = Attempt.objects.filter(keyed, occurrence_id__in=ids).delete()
        outbox_rows = OutboxEntry.objects.filter(keyed, occurrence_id__in=ids)
        outbox, _ = outbox_rows.filter(sent_at__isnull=False).delete()
        # One plain DELETE, no ORM cascade: should an unsent outbox row still point at one
        # of these ids, the batch fails instead of silently orphaning it. (The outbox's
        # foreign key is no database constraint since the history tables are partitioned on
        # PostgreSQL: the check is this read, under the batch's row locks.)
        if outbox_rows.exists():
            raise IntegrityError("an unsent outbox row still points at an occurrence to delete")
        occurrences = batch._raw_delete(connection.alias)
        return occurrences, attempts, outbox


def _delete_idempotency_batch(cutoff: datetime, size: int) -> int:
    with transaction.atomic():
        candidates = _locked(prunable_idempotency_records(cutoff).order_by("created_at"))
        ids = list(candidates.values_list("id", flat=True)[:size])
        if not ids:
            return 0
        deleted, _ = IdempotencyRecord.objects.filter(id__in=ids).delete()
        return deleted


def record_pruned(occurrences: QuerySet[Occurrence]) -> None:
    """The bookkeeping owed before ``occurrences`` are deleted; call it in the deleting
    transaction, before the delete, with exactly the rows that go.

    Retention calls it per batch (``Occurrence.objects.filter(id__in=batch_ids)``); a
    partition drop calls it with the partition's range (``Occurrence.objects.filter(
    scheduled_for__gte=lo, scheduled_for__lt=hi)``) before detaching it. Either way the rows
    must be ones the retention rules allow (terminal, outbox sent, behind the cursor): this
    function does not check. It does two things:

    - adds to each schedule's :class:`PrunedHistory` what backfill's rule reads of the rows:
      their span ``[first, through]``, and the ``scheduled_for`` of those backfill leaves
      out (``ran``: a version's row in a state that ran; ``backfilled``: a backfill row), so
      a backfill over the span runs exactly what it would have run with the rows there,
      and those of the version rows that took their time without running
      (``passed_over``), which a new version's re-plan reads with the other two;
    - copies the final ``state`` and ``finished_at`` of the keyed run-now occurrences among
      them into their :class:`ManualRunKey` rows (run now answers a repeated key from there).

    Their Attempt and OutboxEntry rows and IdempotencyRecord rows need nothing: no decision
    to run reads them once the occurrence is terminal.
    """
    # Schedule by schedule, streamed in schedule order, a chunk at a time: a day's slot holds
    # the rows of millions of schedules, and what a chunk holds in memory (its spans and the
    # times left out) is bounded by _SPAN_CHUNK schedules or _ROWS_CHUNK rows. Chunks go in
    # schedule order, the order _widen_spans locks in.
    grouped = (
        occurrences.order_by("schedule_id")
        .values("schedule_id")
        .annotate(lo=Min("scheduled_for"), hi=Max("scheduled_for"), n=Count("id"))
    )
    spans: dict[Any, tuple[datetime, datetime]] = {}
    rows = 0
    for row in grouped.iterator(chunk_size=_SPAN_CHUNK):
        spans[row["schedule_id"]] = (row["lo"], row["hi"])
        rows += row["n"]
        if len(spans) >= _SPAN_CHUNK or rows >= _ROWS_CHUNK:
            _record_chunk(occurrences, spans)
            spans, rows = {}, 0
    if spans:
        _record_chunk(occurrences, spans)
    gone = occurrences.filter(id=OuterRef("occurrence_id"))
    ManualRunKey.objects.filter(state="").filter(Exists(gone)).update(
        state=Subquery(gone.values("state")[:1]),
        finished_at=Subquery(gone.values("finished_at")[:1]),
    )


def _record_chunk(
    occurrences: QuerySet[Occurrence], spans: dict[Any, tuple[datetime, datetime]]
) -> None:
    """The PrunedHistory of the schedules in ``spans``, from their rows among
    ``occurrences``."""
    left_out: dict[Any, _Kept] = {sid: _Kept() for sid in spans}
    kept = occurrences.filter(schedule_id__in=list(spans)).filter(
        Q(schedule_version=BACKFILL_VERSION) | Q(state__in=RAN_STATES) | replan.PASSED_OVER
    )
    for sid, version, state, at in (
        kept.order_by().values_list("schedule_id", "schedule_version", "state", "scheduled_for")
    ).iterator(chunk_size=5000):
        times = left_out[sid]
        if version == BACKFILL_VERSION:
            times.backfilled.append(timeset.to_int(at))
        elif state in RAN_STATES:
            times.ran.append(timeset.to_int(at))
        else:
            times.passed_over.append(timeset.to_int(at))
    _widen_spans(spans, left_out)


@dataclass
class _Kept:
    """One schedule's pruned times, by the PrunedHistory set each goes to."""

    ran: list[int] = field(default_factory=list)
    backfilled: list[int] = field(default_factory=list)
    passed_over: list[int] = field(default_factory=list)


def _widen_spans(spans: dict[Any, tuple[datetime, datetime]], left_out: dict[Any, _Kept]) -> None:
    # Insert what is new, then widen under the row locks: a concurrent prune of the same
    # schedule (a batch and a partition drop) waits on the insert or the lock, never loses
    # its span or its times. Locked in schedule order so two such prunes cannot deadlock.
    PrunedHistory.objects.bulk_create(
        [PrunedHistory(schedule_id=sid, first=lo, through=hi) for sid, (lo, hi) in spans.items()],
        ignore_conflicts=True,
    )
    rows = PrunedHistory.objects.select_for_update().filter(schedule_id__in=list(spans))
    changed = []
    for row in rows.order_by("schedule_id"):
        lo, hi = spans[row.schedule_id]
        times = left_out[row.schedule_id]
        widens = lo < row.first or hi > row.through
        if widens or times.ran or times.backfilled or times.passed_over:
            row.first, row.through = min(row.first, lo), max(row.through, hi)
            row.ran = timeset.add(row.ran, times.ran)
            row.backfilled = timeset.add(row.backfilled, times.backfilled)
            row.passed_over = timeset.add(row.passed_over, times.passed_over)
            changed.append(row)
    if changed:
        PrunedHistory.objects.bulk_update(
            changed, ["first", "through", "ran", "backfilled", "passed_over"]
        )
