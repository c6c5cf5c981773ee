"""The database's work per occurrence over its whole life, phase by phase, on PostgreSQL.

``python -m bench.write_amplification [--n 5000] [--db cs_wal] [--outbox-fillfactor N]
[--drop-index a,b]``

Recreates the database ``--db``, migrates it, and takes N hourly crons (due at one minute)
through the life a user's schedule has on the defaults, each phase in this process on a
frozen clock: **create** (``api.create_schedules``), **plan** (the beat's materializer),
**publish** (the burst relay, the default on PostgreSQL with Redis, into a recording
publisher: the broker's own work is not counted), **claim + complete** (the worker wrapper's
``execute`` for each occurrence, as ``celery_scheduler.run_occurrence`` calls it).

For each phase it prints, per schedule or occurrence:

- WAL bytes of this database's relations, read with ``pg_walinspect`` between the phase's
  first and last LSN, split into records and full-page images (a first change to a page
  after a checkpoint logs the whole page; each phase starts after a ``CHECKPOINT``, so the
  FPI column is the worst case). Records without a relation (commits) are counted apart;
  other databases' WAL on a shared cluster is left out by the relation filter;
- index entries written (B-tree and GIN leaf inserts) per index, a BRIN index's summary
  writes apart, and heap inserts, updates and HOT updates per table (``pg_stat_user_tables``
  deltas of this database).

The figures are counts of the database's work, so unlike times they do not depend on what
else the machine does.
"""

from __future__ import annotations

import argparse
import os
import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from bench.create_rate import Cpu, migrated_database

PG = "postgresql://postgres@127.0.0.1:5432"
TASK = "bench.write_amplification.noop"
_REL = re.compile(r"rel \d+/(\d+)/(\d+)")
#: WAL record types that add one entry to an index. INSERT_POST is an insert that lands in a
#: deduplicated posting list (a duplicate key: the occurrence's state and time indexes); a
#: leaf split logs its new entry in the split record. DEDUP is left out: it merges entries
#: already there, and the entry that triggered it is logged by its own insert record, so
#: counting both made the count follow the pages' dedup state rather than the writes.
_INDEX_INSERTS = {("Btree", "INSERT_LEAF"), ("Btree", "INSERT_POST"), ("Btree", "INSERT_UPPER"),
                  ("Btree", "SPLIT_L"), ("Btree", "SPLIT_R"), ("Gin", "INSERT")}  # fmt: skip
#: A BRIN index writes no entry per row: these records widen a page range's summary (or add
#: one), counted per index beside the entries above.
_BRIN_WRITES = {("BRIN", "INSERT"), ("BRIN", "UPDATE"), ("BRIN", "SAMEPAGE_UPDATE")}


