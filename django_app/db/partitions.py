"""PostgreSQL: occurrence history range-partitioned by time (docs/howto/retention-and-scale.md).

The occurrence, attempt and outbox tables are partitioned by ``scheduled_for`` (the
occurrence's, copied onto its attempts and outbox row), one partition per
``partition_width_hours`` slot aligned on the Unix epoch (UTC midnights by default), named
``<table>_pYYYYMMDD`` (``_pYYYYMMDDHH`` for widths under a day). The three tables always
have the same slots, so one day's occurrences, attempts and outbox rows go together.

- **Every row has a home.** Each table has a DEFAULT partition: a row dated where no slot
  exists yet (a frozen test clock, a backfill years back, a far-future skip marker) goes
  there. Creating a slot moves the default partition's rows of that range into it in the
  same transaction, so no row is ever outside the partition its key names.
- **Created ahead, by the running beats** (:func:`ensure`, every few minutes from the beat
  loop, and ``manage.py partitions ensure``): the slots from the current one to
  ``partitions_ahead`` later. One transaction-scoped advisory lock serialises the
  beats: a beat that does not get it skips the round (another one is doing it).
- **Retention drops whole slots** (:func:`drop_old`): a slot entirely older than the cutoff
  goes with ``DETACH PARTITION``, then ``TRUNCATE`` and ``DROP TABLE`` after the detach
  commits, once nothing in it may still run or be replayed; see :func:`drop_old` for what
  blocks a drop and what ``move``/``force`` do. PostgreSQL refuses ``DETACH ...
  CONCURRENTLY`` on a table with a default partition, so the detach takes its ACCESS
  EXCLUSIVE lock on the parents for a catalog change only (the slot is checked, counted
  and bookkept before, under a SHARE lock on the slot alone), bounded by ``lock_timeout``;
  a round that cannot get it gives up and the next one tries again.
- Uniqueness: PostgreSQL requires the partition key in every unique key, so the primary
  keys are ``(id, scheduled_for)`` and ``(occurrence_id, scheduled_for)`` is the outbox's
  one-row-per-occurrence key. Nothing weakens: an occurrence id is a hash of its schedule,
  version and ``scheduled_for`` (and a manual one's time never changes), so one id never
  has two keys; ``(schedule, schedule_version, scheduled_for)`` held the key already.

SQLite and MariaDB keep plain tables and the batched ``DELETE`` of
:mod:`django_app.operations.retention`, which also still runs here (over every partition).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, OperationalError, connection, transaction

from celery_scheduler.core.enums import OccurrenceState as S
from celery_scheduler.core.states import PRUNABLE_STATES
from celery_scheduler.faults import fault_point
from django_app.db import queries as sql
from django_app.db.queries import KEY  # the partitioned tables' key: the occurrence's time
from django_app.db.retry import PG_LOCK_NOT_AVAILABLE, PG_UNDEFINED_TABLE
from django_app.models import Attempt, Occurrence, OutboxEntry

if TYPE_CHECKING:
    from django.db.models import QuerySet

logger = logging.getLogger(__name__)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: pg_advisory_xact_lock key (an arbitrary constant: "cs partitions").
LOCK_KEY = 0x63737061
#: pg_try_advisory_xact_lock key of the statistics refresh ("csan"): one beat at a time.
ANALYZE_LOCK_KEY = 0x6373616E
#: A slot is analyzed once it changed by this many rows, and then each time its changes
#: since the last ANALYZE reach half its size (a slot filling up: each time it doubles).
ANALYZE_MIN_CHANGES = 50_000
#: How long the refresh waits for a partition's lock (autovacuum may hold it) before
#: leaving it to the next round.
ANALYZE_LOCK_TIMEOUT_MS = 200

#: How long one maintenance statement waits for a table lock before the round gives up.
DEFAULT_LOCK_TIMEOUT_MS = 2000
#: The pause between two tries at the parents' locks (:func:`_lock_parents`): long enough
#: for the run-path transaction that made a try give up to finish.
LOCK_RETRY_PAUSE_S = 0.05
#: The percentage of each outbox page its inserts fill. An outbox row is written three
#: times: the plan inserts it, the relay's claim sets ``claimed_by`` and ``claim_expires_at``
#: (no indexed column), the mark sets ``sent_at`` (in the due indexes' condition, so never a
#: HOT update). The claim is a HOT update (no index entry) only where the new version fits
#: on the row's page, and the relay claims thousands of rows in one statement, whose old
#: versions cannot be pruned before it commits: a page needs room for a second version of
#: every row on it. The mark's version then takes the room the pruned first versions leave.
#: bench/README.md ("Write amplification") has the measured effect of each setting.
OUTBOX_FILLFACTOR = 40


def tables() -> list[str]:
    """The partitioned tables' names, occurrence first (the others follow its slots)."""
    return [m._meta.db_table for m in (Occurrence, Attempt, OutboxEntry)]


