"""PostgreSQL: partition a populated install's history tables with a short, bounded lock.

The classic way (docs/howto/retention-and-scale.md), for the occurrence, attempt and outbox tables:

1. Fill ``scheduled_for`` on attempts and outbox rows from their occurrence, in batches
   (row locks of one batch at a time).
2. Build, ``CONCURRENTLY`` (reads and writes go on), the unique indexes a partitioned table
   needs: each unique key with the partition key added.
3. Add ``CHECK (scheduled_for IS NOT NULL AND scheduled_for < B) NOT VALID``, where ``B`` is
   a slot boundary ``--margin-days`` ahead (a brief lock, no scan). Rows already dated at
   or after ``B`` (far-future skip markers, a few) are set aside in a holding table; from here
   to the swap, a write of a row dated at or after ``B`` fails its check and its caller
   retries (the materializer plans minutes ahead, so only such far-future writes can).
4. ``VALIDATE CONSTRAINT``: the one scan of the table, under SHARE UPDATE EXCLUSIVE
   (reads and writes go on).
5. **The swap, one transaction under ACCESS EXCLUSIVE on the three tables**, each lock
   request bounded by ``lock_timeout`` (retried when not granted): the unique keys switch
   to the prebuilt indexes, the table is renamed ``<table>__history``, an empty partitioned
   table takes its name, indexes and constraints, and the old table is attached as the
   partition ``[MINVALUE, B)``: the validated check spares the scan, the prebuilt indexes
   spare the builds, so the lock covers catalog work only. The default partition and the
   slots from ``B`` are created. The lock time is reported (bench/README.md has a figure on
   millions of rows). Then, in a transaction of their own, the set-aside rows go back
   through the parent (to their slots, or the default partition).

A run interrupted anywhere (Ctrl-C, a killed session) can be run again: before step 1 a run
takes back what an earlier one left before its swap (its checks dropped, its set-aside rows
returned, a unique index whose concurrent build did not finish dropped; finished ones are
kept and not built again), and after the swap it returns rows still set aside. Two runs at
once are refused (an advisory lock held for the whole run).

The history partition is never dropped by ``partitions drop`` (its range starts at
MINVALUE): the batched ``prune_occurrences`` keeps serving it until it is empty; then an
operator may drop it (``DROP TABLE <table>__history`` after ``DETACH``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, connection, transaction

from django_app.db import partitions
from django_app.db import queries as sql
from django_app.db.partitions import KEY, Shape, apply_shape, slot_of, table_shape

_CHECK = "{}_history_range"
_HOLD = "{}__future"
#: Held (session level) for a whole conversion: a second run would take back the first's
#: checks and set-aside rows as an interrupted run's.
CONVERT_LOCK_KEY = 0x63736376

#: The unique index step 2 builds for the unique key ``name``.
_PREBUILT = "{}_k"


class ConversionRunning(DatabaseError):
    """Another ``partitions convert`` holds the conversion lock."""


@dataclass
class ConvertReport:
    converted: list[str] = field(default_factory=list)
    boundary: datetime | None = None
    backfilled: dict[str, int] = field(default_factory=dict)
    set_aside: dict[str, int] = field(default_factory=dict)
    #: Seconds per step; ``lock_held``: how long the ACCESS EXCLUSIVE locks were held (the
    #: swap transaction, from its LOCK to its commit).
    seconds: dict[str, float] = field(default_factory=dict)
    swap_attempts: int = 0

    def as_json(self) -> dict[str, Any]:
        return {
            "converted": self.converted,
            "boundary": None if self.boundary is None else self.boundary.isoformat(),
            "backfilled": self.backfilled,
            "set_aside": self.set_aside,
            "seconds": self.seconds,
            "swap_attempts": self.swap_attempts,
        }


def _exec(statement: str, params: dict[str, Any] | None = None) -> Any:
    with connection.cursor() as cur:
        cur.execute(statement, params)
        return cur.fetchone() if cur.description else None


def _exec_count(statement: str) -> int:
    """Run a data-changing statement; the rows it changed."""
    with connection.cursor() as cur:
        cur.execute(statement)
        return int(cur.rowcount)


def convert(
    now: datetime,
    *,
    width: timedelta,
    ahead: int,
    lock_timeout_ms: int = 5000,
    batch: int = 50_000,
    margin: timedelta = timedelta(days=2),
    swap_tries: int = 20,
    log: Callable[[str], Any] = lambda _: None,
) -> ConvertReport:
    """Partition the three plain tables (see the module doc); a no-op when already done."""
    with _only_run():
        return _convert(
            now, width=width, ahead=ahead, lock_timeout_ms=lock_timeout_ms, batch=batch,
            margin=margin, swap_tries=swap_tries, log=log,
        )  # fmt: skip


@contextmanager
def _only_run() -> Iterator[None]:
    with connection.cursor() as cur:
        cur.execute(sql.TRY_SESSION_ADVISORY_LOCK, {"key": CONVERT_LOCK_KEY})
        if not cur.fetchone()[0]:
            raise ConversionRunning("another `partitions convert` is running on this database")
    try:
        yield
    finally:
        with connection.cursor() as cur:
            cur.execute(sql.SESSION_ADVISORY_UNLOCK, {"key": CONVERT_LOCK_KEY})


def _convert(
    now: datetime,
    *,
    width: timedelta,
    ahead: int,
    lock_timeout_ms: int,
    batch: int,
    margin: timedelta,
    swap_tries: int,
    log: Callable[[str], Any],
) -> ConvertReport:
    report = ConvertReport()
    tables = partitions.tables()
    if partitions.is_partitioned():
        _return_set_aside(tables)  # an earlier run stopped between its swap and this step
        log("already partitioned")
        return report
    _take_back(tables, lock_timeout_ms)
    occ = tables[0]
    boundary, _ = slot_of(now + margin, width)
    report.boundary = boundary
    clock = time.monotonic()

    for table in tables[1:]:
        report.backfilled[table] = _backfill(table, occ, batch)
    report.seconds["backfill"] = round(time.monotonic() - clock, 3)
    log(f"backfilled {report.backfilled}")

    clock = time.monotonic()
    shapes = {t: _shape(t) for t in tables}
    for table in tables:
        for name, _kind, cols in shapes[table].uniques:
            cols = cols if KEY in cols else [*cols, KEY]
            _exec(sql.unique_index_concurrently(_PREBUILT.format(name), table, cols))
    report.seconds["indexes"] = round(time.monotonic() - clock, 3)
    log(f"unique indexes with {KEY} built in {report.seconds['indexes']}s")

    clock = time.monotonic()
    for table in tables:
        with transaction.atomic():
            _exec(sql.lock_timeout(lock_timeout_ms))
            _exec(sql.range_check(table, _CHECK.format(table), boundary))
    for table in tables:
        with transaction.atomic():
            hold = _HOLD.format(table)
            _exec(sql.create_like(hold, table, including="INCLUDING DEFAULTS"))
            row = _exec(
                sql.set_aside(table, hold, partitions.columns(table)), {"boundary": boundary}
            )
            report.set_aside[table] = int(row[0])
    report.seconds["set_aside"] = round(time.monotonic() - clock, 3)

    clock = time.monotonic()
    try:
        for table in tables:
            _exec(sql.validate_constraint(table, _CHECK.format(table)))
    except DatabaseError:
        _undo(tables, lock_timeout_ms)
        raise
    report.seconds["validate"] = round(time.monotonic() - clock, 3)
    log(f"checks validated in {report.seconds['validate']}s")

    for attempt in range(1, swap_tries + 1):
        report.swap_attempts = attempt
        clock = time.monotonic()
        try:
            with transaction.atomic():
                _exec(sql.lock_timeout(lock_timeout_ms))
                _exec(sql.UTC)
                for table in tables:
                    _exec(sql.lock_exclusive(table))
                for table in tables:
                    _swap(table, shapes[table], boundary)
                report.seconds["swap_catalog"] = round(time.monotonic() - clock, 3)
                partitions.ensure(now, width=width, ahead=ahead, wait=True)
            report.seconds["lock_held"] = round(time.monotonic() - clock, 3)
            break
        except DatabaseError as exc:
            log(f"swap attempt {attempt}: {exc}".strip())
            if attempt == swap_tries:
                _undo(tables, lock_timeout_ms)
                raise
            time.sleep(min(2.0, 0.1 * attempt))
    # The set-aside rows go back after the commit, not under the locks: they were out of
    # sight since step 3 already, and their number is the operator's.
    clock = time.monotonic()
    _return_set_aside(tables)
    report.seconds["routed_back"] = round(time.monotonic() - clock, 3)
    report.converted = tables
    log(f"locks held {report.seconds['lock_held']}s (try {report.swap_attempts})")
    return report


def _backfill(table: str, occ: str, batch: int) -> int:
    done = 0
    while True:
        with transaction.atomic():
            row = _exec(sql.backfill_key(table, occ, batch))
        n = int(row[0])
        done += n
        if n == 0:
            break
    # Rows a relay or a worker held locked, skipped above: wait for them (a handful).
    with transaction.atomic():
        done += _exec_count(sql.backfill_key_waiting(table, occ))
    # Orphans (an occurrence deleted behind the ORM's back): their own time is as good.
    own = "started_at" if table.endswith("attempt") else "created_at"
    _exec(sql.backfill_key_from(table, own))
    return done


def _swap(table: str, shape: Shape, boundary: datetime) -> None:
    """Under the lock: ``table`` becomes ``<table>__history``, attached to a new
    partitioned ``table`` as ``[MINVALUE, boundary)``. Catalog work only."""
    history = f"{table}__history"
    _exec(sql.key_not_null(table))  # the check proves it
    for name, kind, _cols in shape.uniques:
        _exec(sql.drop_constraint(table, name))
        _exec(sql.add_key_using_index(table, name + "__h", kind, name + "_k"))
    for name, _sql in shape.indexes:
        _exec(sql.rename_index(name, name + "__h"))
    _exec(sql.rename_table(table, history))
    _exec(sql.create_partitioned_like(table, history))
    identity = _exec(sql.IDENTITY_COLUMN, {"table": history})
    if identity:
        col = identity[0]
        # The new table's sequence goes on from the old one's last value.
        _exec(sql.continue_identity(history, col), {"table": table, "column": col})
        _exec(sql.drop_identity(history, col))
    apply_shape(table, shape)
    _exec(sql.attach_history(table, history), {"end": boundary})
    _exec(sql.drop_constraint(history, _CHECK.format(table)))
    _exec(sql.create_default_partition(table, storage=partitions.storage(table)))
    partitions.name_indexes(table + "_default")
    partitions.name_indexes(history)


def _shape(table: str) -> Shape:
    """The table's shape without the unique indexes step 2 builds (an interrupted run's)."""
    shape = table_shape(table)
    prebuilt = {_PREBUILT.format(name) for name, _kind, _cols in shape.uniques}
    return dataclasses.replace(shape, indexes=[i for i in shape.indexes if i[0] not in prebuilt])


def _take_back(tables: list[str], lock_timeout_ms: int) -> None:
    """What a run interrupted before its swap left: checks and set-aside rows go (as when a
    run gives up), and step 2's indexes whose concurrent build did not finish are dropped
    (an INVALID index would be taken as built: ``IF NOT EXISTS``)."""
    _undo(tables, lock_timeout_ms)
    for table in tables:
        for name, _kind, _cols in table_shape(table).uniques:
            index = _PREBUILT.format(name)
            if _exec(sql.INDEX_INVALID, {"name": index}) is not None:
                _exec(sql.drop_index(index, concurrently=True))


def _return_set_aside(tables: list[str]) -> None:
    """The rows step 3 set aside go back through the partitioned parents."""
    with transaction.atomic():
        for table in tables:
            hold = _HOLD.format(table)
            if _exec(sql.EXISTS_RELATION, {"name": hold})[0]:
                _exec(sql.route_back(table, hold, partitions.columns(table)))


def _undo(tables: list[str], lock_timeout_ms: int) -> None:
    """Give up before the swap: drop the checks and put the set-aside rows back.

    Only where there is something to undo: dropping a check locks its table ACCESS
    EXCLUSIVE even when there is none (``IF EXISTS``), and a first run has nothing to undo.
    The lock request is bounded, as every other of the conversion's."""
    for table in tables:
        check, hold = _CHECK.format(table), _HOLD.format(table)
        has_check = bool(_exec(sql.CONSTRAINT_EXISTS, {"table": table, "name": check})[0])
        has_hold = bool(_exec(sql.EXISTS_RELATION, {"name": hold})[0])
        if not (has_check or has_hold):
            continue
        with transaction.atomic():
            _exec(sql.lock_timeout(lock_timeout_ms))
            if has_check:
                _exec(sql.drop_constraint(table, check, if_exists=True))
            if has_hold:
                _exec(sql.route_back(table, hold, partitions.columns(table)))