@dataclass
class PhaseWork:
    """What one phase cost the database."""

    name: str
    rows: int
    record_bytes: int = 0
    fpi_bytes: int = 0
    unattributed_bytes: int = 0
    seconds: float = 0.0
    #: CPU seconds of this process and of its PostgreSQL backend during the phase.
    cpu: tuple[float, float] = (0.0, 0.0)
    index_entries: Counter[str] = field(default_factory=Counter)
    brin_writes: Counter[str] = field(default_factory=Counter)
    heap: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))

    def print(self) -> None:
        per = max(self.rows, 1)
        print(
            f"\n== {self.name}: {self.rows:,} rows; per row: WAL {self.record_bytes / per:,.0f} B "
            f"records + {self.fpi_bytes / per:,.0f} B full pages "
            f"(+ {self.unattributed_bytes / per:,.0f} B commits etc.); "
            f"index entries {sum(self.index_entries.values()) / per:.2f}; "
            f"{self.seconds:.2f} s, {self.rows / max(self.seconds, 1e-9):,.0f} rows/s; CPU per "
            f"row: client {self.cpu[0] * 1e6 / per:,.0f} us, "
            f"server {self.cpu[1] * 1e6 / per:,.0f} us"
        )
        for table, counts in sorted(self.heap.items()):
            shown = ", ".join(f"{k} {v / per:.2f}" for k, v in sorted(counts.items()) if v)
            if shown:
                print(f"   heap  {table:<40} {shown}")
        for index, count in self.index_entries.most_common():
            print(f"   index {index:<40} {count / per:.2f}")
        for index, count in self.brin_writes.most_common():
            print(f"   brin  {index:<40} {count / per:.2f} summary writes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5_000)
    parser.add_argument("--db", default="cs_wal")
    parser.add_argument(
        "--outbox-fillfactor",
        type=int,
        help="set every outbox partition's fillfactor to this after migrating (100: pages "
        "filled, as before migration 0027); default: as migrated",
    )
    parser.add_argument(
        "--drop-index",
        default="",
        help="comma-separated indexes to drop after migrating (what an index costs, as an "
        "experiment: the database is recreated by the next run)",
    )
    args = parser.parse_args()

    migrated_database(args.db)
    if args.outbox_fillfactor:
        set_outbox_fillfactor(args.outbox_fillfactor)
    for index in filter(None, args.drop_index.split(",")):
        from django.db import connection

        with connection.cursor() as cur:
            cur.execute(f'DROP INDEX "{index}"')
        print(f"index {index} dropped")
    meter = Meter(f"{PG}/{args.db}")
    for phase in run_life(args.n, meter):
        phase.print()
    print_sizes()


def set_outbox_fillfactor(percent: int) -> None:
    from django.db import connection

    from django_app.db import partitions
    from django_app.db import queries as sql
    from django_app.models import OutboxEntry

    with connection.cursor() as cur:
        for p in partitions.partitions(OutboxEntry._meta.db_table):
            cur.execute(sql.set_storage(p.name, f"fillfactor={percent}"))
    print(f"outbox partitions' fillfactor set to {percent}")


def summarize_brin_ranges() -> None:
    """Summarize every BRIN index's page ranges, as ``autosummarize`` has autovacuum do soon
    after the plan writes them: a publish then widens summaries, the work it does in steady
    state (into a range not summarized yet it writes nothing)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "SELECT brin_summarize_new_values(c.oid) FROM pg_class c JOIN pg_am a"
            " ON a.oid = c.relam WHERE a.amname = 'brin' AND c.relkind = 'i'"
        )
        print(f"BRIN ranges summarized before the publish: {sum(r[0] for r in cur.fetchall())}")


def print_sizes() -> None:
    """The heap pages of each history table's partitions that hold rows, at the end."""
    from django.db import connection

    from django_app.db import partitions

    with connection.cursor() as cur:
        for table in partitions.tables():
            for p in partitions.partitions(table):
                cur.execute("SELECT pg_relation_size(%s::regclass) / 8192", [p.name])
                (pages,) = cur.fetchone()  # type: ignore[misc]
                if pages:
                    print(f"heap pages at the end: {p.name} {pages:,}")


class Meter:
    """Reads WAL and table statistics of one database around a phase."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        self.conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        (self.db_oid,) = self.conn.execute(
            "SELECT oid::text FROM pg_database WHERE datname = current_database()"
        ).fetchone()  # type: ignore[misc]

    def measure(self, name: str, rows: int, phase: Callable[[], Any]) -> PhaseWork:
        self.conn.execute("CHECKPOINT")
        # A replication slot keeps the phase's WAL segments from being recycled until read.
        slot = f"bench_wal_{os.getpid()}"
        self.conn.execute("SELECT pg_create_physical_replication_slot(%s, true)", [slot])
        try:
            return self._measure(name, rows, phase)
        finally:
            self.conn.execute("SELECT pg_drop_replication_slot(%s)", [slot])

    def _measure(self, name: str, rows: int, phase: Callable[[], Any]) -> PhaseWork:
        before_stats = self._table_stats()
        (start,) = self.conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()  # type: ignore[misc]
        cpu = Cpu()
        cpu_before = cpu.read()
        began = time.perf_counter()
        phase()
        seconds = time.perf_counter() - began
        client, server = (b - a for a, b in zip(cpu_before, cpu.read(), strict=True))
        # The phase's backend reports its table counters at most once a second: without this
        # its last second of updates showed up in the next phase's heap lines.
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_force_next_flush()")
        time.sleep(0.2)
        (end,) = self.conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()  # type: ignore[misc]
        while self.conn.execute(  # the WAL writer flushes within wal_writer_delay
            "SELECT pg_current_wal_flush_lsn() < %s::pg_lsn", [end]
        ).fetchone()[0]:  # type: ignore[index]
            time.sleep(0.05)
        work = PhaseWork(name, rows, seconds=seconds, cpu=(client, server))
        names = self._relation_names()
        for rmgr, rtype, length, fpi, block_ref in self.conn.execute(
            "SELECT resource_manager, record_type, record_length, fpi_length, block_ref "
            "FROM pg_get_wal_records_info(%s, %s)",
            [start, end],
        ):
            refs = _REL.findall(block_ref or "")
            if not refs:
                work.unattributed_bytes += length if rmgr == "Transaction" else 0
                continue
            if all(db != self.db_oid for db, _ in refs):
                continue  # another database on the shared cluster
            work.record_bytes += length - fpi
            work.fpi_bytes += fpi
            if (rmgr, rtype.split()[0]) in _INDEX_INSERTS:
                work.index_entries[names.get(refs[0][1], refs[0][1])] += 1
            elif (rmgr, rtype.split()[0]) in _BRIN_WRITES:
                work.brin_writes[names.get(refs[0][1], refs[0][1])] += 1
        after_stats = self._table_stats()
        for table, after in after_stats.items():
            before = before_stats.get(table, (0, 0, 0))
            for key, b, a in zip(("insert", "update", "hot update"), before, after, strict=True):
                work.heap[table][key] += a - b
        return work

    def _relation_names(self) -> dict[str, str]:
        rows = self.conn.execute(
            "SELECT pg_relation_filenode(oid)::text, relname FROM pg_class "
            "WHERE relnamespace = 'public'::regnamespace AND pg_relation_filenode(oid) IS NOT NULL"
        )
        return dict(rows.fetchall())

    def _table_stats(self) -> dict[str, tuple[int, int, int]]:
        self.conn.execute("SELECT pg_stat_clear_snapshot()")
        rows = self.conn.execute(
            "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
            "WHERE relname LIKE 'django_app_%%'"
        )
        return {name: (ins, upd, hot) for name, ins, upd, hot in rows}


def run_life(n: int, meter: Meter) -> list[PhaseWork]:
    """Create, plan, publish, claim and complete ``n`` occurrences; one PhaseWork each."""
    from celery import Celery, shared_task

    from celery_scheduler import api
    from celery_scheduler.core.clock import FrozenClock
    from celery_scheduler.publishers import RecordingPublisher
    from django_app import tasks as wrapper
    from django_app import wiring
    from django_app.models import Occurrence
    from django_app.relay.burst import BurstRelay

    app = Celery("bench", set_as_current=True)
    shared_task(name=TASK)(noop)
    app.finalize()
    due = datetime.now(UTC).replace(second=0, microsecond=0) + timedelta(minutes=10)
    items = [
        {"name": f"job {i}", "task": TASK, "cron": f"{due.minute} * * * *", "kwargs": {"n": i}}
        for i in range(n)
    ]
    phases = [
        meter.measure(
            "create (api.create_schedules)",
            n,
            lambda: [api.create_schedules(items[s : s + 5_000]) for s in range(0, n, 5_000)],
        )
    ]
    clock = FrozenClock(due - timedelta(seconds=60))
    phases.append(
        meter.measure("plan (the beat's materializer)", n,
                      lambda: wiring.materialize_due(clock=clock, node="bench"))
    )  # fmt: skip
    publisher = RecordingPublisher()
    summarize_brin_ranges()

    def publish() -> None:
        relay = BurstRelay(clock=clock, publisher=publisher, node="bench")
        clock.set(due - timedelta(seconds=5))
        while len(publisher.sent) < n and clock.now() < due + timedelta(minutes=2):
            relay.poll()
            while (at := relay.next_due_at()) is not None:
                clock.set(max(at, clock.now()))
                relay.publish_held()
            clock.advance(0.5)

    phases.append(meter.measure("publish (the burst relay)", n, publish))
    sent = [m.occurrence_id for m in publisher.sent]
    phases.append(
        meter.measure(
            "claim + complete (the worker wrapper)",
            len(sent),
            lambda: [
                wrapper.execute(
                    app, str(oid), TASK, [], {"n": 0}, worker_name="bench/1", clock=clock
                )
                for oid in sent
            ],
        )
    )
    states = Counter(Occurrence.objects.values_list("state", flat=True))
    print(f"occurrence states at the end: {dict(states)}; published {len(sent):,} of {n:,}")
    return phases


def noop(n: int = 0) -> dict[str, int]:
    return {"n": n}


if __name__ == "__main__":
    main()