def analyze_grown(min_changes: int = ANALYZE_MIN_CHANGES) -> list[str]:
    """ANALYZE the history partitions that grew fast since their last ANALYZE; returns
    their names (empty: none, or another process is refreshing).

    A slot is created empty ahead of its time, so until it is analyzed the planner has no
    statistics for it. The relay's statements look rows up by id, which on a partitioned
    table is not a unique key on its own (the key includes the time): without statistics
    PostgreSQL plans those lookups as scans of the whole slot. Autovacuum analyzes a table
    only after its naptime and 10 % of change (and is off on some servers), while a
    top-of-the-hour burst or a catch-up fills a slot with hundreds of thousands of rows in
    a minute. The beats call this as they create rows; a slot is analyzed at
    ``min_changes`` changed rows and then each time its changes since reach half its size.
    """
    try:
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(sql.lock_timeout(ANALYZE_LOCK_TIMEOUT_MS))
            cur.execute(sql.TRY_ADVISORY_LOCK, {"key": ANALYZE_LOCK_KEY})
            row = cur.fetchone()
            if not (row and row[0]):
                return []
            parents = "{" + ",".join(tables()) + "}"
            cur.execute(sql.GROWN_PARTITIONS, {"parents": parents, "min": min_changes})
            names = [name for (name,) in cur.fetchall()]
            for name in names:
                cur.execute(sql.analyze(name))
    except DatabaseError as exc:  # a lock not granted in time: the next round tries again
        logger.info("partition statistics refresh skipped: %s", exc)
        return []
    return names


def storage(table: str) -> str:
    """The storage parameters each partition of ``table`` is created with (PostgreSQL keeps
    none on a partitioned table itself)."""
    return f"fillfactor={OUTBOX_FILLFACTOR}" if table == OutboxEntry._meta.db_table else ""


def is_partitioned(table: str | None = None) -> bool:
    """Whether ``table`` (default: the occurrence table) is a partitioned table here."""
    if connection.vendor != "postgresql":
        return False
    table = table or tables()[0]
    with connection.cursor() as cur:
        cur.execute(sql.IS_PARTITIONED, {"table": table})
        return cur.fetchone() is not None


# -- slots ---------------------------------------------------------------------------------


def slot_of(at: datetime, width: timedelta) -> tuple[datetime, datetime]:
    """The ``[start, end)`` slot holding ``at``: a multiple of ``width`` from the epoch."""
    n = (at - _EPOCH) // width
    start = _EPOCH + n * width
    return start, start + width


def slot_name(table: str, start: datetime, width: timedelta) -> str:
    fmt = "%Y%m%d" if width % timedelta(days=1) == timedelta(0) else "%Y%m%d%H%M"
    return f"{table}_p{start.astimezone(UTC).strftime(fmt)}"


@dataclass(frozen=True)
class Partition:
    name: str
    #: None: MINVALUE / MAXVALUE; both None with ``default``: the DEFAULT partition.
    start: datetime | None
    end: datetime | None
    default: bool = False


_BOUND = re.compile(r"FOR VALUES FROM \((.+?)\) TO \((.+?)\)")


def _bound(text: str) -> datetime | None:
    text = text.strip().strip("'")
    if text in ("MINVALUE", "MAXVALUE"):
        return None
    return datetime.fromisoformat(text).astimezone(UTC)


def partitions(table: str) -> list[Partition]:
    """``table``'s partitions with their bounds, in no particular order."""
    with connection.cursor() as cur:
        cur.execute(sql.PARTITIONS_OF, {"table": table})
        rows = cur.fetchall()
    out = []
    for name, bound in rows:
        if bound == "DEFAULT":
            out.append(Partition(name, None, None, default=True))
            continue
        m = _BOUND.search(bound)
        if m is None:  # not ours (list/hash): leave it alone
            continue
        out.append(Partition(name, _bound(m.group(1)), _bound(m.group(2))))
    return out


def _overlaps(p: Partition, start: datetime, end: datetime) -> bool:
    if p.default:
        return False
    return (p.start is None or p.start < end) and (p.end is None or start < p.end)


# -- creating ahead ------------------------------------------------------------------------


@dataclass
class EnsureReport:
    created: list[str] = field(default_factory=list)
    #: Rows moved out of the default partitions into the new slots.
    moved: int = 0
    #: False: another process held the maintenance lock (it is doing the same work).
    locked: bool = True


@contextmanager
def _maintenance(lock_timeout_ms: int, *, wait: bool) -> Iterator[bool]:
    """One transaction under the partition maintenance advisory lock; yields False (and
    does nothing) when another process holds it and ``wait`` is false."""
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(sql.UTC)
        # Deferred foreign key checks of rows this transaction wrote (a caller's atomic
        # block) run now: PostgreSQL will not detach or drop a table they are pending on.
        cur.execute(sql.CONSTRAINTS_IMMEDIATE)
        if wait:
            # Before the timeout: a beat retiring a day holds this lock for as long as its
            # bookkeeping takes, and advisory locks obey lock_timeout too.
            cur.execute(sql.ADVISORY_LOCK, {"key": LOCK_KEY})
            cur.execute(sql.lock_timeout(lock_timeout_ms))
            yield True
            return
        cur.execute(sql.lock_timeout(lock_timeout_ms))
        cur.execute(sql.TRY_ADVISORY_LOCK, {"key": LOCK_KEY})
        row = cur.fetchone()
        yield bool(row and row[0])


#: Minutes of the hour in which a beat's round does what can wait (see :func:`urgent_only`).
QUIET_MINUTES = range(20, 28)


def urgent_only(now: datetime) -> bool:
    """Whether a beat's maintenance round at ``now`` should do only what cannot wait.

    Creating or detaching a slot takes ACCESS EXCLUSIVE on the three parents, and while
    that request waits behind a wave's transaction every statement of the run path queues
    behind it. The busy minutes are the tops of the hours and the quarter hours (crons at
    midnight or on the hour, in zones whose offsets end in :00, :30, :15 or :45), and a
    day's slot is first wanted, and first expires, right after midnight. So a round outside
    :data:`QUIET_MINUTES` creates only the current and the next slot when missing and drops
    nothing; the slots further ahead and retention's drops wait for the quiet minutes (a
    round every 5 minutes always lands in them once an hour). Commands are not held back.
    """
    return now.astimezone(UTC).minute not in QUIET_MINUTES


def ensure(
    now: datetime,
    *,
    width: timedelta,
    ahead: int,
    behind: int = 0,
    lock_timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS,
    wait: bool = False,
) -> EnsureReport:
    """Create the slots from ``behind`` before ``now``'s to ``ahead`` after it, on every
    partitioned table, where no partition covers them yet. Idempotent; safe from many
    processes at once (one does the work, the others skip unless ``wait``)."""
    report = EnsureReport()
    if not is_partitioned():
        return report
    first, _ = slot_of(now, width)
    wanted = [(first + k * width, first + (k + 1) * width) for k in range(-behind, ahead + 1)]
    with _maintenance(lock_timeout_ms, wait=wait) as got:
        if not got:
            report.locked = False
            return report
        todo = {}
        for table in tables():
            existing = partitions(table)
            missing = [(s, e) for s, e in wanted if not any(_overlaps(p, s, e) for p in existing)]
            if missing:
                todo[table] = (existing, missing)
        if todo:
            _lock_parents(lock_timeout_ms)
        for table, (existing, missing) in todo.items():
            for start, end in missing:
                report.moved += _create_slot(table, start, end, width, existing)
                report.created.append(slot_name(table, start, width))
    if report.created:
        logger.info("partitions created: %s", ", ".join(report.created))
    return report


def _lock_parents(budget_ms: int) -> None:
    """ACCESS EXCLUSIVE on the three parents (and so every partition), in one order.

    Creating or detaching a partition takes it anyway; taking it first, on all three, means
    every statement that touches these tables either finished before or is planned after
    this transaction commits: it sees the moved rows where they now are, never a row
    "deleted" from under its lock by the move. Catalog work only is done under it, plus the
    move of the few rows a default partition held (or, for a dropped slot, of its blocking
    rows): it stops the whole run path while it is held.

    The run path has no one order over the three tables (a relay reads the outbox, then
    the occurrence; a claim writes the occurrence, then the attempt), so a transaction that
    holds one parent and then asks for another this step already took closes a cycle, and
    PostgreSQL ends whichever waiter checks first, after ``deadlock_timeout``. Each try here
    waits less than that and gives up (its savepoint releases what it took), so the side
    that yields is always maintenance, never a worker's claim or a relay's mark; the tries
    go on, a short pause apart, until ``budget_ms`` has passed, and then the error is the
    caller's (a beat's round skips and the next one tries again).
    """
    _lock(sql.lock_exclusive(*tables()), budget_ms)


def _lock(statement: str, budget_ms: int) -> None:
    """Run the LOCK ``statement`` in tries shorter than ``deadlock_timeout`` until
    ``budget_ms`` has passed (:func:`_lock_parents` says why)."""
    deadline = time.monotonic() + budget_ms / 1000
    with connection.cursor() as cur:
        cur.execute(sql.DEADLOCK_TIMEOUT_MS)
        row = cur.fetchone()
        per_try_ms = max(1, min(budget_ms, int(row[0]) // 2 if row else budget_ms))
        while True:
            try:
                with transaction.atomic():
                    cur.execute(sql.lock_timeout(per_try_ms))
                    cur.execute(statement)
            except OperationalError as exc:
                if getattr(exc.__cause__, "sqlstate", None) != PG_LOCK_NOT_AVAILABLE:
                    raise
                if time.monotonic() + LOCK_RETRY_PAUSE_S >= deadline:
                    raise
                time.sleep(LOCK_RETRY_PAUSE_S)
                continue
            cur.execute(sql.lock_timeout(budget_ms))
            return


def _create_slot(
    table: str, start: datetime, end: datetime, width: timedelta, existing: list[Partition]
) -> int:
    """Create one slot; move the default partition's rows of its range into it first."""
    name = slot_name(table, start, width)
    default = next((p.name for p in existing if p.default), None)
    span = {"start": start, "end": end}
    with connection.cursor() as cur:
        if default is None:
            cur.execute(sql.create_partition(table, name, storage=storage(table)), span)
            name_indexes(name)
            return 0
        cur.execute(sql.count_range(default), span)
        (n,) = cur.fetchone() or (0,)
        if not n:
            cur.execute(sql.create_partition(table, name, storage=storage(table)), span)
            name_indexes(name)
            return 0
        including = "INCLUDING DEFAULTS INCLUDING CONSTRAINTS"
        cur.execute(sql.create_like(name, table, including=including, storage=storage(table)))
        cur.execute(sql.move_range(default, name, columns(table)), span)
        cur.execute(sql.attach_partition(table, name), span)
        name_indexes(name)
        return int(n)


def child_index_name(parent: str, partition: str) -> str:
    """The name of ``partition``'s part of the index ``parent``: ``<parent>_<slot>``."""
    suffix = partition.rsplit("_", 1)[-1]
    return f"{parent[: 62 - len(suffix)]}_{suffix}"


def name_indexes(partition: str) -> None:
    """Name ``partition``'s indexes after the parent's (``<parent index>__<slot>``), not
    PostgreSQL's ``<partition>_<columns>_idx``: a plan then names the model's index, as on
    a plain table (``occurrence_schedule_time__p20261202``)."""
    with connection.cursor() as cur:
        cur.execute(sql.INHERITED_INDEXES, {"table": partition})
        for child, parent in cur.fetchall():
            wanted = child_index_name(parent, partition)
            if child != wanted:
                cur.execute(sql.rename_index(child, wanted))


def columns(table: str) -> list[str]:
    with connection.cursor() as cur:
        cur.execute(sql.COLUMNS, {"table": table})
        return [r[0] for r in cur.fetchall()]


# -- retention -----------------------------------------------------------------------------


@dataclass
class DropReport:
    cutoff: datetime
    dry_run: bool
    #: Slots dropped (or, with dry_run, that would be): occurrence partition names.
    dropped: list[str] = field(default_factory=list)
    #: Rows of the dropped slots, per table.
    rows: dict[str, int] = field(default_factory=dict)
    #: Slots kept because rows in them may still run or be replayed: name -> blocking
    #: rows by reason, and a few of their occurrence ids.
    refused: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Blocking rows moved into the default partition (``move``), and dropped (``force``).
    moved: int = 0
    forced: int = 0
    locked: bool = True

    def as_json(self) -> dict[str, Any]:
        return {
            "cutoff": self.cutoff.isoformat(),
            "dry_run": self.dry_run,
            "dropped": self.dropped,
            "rows": self.rows,
            "refused": self.refused,
            "moved": self.moved,
            "forced": self.forced,
            "locked": self.locked,
        }


def blocking(
    occ: str, out: str, span: tuple[datetime, datetime], include_dead: bool
) -> dict[Any, str]:
    """The rows of the occurrence partition ``occ`` that retention must not delete (the
    rules of django_app.operations.retention), as ``{occurrence id: why}``: unfinished
    work, DEAD rows unless ``include_dead``, unsent outbox rows (in ``out``, ``span``'s),
    and skip markers ahead of their cursor. A row that blocks for several reasons names
    the first of these. Three index-served probes (:func:`django_app.db.queries.
    blocking_probes`): their cost is the blocking rows', not the slot's."""
    terminal = {*PRUNABLE_STATES, *((S.DEAD,) if include_dead else ())}
    waiting = tuple(s.value for s in S if s not in terminal)
    found: dict[Any, str] = {}
    with connection.cursor() as cur:
        for probe in sql.blocking_probes(occ, out, waiting).values():
            cur.execute(probe, {"start": span[0], "end": span[1]})
            for occurrence, why in cur.fetchall():
                found.setdefault(occurrence, why)
    return found


def drop_detached(lock_timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS) -> list[str]:
    """Drop the slots a retention round detached and did not get to drop (its process died
    in between, or the drop's lock was not granted in time): tables named as a slot of the
    partitioned tables that are no partition."""
    # slot_name: the day, and the hour and minute of a slot narrower than a day.
    pattern = "^(" + "|".join(re.escape(t) for t in tables()) + ")_p[0-9]{8}([0-9]{4})?$"
    with connection.cursor() as cur:
        cur.execute(sql.DETACHED_TABLES, {"pattern": pattern})
        names = [name for (name,) in cur.fetchall()]
    if names:
        _discard(names, lock_timeout_ms)
        logger.info("detached partitions dropped: %s", ", ".join(names))
    return names


def _discard(detached: list[str], lock_timeout_ms: int) -> None:
    """Empty, then drop, tables a committed transaction detached, each step committed on its
    own (or, inside a caller's transaction, in savepoints).

    Not in the detaching transaction: the commit that removes a table unlinks its files,
    which for a day of rows takes a while (bench/README.md, "Retiring a day"), and the
    parents' lock must not be held through it. Nor by a DROP at once: the occurrence slot
    keeps the foreign keys it inherited, so dropping it takes ACCESS EXCLUSIVE on the
    schedule and tenant tables until its commit. TRUNCATE takes no lock beyond the table's
    and does the unlinking; the DROP after it removes empty files. A drop not granted its
    locks in ``lock_timeout_ms`` is left to the next round (:func:`drop_detached`): no
    reader sees a detached table in the meantime. One table at a time: a table another
    round (a beat's :func:`drop_detached`) drops first is skipped.
    """
    for table in detached:
        for statement in (sql.truncate(table), sql.drop_table(table)):
            try:
                with transaction.atomic(), connection.cursor() as cur:
                    cur.execute(sql.lock_timeout(lock_timeout_ms))
                    cur.execute(statement)
            except DatabaseError as exc:
                code = getattr(exc.__cause__, "sqlstate", None)
                if code == PG_UNDEFINED_TABLE:  # another round (a beat's) dropped it first
                    break
                if code != PG_LOCK_NOT_AVAILABLE:
                    raise
                logger.warning("detached partitions left for the next round: %s", exc)
                return


def drop_old(
    now: datetime,
    older_than: timedelta,
    *,
    include_dead: bool = False,
    move: bool = False,
    force: bool = False,
    dry_run: bool = False,
    on_prune: Callable[[QuerySet[Occurrence]], None],
    lock_timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS,
    wait: bool = False,
) -> DropReport:
    """Drop every slot that ends at or before ``now - older_than``, on all three tables.

    ``on_prune`` is retention's bookkeeping (``django_app.operations.retention.record_pruned``,
    passed in by the caller: this package sits below it): it is called in the detaching
    transaction, before the detach, with exactly the occurrences that go.

    A slot holding rows retention must keep (:func:`blocking`: unfinished work, DEAD
    rows unless ``include_dead``, unsent outbox rows, skip markers ahead of a cursor) is
    **refused**: left in place and reported with its blocking rows, and the older and newer
    slots are still considered. ``move``: those rows (with their attempts and outbox row)
    are re-inserted through the parent in the same transaction as the detach, which routes
    them to the default partition (no slot covers their range any more): they stay where
    every reader finds them, and the batched prune deletes them once they may go.
    ``force``: they are dropped with the slot. The DEFAULT partition and the history
    partition of a converted install (its range starts at MINVALUE) are never dropped here:
    the batched prune serves them.
    """
    cutoff = now - older_than
    report = DropReport(cutoff=cutoff, dry_run=dry_run)
    if not is_partitioned():
        return report
    if not dry_run:
        drop_detached(lock_timeout_ms)
    occ_t, att_t, out_t = tables()
    with _maintenance(lock_timeout_ms, wait=wait) as got:
        if not got:
            report.locked = False
            return report
        slots = sorted(
            (p for p in partitions(occ_t) if p.start is not None and p.end is not None),
            key=lambda p: p.start or _EPOCH,
        )
        siblings = {
            t: {(p.start, p.end): p.name for p in partitions(t) if not p.default}
            for t in (att_t, out_t)
        }
    for p in slots:
        if p.start is None or p.end is None or p.end > cutoff:
            continue
        names = {
            occ_t: p.name,
            att_t: siblings[att_t].get((p.start, p.end)),
            out_t: siblings[out_t].get((p.start, p.end)),
        }
        _drop_slot(
            report,
            names,
            (p.start, p.end),
            on_prune,
            include_dead=include_dead,
            move=move,
            force=force,
            dry_run=dry_run,
            lock_timeout_ms=lock_timeout_ms,
            wait=wait,
        )
    return report


def _drop_slot(
    report: DropReport,
    names: dict[str, str | None],
    span: tuple[datetime, datetime],
    on_prune: Callable[[QuerySet[Occurrence]], None],
    *,
    include_dead: bool,
    move: bool,
    force: bool,
    dry_run: bool,
    lock_timeout_ms: int,
    wait: bool,
) -> None:
    occ_t, _att_t, out_t = tables()
    occ_p = names[occ_t]
    assert occ_p is not None
    out_p = names[out_t] or out_t
    parts = [part for part in names.values() if part]
    with _maintenance(lock_timeout_ms, wait=wait) as got:
        if not got:
            report.locked = False
            return
        kept = blocking(occ_p, out_p, span, include_dead)
        if _refused(report, occ_p, kept, move=move, force=force):
            return
        with connection.cursor() as cur:
            if dry_run:
                report.dropped.append(occ_p)
                for t, n in _sizes(cur, names).items():
                    report.rows[t] = report.rows.get(t, 0) + n
                return
            # The bookkeeping reads the whole slot (a day of rows: seconds to minutes), so it
            # runs before the slot is locked: a worker whose claim runs on a generic plan
            # locks every partition of the history (PostgreSQL before 17), expired slots
            # included, and would wait behind the slot's lock for as long as it is held.
            # Rows written in the slot meanwhile (a late completion, a backfill into the
            # past) are caught under the lock below, and the bookkeeping is done again.
            since = _snapshot_xmin(cur)
            bookkeeping = transaction.savepoint()
            on_prune(_going(span, kept if move else {}))
            # SHARE on the slot's own partitions: its writers finish first and new ones
            # wait, so the rows read from here on are the rows that go. Writers of other
            # slots, and every reader, go on.
            _lock(sql.lock_share(*parts), lock_timeout_ms)
            again = blocking(occ_p, out_p, span, include_dead)
            if _refused(report, occ_p, again, move=move, force=force):
                transaction.savepoint_rollback(bookkeeping)
                return
            sizes, written = _sizes_since(cur, names, since)
            if written or again.keys() != kept.keys():
                # Rolling back to the savepoint gives up the lock taken after it: again.
                transaction.savepoint_rollback(bookkeeping)
                _lock(sql.lock_share(*parts), lock_timeout_ms)
                again = blocking(occ_p, out_p, span, include_dead)
                if _refused(report, occ_p, again, move=move, force=force):
                    return
                sizes = _sizes(cur, names)
                on_prune(_going(span, again if move else {}))
            else:
                transaction.savepoint_commit(bookkeeping)
            kept = again
            kept_ids = list(kept) if move else []
            # Writers and readers of every slot wait from here to the commit: catalog work,
            # and the copy of the few kept rows with ``move``.
            _lock_parents(lock_timeout_ms)
            for table, part in names.items():
                if part:
                    cur.execute(sql.detach_partition(table, part))
            if kept_ids:
                for table, part in names.items():
                    if not part:
                        continue
                    ref = "id" if table == occ_t else "occurrence_id"
                    cur.execute(
                        sql.copy_rows(table, part, columns(table), where=ref), {"ids": kept_ids}
                    )
                report.moved += len(kept_ids)
            elif kept:
                report.forced += len(kept)
    fault_point("partitions.after_detach")
    _discard(parts, lock_timeout_ms)
    report.dropped.append(occ_p)
    for t, n in sizes.items():
        report.rows[t] = report.rows.get(t, 0) + n
    logger.info("partition slot %s dropped (%s)", occ_p, sizes)


def _refused(
    report: DropReport, occ_p: str, kept: dict[Any, str], *, move: bool, force: bool
) -> bool:
    """Record the slot as refused when rows retention keeps hold it (and neither ``move``
    nor ``force`` was asked)."""
    if not kept or move or force:
        return False
    counts: dict[str, int] = {}
    for why in kept.values():
        counts[why] = counts.get(why, 0) + 1
    ids = sorted(str(i) for i in kept)[:10]
    report.refused[occ_p] = {"blocking": counts, "occurrence_ids": ids}
    return True


def _going(span: tuple[datetime, datetime], kept: Mapping[Any, str]) -> QuerySet[Occurrence]:
    """The occurrences a drop of ``span``'s slot deletes (``kept``: those it moves out)."""
    rows = Occurrence.objects.filter(scheduled_for__gte=span[0], scheduled_for__lt=span[1])
    return rows.exclude(id__in=list(kept)) if kept else rows


def _snapshot_xmin(cur: Any) -> int:
    """The oldest transaction still running now: every row written after this moment
    carries an ``xmin`` at least this new."""
    cur.execute(sql.SNAPSHOT_XMIN)
    return int(cur.fetchone()[0])


def _sizes(cur: Any, names: dict[str, str | None]) -> dict[str, int]:
    sizes = {}
    for table, part in names.items():
        if part:
            cur.execute(sql.count_all(part))
            sizes[table] = int((cur.fetchone() or (0,))[0])
    return sizes


def _sizes_since(cur: Any, names: dict[str, str | None], since: int) -> tuple[dict[str, int], bool]:
    """Each partition's rows, and whether any was written by a transaction not older than
    ``since`` (:func:`_snapshot_xmin`; one scan of each). Conservative: a row written just
    before counts too, which only costs the bookkeeping done again."""
    sizes: dict[str, int] = {}
    written = False
    for table, part in names.items():
        if part:
            cur.execute(sql.count_written_since(part), {"since": since})
            total, recent = cur.fetchone() or (0, 0)
            sizes[table] = int(total)
            written = written or bool(recent)
    return sizes, written


# -- turning plain tables into partitioned ones ----------------------------------------------


@dataclass(frozen=True)
class Shape:
    """What a plain table carries that its partitioned form must carry too."""

    #: (name, CREATE INDEX statement) of indexes that back no constraint.
    indexes: list[tuple[str, str]]
    #: (name, kind 'p'/'u', column list) of primary key and unique constraints.
    uniques: list[tuple[str, str, list[str]]]
    #: (name, definition) of foreign keys and checks.
    others: list[tuple[str, str]]


def table_shape(table: str) -> Shape:
    with connection.cursor() as cur:
        cur.execute(sql.PLAIN_INDEXES, {"table": table})
        indexes = [(n, d) for n, d in cur.fetchall()]
        cur.execute(sql.UNIQUE_CONSTRAINTS, {"table": table})
        uniques = [(n, k, list(cols)) for n, k, cols in cur.fetchall()]
        cur.execute(sql.OTHER_CONSTRAINTS, {"table": table})
        others = [(n, d) for n, d in cur.fetchall()]
    return Shape(indexes, uniques, others)


def _on_table(index_sql: str, table: str) -> str:
    """A CREATE INDEX statement read from the catalog, moved onto ``table``."""
    return re.sub(r" ON (ONLY )?\S+ USING ", f" ON {sql.q(table)} USING ", index_sql, count=1)


def _with_key(index_sql: str) -> str:
    """A unique index's statement with the partition key added to its columns."""
    head, sep, rest = index_sql.partition(" USING ")
    method, _, cols = rest.partition(" (")
    depth, i = 1, 0
    while depth:
        depth += {"(": 1, ")": -1}.get(cols[i], 0)
        i += 1
    inner, tail = cols[: i - 1], cols[i - 1 :]
    if KEY in [c.strip() for c in inner.split(",")]:
        return index_sql
    return f"{head}{sep}{method} ({inner}, {KEY}{tail}"


def apply_shape(table: str, shape: Shape, *, suffix: str = "") -> None:
    """Build ``shape`` on the (empty, partitioned) ``table``: unique keys gain the key."""
    with connection.cursor() as cur:
        for name, kind, cols in shape.uniques:
            if KEY not in cols:
                cols = [*cols, KEY]
            cur.execute(sql.add_key(table, name + suffix, kind, cols))
        for name, index_sql in shape.indexes:
            index_sql = _on_table(index_sql, table)
            if index_sql.startswith("CREATE UNIQUE"):
                index_sql = _with_key(index_sql)
            if suffix:
                index_sql = index_sql.replace(f"INDEX {name} ", f"INDEX {sql.q(name + suffix)} ", 1)
            cur.execute(index_sql)
        for name, definition in shape.others:
            cur.execute(sql.add_constraint(table, name + suffix, definition))


def partition_empty_tables(now: datetime, *, width: timedelta, ahead: int) -> list[str]:
    """Turn the three plain, empty tables into partitioned ones (fresh installs: migration
    0020). Refuses a table that has rows: ``manage.py partitions convert`` is for those."""
    converted = []
    for table in tables():
        if is_partitioned(table):
            continue
        with connection.cursor() as cur:
            cur.execute(sql.has_rows(table))
            (has_rows,) = cur.fetchone() or (False,)
            if has_rows:
                raise RuntimeError(
                    f"{table} has rows: convert it with `manage.py partitions convert`"
                )
            shape = table_shape(table)
            plain = f"{table}__plain"
            cur.execute(sql.rename_table(table, plain))
            cur.execute(sql.create_partitioned_like(table, plain))
            cur.execute(sql.key_not_null(table))
            cur.execute(sql.drop_table(plain))
            apply_shape(table, shape)
            cur.execute(sql.create_default_partition(table, storage=storage(table)))
            name_indexes(table + "_default")
        converted.append(table)
    if converted:
        ensure(now, width=width, ahead=ahead, wait=True)
    return converted


def unpartition_empty_tables() -> list[str]:
    """The reverse of :func:`partition_empty_tables` (migrating back), on empty tables."""
    done = []
    for table in tables():
        if not is_partitioned(table):
            continue
        with connection.cursor() as cur:
            cur.execute(sql.has_rows(table))
            (has_rows,) = cur.fetchone() or (False,)
            if has_rows:
                raise RuntimeError(f"{table} has rows: it cannot be turned back automatically")
            shape = table_shape(table)
            part = f"{table}__part"
            cur.execute(sql.rename_table(table, part))
            including = "INCLUDING DEFAULTS INCLUDING IDENTITY INCLUDING GENERATED"
            cur.execute(sql.create_like(table, part, including=including))
            cur.execute(sql.drop_table(part, cascade=True))
            if table != tables()[0]:  # nullable in the model (rows older than the key)
                cur.execute(sql.key_not_null(table, required=False))
            # Back to the model's keys: drop the partition key from the unique keys.
            plain = Shape(
                indexes=shape.indexes,
                uniques=[
                    (
                        n,
                        k,
                        [c for c in cols if c != KEY] if k == "p" or table != tables()[0] else cols,
                    )
                    for n, k, cols in shape.uniques
                ],
                others=shape.others,
            )
            apply_shape_plain(table, plain)
        done.append(table)
    return done


def apply_shape_plain(table: str, shape: Shape) -> None:
    with connection.cursor() as cur:
        for name, kind, cols in shape.uniques:
            cur.execute(sql.add_key(table, name, kind, cols))
        for _, index_sql in shape.indexes:
            cur.execute(_on_table(index_sql, table))
        for name, definition in shape.others:
            cur.execute(sql.add_constraint(table, name, definition))
