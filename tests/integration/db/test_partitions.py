"""PostgreSQL's partitioned history (django_app.db.partitions): slots created ahead on a
frozen clock, rows moved out of the default partition, retention by whole slots that never
drops what may still run, and a materialize / relay / claim race across midnight."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import IntegrityError, connection, transaction

from celery_scheduler.core import timeset
from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.core.enums import OccurrenceState as S
from celery_scheduler.core.ids import occurrence_id
from django_app.db import partitions
from django_app.models import (
    Attempt,
    Occurrence,
    OutboxEntry,
    PrunedHistory,
    Schedule,
    ScheduleCursor,
)
from django_app.operations.retention import record_pruned
from django_app.wiring import DjangoBackend
from tests.acceptance.support import database_url
from tests.integration.worker_support import make_schedule

pytestmark = [
    pytest.mark.skipif(
        os.environ.get("DATABASE_URL", "").split(":")[0] not in ("postgres", "postgresql"),
        reason="partitioned history is PostgreSQL's",
    ),
]
DAY = timedelta(days=1)
ROOT = Path(__file__).resolve().parents[3]


def where(table: str, **match: Any) -> list[str]:
    """The partitions holding the rows of ``table`` matching ``match`` (one column)."""
    ((column, value),) = match.items()
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT DISTINCT tableoid::regclass::text FROM {table} WHERE {column} = %s", [value]
        )
        return sorted(r[0] for r in cur.fetchall())


def slot_names(table: str) -> set[str]:
    return {p.name for p in partitions.partitions(table)}


def add(
    schedule: Schedule, at: datetime, state: S, *, sent: bool = True, manual: bool = True
) -> Occurrence:
    occ = Occurrence.objects.create(
        id=uuid.uuid4() if manual else occurrence_id(schedule.id, schedule.version, at),
        schedule=schedule, schedule_version=schedule.version, tenant_id=schedule.tenant_id,
        scheduled_for=at, available_at=at, state=state.value, manual=manual,
        finished_at=at if state in (S.SUCCEEDED, S.DEAD, S.CANCELED) else None,
    )  # fmt: skip
    OutboxEntry.objects.create(
        occurrence=occ, tenant_id=schedule.tenant_id, available_at=at,
        sent_at=at if sent else None,
    )  # fmt: skip
    Attempt.objects.create(occurrence=occ, number=1, fencing_token=1, started_at=at)
    return occ


def in_thread(call: Callable[[], Any], outcome: dict[str, Any]) -> threading.Thread:
    """Run ``call`` in a started thread on its own connection; its return value goes into
    ``outcome["result"]``, an exception it raises into ``outcome["error"]``."""

    def run() -> None:
        try:
            outcome["result"] = call()
        except Exception as exc:
            outcome["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def wait_for_a_lock_wait(observer: psycopg.Connection[Any], statement: str, what: str) -> None:
    """Until a statement starting with ``statement`` waits for a lock in this database."""
    deadline = time.monotonic() + 30
    while not observer.execute(
        "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND query LIKE %s",
        [statement + "%"],
    ).fetchone():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


@pytest.mark.django_db
def test_a_fresh_install_is_partitioned_with_the_key_in_every_unique_key() -> None:
    occ, att, out = partitions.tables()
    assert all(partitions.is_partitioned(t) for t in (occ, att, out))
    with connection.cursor() as cur:
        cur.execute(
            "SELECT conrelid::regclass::text, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = ANY(%s::regclass[]) AND contype IN ('p', 'u') ORDER BY 1, 2",
            [[occ, att, out]],
        )
        keys = cur.fetchall()
    assert keys
    assert all("scheduled_for" in d for _, d in keys), keys
    assert all(any(p.default for p in partitions.partitions(t)) for t in (occ, att, out))


@pytest.mark.django_db
def test_slots_are_created_ahead_on_a_frozen_clock_once(tenant: Any) -> None:
    clock = FrozenClock(datetime(2031, 5, 6, 22, 30, tzinfo=UTC))
    occ, att, out = partitions.tables()
    assert f"{occ}_p20310506" not in slot_names(occ)
    first = partitions.ensure(clock.now(), width=DAY, ahead=2)
    assert sorted(first.created) == sorted(
        f"{t}_p2031050{d}" for t in (occ, att, out) for d in (6, 7, 8)
    )
    assert partitions.ensure(clock.now(), width=DAY, ahead=2).created == []
    clock.advance(timedelta(hours=2))  # past midnight: one more slot, on every table
    assert sorted(partitions.ensure(clock.now(), width=DAY, ahead=2).created) == sorted(
        f"{t}_p20310509" for t in (occ, att, out)
    )
    s = make_schedule(tenant)
    row = add(s, datetime(2031, 5, 7, 23, 59, 59, 999999, tzinfo=UTC), S.SCHEDULED)
    assert where(occ, id=row.id) == [f"{occ}_p20310507"]
    assert where(out, occurrence_id=row.id) == [f"{out}_p20310507"]
    assert where(att, occurrence_id=row.id) == [f"{att}_p20310507"]


@pytest.mark.django_db
def test_the_beats_maintenance_creates_the_configured_slots(settings: Any) -> None:
    settings.CELERY_SCHEDULER = {"partition_width_hours": 6, "partitions_ahead": 1}
    done = DjangoBackend().maintain_partitions(datetime(2032, 2, 3, 7, 0, tzinfo=UTC))
    occ = partitions.tables()[0]
    assert {n for n in done if n.startswith(f"{occ}_p")} == {
        f"{occ}_p203202030600",
        f"{occ}_p203202031200",
    }


@pytest.mark.django_db
def test_the_beats_leave_what_can_wait_to_a_quiet_minute(settings: Any, tenant: Any) -> None:
    """Creating or detaching a slot locks the three parents: a beat's round does only what
    cannot wait (the current and the next slot) at a busy minute (the top of an hour, a
    quarter past, half past: the peaks of crons in every zone), and the rest (the slots
    further ahead, retention's drops) in the quiet window. Seen failing: every slot ahead
    and the expired one at 00:00:30, midnight's peak."""
    settings.CELERY_SCHEDULER = {
        "partition_width_hours": 24,
        "partitions_ahead": 3,
        "partition_retention_days": 7,
    }
    occ = partitions.tables()[0]
    old_slot(tenant)
    busy = datetime(2032, 3, 10, 0, 0, 30, tzinfo=UTC)
    done = set(DjangoBackend().maintain_partitions(busy))
    assert {n for n in done if n.startswith(f"{occ}_p")} == {
        f"{occ}_p20320310",
        f"{occ}_p20320311",
    }
    assert f"{occ}_p20250110" in slot_names(occ)

    quiet = busy.replace(minute=partitions.QUIET_MINUTES.start)
    done = set(DjangoBackend().maintain_partitions(quiet))
    assert {f"{occ}_p20320312", f"{occ}_p20320313", f"{occ}_p20250110"} <= done
    assert f"{occ}_p20250110" not in slot_names(occ)


@pytest.mark.django_db(transaction=True)
def test_a_second_process_skips_while_one_holds_the_maintenance_lock() -> None:
    now = datetime(2033, 8, 1, tzinfo=UTC)
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(%s)", [partitions.LOCK_KEY])
        out = run_python(
            "from datetime import datetime, timedelta\n"
            "from django_app.db import partitions\n"
            f"r = partitions.ensure(datetime.fromisoformat('{now.isoformat()}'), "
            "width=timedelta(days=1), ahead=1)\n"
            "print(r.locked, r.created)\n"
        )
    assert out.strip() == "False []"


@pytest.mark.django_db(transaction=True)
def test_a_command_waits_for_the_maintenance_lock_past_the_lock_timeout() -> None:
    """``wait=True`` (``manage.py partitions ensure|drop``) waits for a beat retiring a day
    however long it takes: the advisory lock was asked under ``lock_timeout``, so the
    command died with "lock timeout" while the beat still held it."""
    now = datetime(2033, 9, 1, tzinfo=UTC)
    code = (
        "from datetime import datetime, timedelta\n"
        "from django_app.db import partitions\n"
        f"r = partitions.ensure(datetime.fromisoformat('{now.isoformat()}'), "
        "width=timedelta(days=1), ahead=1, lock_timeout_ms=100, wait=True)\n"
        "print(r.locked, len(r.created) > 0)\n"
    )
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(%s)", [partitions.LOCK_KEY])
        child = subprocess.Popen(
            [sys.executable, "-c", "import django\ndjango.setup()\n" + code],
            cwd=ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while True:  # until the child waits for the advisory lock
            cur.execute("SELECT pg_stat_clear_snapshot()")  # a fresh view in this transaction
            cur.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND wait_event = 'advisory'"
            )
            if cur.fetchone()[0]:
                break
            assert time.monotonic() < deadline, "the child never waited for the lock"
            time.sleep(0.05)
        time.sleep(0.5)  # five times the child's lock_timeout, still holding the lock
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err[-3000:]
    assert out.strip() == "True True"


def analyzed_at(table: str) -> datetime | None:
    with connection.cursor() as cur:
        cur.execute("SELECT last_analyze FROM pg_stat_user_tables WHERE relname = %s", [table])
        row = cur.fetchone()
    return row[0] if row else None


def flush_statistics() -> None:
    """This backend's pending table counters, visible to the next statement (PostgreSQL 15+:
    they are flushed when the backend next goes idle)."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_stat_force_next_flush()")


@pytest.mark.django_db(transaction=True)
def test_a_slot_filling_up_is_analyzed_at_its_first_rows_and_again_once_it_doubles(
    tenant: Any,
) -> None:
    at = datetime(2034, 3, 1, 12, tzinfo=UTC)
    partitions.ensure(at, width=DAY, ahead=0)
    (slot,) = [
        p.name
        for p in partitions.partitions(Occurrence._meta.db_table)
        if p.start == at.replace(hour=0)
    ]
    schedule = make_schedule(tenant)
    for n in range(30):
        add(schedule, at + timedelta(seconds=n), S.SUCCEEDED)
    flush_statistics()
    # About this slot only: another test's slots may carry changes of their own (statistics
    # outlive the flush between transactional tests).
    assert slot not in partitions.analyze_grown(min_changes=50)  # 30 rows: not yet
    assert analyzed_at(slot) is None
    for n in range(30, 60):
        add(schedule, at + timedelta(seconds=n), S.SUCCEEDED)
    flush_statistics()
    first = partitions.analyze_grown(min_changes=50)
    assert slot in first  # 60 rows changed since never: analyzed
    assert analyzed_at(slot) is not None
    flush_statistics()
    assert slot not in partitions.analyze_grown(min_changes=50)  # nothing changed since
    for n in range(60, 80):
        add(schedule, at + timedelta(seconds=n), S.SUCCEEDED)
    flush_statistics()
    assert slot not in partitions.analyze_grown(min_changes=50)  # 20: not doubled yet
    for n in range(80, 120):
        add(schedule, at + timedelta(seconds=n), S.SUCCEEDED)
    flush_statistics()
    assert slot in partitions.analyze_grown(min_changes=50)  # 60 since, at 120 rows: doubled


def options(table: str) -> list[str] | None:
    """``table``'s storage parameters."""
    with connection.cursor() as cur:
        cur.execute("SELECT reloptions FROM pg_class WHERE oid = %s::regclass", [table])
        (found,) = cur.fetchone()
        return found


@pytest.mark.django_db
def test_rows_in_the_default_partition_move_into_their_new_slot(tenant: Any) -> None:
    occ, att, out = partitions.tables()
    s = make_schedule(tenant)
    at = datetime(2034, 1, 1, 12, tzinfo=UTC)
    rows = [add(s, at + timedelta(minutes=k), S.SUCCEEDED) for k in range(5)]
    assert where(occ, id=rows[0].id) == [f"{occ}_default"]
    report = partitions.ensure(at, width=DAY, ahead=0, wait=True)
    assert report.moved == 15  # five occurrences, five outbox rows, five attempts
    for r in rows:
        assert where(occ, id=r.id) == [f"{occ}_p20340101"]
        assert where(att, occurrence_id=r.id) == [f"{att}_p20340101"]
        assert where(out, occurrence_id=r.id) == [f"{out}_p20340101"]
    assert Occurrence.objects.filter(schedule=s).count() == 5
    # Built from the default partition's rows (CREATE ... LIKE), the outbox's slot leaves the
    # claim its room like every other one.
    assert options(f"{out}_p20340101") == [f"fillfactor={partitions.OUTBOX_FILLFACTOR}"]
    assert options(f"{occ}_p20340101") is None
    # The unique key still holds: the same fire time again is refused.
    with pytest.raises(IntegrityError), transaction.atomic():
        Occurrence.objects.create(
            id=uuid.uuid4(), schedule=s, schedule_version=rows[0].schedule_version,
            tenant_id=s.tenant_id, scheduled_for=rows[0].scheduled_for,
            available_at=rows[0].scheduled_for,
        )  # fmt: skip


# -- retention ---------------------------------------------------------------------------

OLD = datetime(2025, 1, 10, 12, tzinfo=UTC)  # before every slot the migration made
LATER = OLD + 30 * DAY


def old_slot(tenant: Any, *blockers: S) -> tuple[Schedule, list[Occurrence], list[Occurrence]]:
    partitions.ensure(OLD, width=DAY, ahead=0, wait=True)
    s = make_schedule(tenant)
    done = [add(s, OLD + timedelta(minutes=k), S.SUCCEEDED) for k in range(3)]
    kept = [add(s, OLD + timedelta(hours=1, minutes=k), st) for k, st in enumerate(blockers)]
    return s, done, kept


def counts(ids: list[uuid.UUID]) -> tuple[int, int, int]:
    return (
        Occurrence.objects.filter(id__in=ids).count(),
        Attempt.objects.filter(occurrence_id__in=ids).count(),
        OutboxEntry.objects.filter(occurrence_id__in=ids).count(),
    )


@pytest.mark.django_db
def test_a_slot_of_finished_rows_is_dropped_whole(tenant: Any) -> None:
    occ = partitions.tables()[0]
    _, done, _ = old_slot(tenant)
    report = partitions.drop_old(LATER, 7 * DAY, on_prune=record_pruned, wait=True)
    assert report.dropped == [f"{occ}_p20250110"]
    assert not report.refused
    assert report.rows == dict.fromkeys(partitions.tables(), 3)
    assert f"{occ}_p20250110" not in slot_names(occ)
    assert counts([o.id for o in done]) == (0, 0, 0)


@pytest.mark.django_db
def test_a_dropped_slot_keeps_for_backfill_the_times_that_ran_and_not_the_missed(
    tenant: Any,
) -> None:
    _, done, _ = old_slot(tenant)
    missed = add(done[0].schedule, OLD + timedelta(minutes=30), S.MISSED)
    report = partitions.drop_old(LATER, 7 * DAY, on_prune=record_pruned, wait=True)
    assert len(report.dropped) == 1
    pruned = PrunedHistory.objects.get(schedule_id=missed.schedule_id)
    assert (pruned.first, pruned.through) == (OLD, missed.scheduled_for)
    assert timeset.decode(pruned.ran) == [timeset.to_int(o.scheduled_for) for o in done]
    assert (pruned.backfilled, pruned.unknown_from) == ("", None)


@pytest.mark.django_db
@pytest.mark.parametrize("state", [S.RUNNING, S.SCHEDULED, S.RETRY_WAIT, S.DEAD])
def test_retention_never_drops_unfinished_or_dead_rows_unless_asked(tenant: Any, state: S) -> None:
    occ = partitions.tables()[0]
    _, done, kept = old_slot(tenant, state)
    report = partitions.drop_old(LATER, 7 * DAY, on_prune=record_pruned, wait=True)
    assert report.dropped == []
    assert report.refused[f"{occ}_p20250110"]["blocking"] == {state.value: 1}
    assert report.refused[f"{occ}_p20250110"]["occurrence_ids"] == [str(kept[0].id)]
    assert counts([o.id for o in done + kept]) == (4, 4, 4)
    if state is S.DEAD:  # asked: DEAD rows may go
        assert partitions.drop_old(
            LATER, 7 * DAY, on_prune=record_pruned, include_dead=True, wait=True
        ).dropped
        assert counts([kept[0].id]) == (0, 0, 0)


@pytest.mark.django_db
def test_move_keeps_the_blocking_rows_readable_in_the_default_partition(tenant: Any) -> None:
    occ, att, out = partitions.tables()
    _, done, kept = old_slot(tenant, S.RUNNING, S.DEAD)
    unsent = add(done[0].schedule, OLD + timedelta(hours=2), S.SUCCEEDED, sent=False)
    report = partitions.drop_old(LATER, 7 * DAY, on_prune=record_pruned, move=True, wait=True)
    assert report.dropped == [f"{occ}_p20250110"]
    assert report.moved == 3
    assert counts([o.id for o in done]) == (0, 0, 0)
    for row in [*kept, unsent]:
        assert where(occ, id=row.id) == [f"{occ}_default"]
        assert where(att, occurrence_id=row.id) == [f"{att}_default"]
        assert where(out, occurrence_id=row.id) == [f"{out}_default"]
    assert Occurrence.objects.get(id=kept[0].id).state == S.RUNNING.value


@pytest.mark.django_db
def test_a_skip_marker_ahead_of_the_cursor_blocks_and_force_drops_anyway(tenant: Any) -> None:
    occ = partitions.tables()[0]
    s, done, _ = old_slot(tenant)
    marker = add(s, OLD + timedelta(hours=3), S.CANCELED, manual=False)
    # The cursor (its own row) has not passed the marker.
    ScheduleCursor.objects.filter(pk=s.pk).update(next_run_at=OLD)
    report = partitions.drop_old(LATER, 7 * DAY, on_prune=record_pruned, wait=True)
    assert report.refused[f"{occ}_p20250110"]["blocking"] == {"AHEAD_OF_CURSOR": 1}
    forced = partitions.drop_old(LATER, 7 * DAY, on_prune=record_pruned, force=True, wait=True)
    assert forced.dropped == [f"{occ}_p20250110"]
    assert forced.forced == 1
    assert counts([marker.id, *(o.id for o in done)]) == (0, 0, 0)


@pytest.mark.django_db
def test_dry_run_drops_nothing(tenant: Any) -> None:
    occ = partitions.tables()[0]
    old_slot(tenant)
    report = partitions.drop_old(LATER, 7 * DAY, on_prune=record_pruned, dry_run=True)
    assert report.dropped == [f"{occ}_p20250110"]
    assert f"{occ}_p20250110" in slot_names(occ)


@pytest.mark.django_db
def test_the_blocking_probes_read_indexes_not_the_slot(tenant: Any) -> None:
    """An expired slot holds a day of rows and a handful that block: each probe must have
    an index path (with sequential scans priced out, no plan falls back to one). Seen
    failing with the one statement of ORed subqueries this replaced: a scan of the slot."""
    occ, _, out = partitions.tables()
    old_slot(tenant, S.DEAD)
    slot = f"{occ}_p20250110"
    span = {"start": OLD.replace(hour=0), "end": OLD.replace(hour=0) + DAY}
    waiting = ("SCHEDULED", "ENQUEUED", "RUNNING", "RETRY_WAIT", "DEAD")
    with connection.cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off")
        for why, probe in partitions.sql.blocking_probes(slot, f"{out}_p20250110", waiting).items():
            cur.execute("EXPLAIN " + probe, span)
            plan = "\n".join(r[0] for r in cur.fetchall())
            assert "Seq Scan" not in plan, (why, plan)


def probe_write(probe: psycopg.Connection[Any], row: Occurrence) -> str:
    """An update of ``row`` from another session, given up after 300 ms of waiting."""
    occ = partitions.tables()[0]
    try:
        with probe.transaction():
            probe.execute("SET LOCAL lock_timeout = '300ms'")
            probe.execute(
                f"UPDATE {occ} SET reason = 'probe' WHERE id = %s AND scheduled_for = %s",
                [row.id, row.scheduled_for],
            )
    except psycopg.errors.LockNotAvailable:
        return "waited"
    return "written"


def probe_lock(probe: psycopg.Connection[Any], table: str) -> str:
    """ROW EXCLUSIVE on ``table`` from another session: what a worker's claim on a generic
    plan takes on every partition of the history when it starts (PostgreSQL before 17)."""
    try:
        with probe.transaction():
            probe.execute(f"LOCK TABLE {table} IN ROW EXCLUSIVE MODE NOWAIT")
    except psycopg.errors.LockNotAvailable:
        return "waited"
    return "granted"


@pytest.mark.django_db(transaction=True)
def test_retirement_bookkeeping_holds_no_lock_the_run_path_takes(tenant: Any) -> None:
    """The bookkeeping reads a whole day of rows: a warm worker, whose claim locks every
    partition (expired slots too) on its generic plan, must not wait for it, nor must a
    writer of another slot. Seen failing when the bookkeeping ran under the slot's SHARE
    lock (the expired slot's lock: waited)."""
    occ = partitions.tables()[0]
    s, done, _ = old_slot(tenant)
    live_at = LATER - 2 * DAY
    partitions.ensure(live_at, width=DAY, ahead=0, wait=True)
    live = add(s, live_at, S.RUNNING)
    seen: list[dict[str, str]] = []

    def bookkeeping(rows: Any) -> None:
        record_pruned(rows)
        with psycopg.connect(database_url(), autocommit=True) as probe:
            seen.append(
                {
                    "other slot": probe_write(probe, live),
                    "expired slot's lock": probe_lock(probe, f"{occ}_p20250110"),
                }
            )

    report = partitions.drop_old(LATER, 7 * DAY, on_prune=bookkeeping, wait=True)
    assert report.dropped == [f"{occ}_p20250110"]
    assert seen == [{"other slot": "written", "expired slot's lock": "granted"}]
    assert Occurrence.objects.get(id=live.id).reason == "probe"
    assert counts([o.id for o in done]) == (0, 0, 0)


@pytest.mark.django_db(transaction=True)
def test_a_row_written_in_the_slot_during_the_bookkeeping_has_it_done_again_locked(
    tenant: Any,
) -> None:
    """What is read is what goes: a row of the expired slot written while the bookkeeping
    read the slot (unlocked) sends the bookkeeping back, under the slot's SHARE lock (its
    writers wait then), and only that second one is kept."""
    occ = partitions.tables()[0]
    _, done, _ = old_slot(tenant)
    seen: list[str] = []

    def bookkeeping(rows: Any) -> None:
        record_pruned(rows)
        with psycopg.connect(database_url(), autocommit=True) as probe:
            seen.append(probe_write(probe, done[0]))

    report = partitions.drop_old(LATER, 7 * DAY, on_prune=bookkeeping, wait=True)
    assert report.dropped == [f"{occ}_p20250110"]
    assert seen == ["written", "waited"]
    assert counts([o.id for o in done]) == (0, 0, 0)
    history = PrunedHistory.objects.get(schedule_id=done[0].schedule_id)
    assert timeset.decode(history.ran) == [timeset.to_int(o.scheduled_for) for o in done]


@pytest.mark.django_db(transaction=True)
def test_a_round_killed_after_the_detach_leaves_tables_that_the_next_round_drops(
    tenant: Any,
) -> None:
    """The slot's tables are dropped after the detach commits (the drop's commit unlinks a
    day of files; the parents' lock is not held through it). SIGKILL in between: no reader
    sees the slot's rows, the bookkeeping committed with the detach, and the next round
    drops the tables left behind."""
    s, done, _ = old_slot(tenant)
    env = {**child_env(), "CELERY_SCHEDULER_FAULT": "partitions.after_detach"}
    killed = subprocess.run(
        [sys.executable, "-c", "import django\ndjango.setup()\n"
         "from datetime import datetime, timedelta\n"
         "from django_app.db import partitions\n"
         "from django_app.operations.retention import record_pruned\n"
         f"partitions.drop_old(datetime.fromisoformat({LATER.isoformat()!r}), "
         "timedelta(days=7), on_prune=record_pruned, wait=True)\n"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert killed.returncode == -9, killed.stderr[-3000:]
    slot = [f"{table}_p20250110" for table in partitions.tables()]

    def left() -> list[str]:
        with connection.cursor() as cur:
            cur.execute("SELECT relname FROM pg_class WHERE relname = ANY(%s)", [slot])
            return sorted(r[0] for r in cur.fetchall())

    assert left() == sorted(slot)
    assert not any(
        name in slot_names(table) for table, name in zip(partitions.tables(), slot, strict=True)
    )
    assert counts([o.id for o in done]) == (0, 0, 0)
    assert PrunedHistory.objects.filter(schedule_id=s.pk).exists()
    assert partitions.drop_old(LATER, 7 * DAY, on_prune=record_pruned, wait=True).dropped == []
    assert left() == []


@pytest.mark.django_db(transaction=True)
def test_a_detached_table_another_round_drops_first_is_skipped() -> None:
    """Two beats' rounds may both find a detached table (one detached it and is dropping
    it, the other sweeps): the one that waited for the table's lock finds it gone and goes
    on. Seen failing with the drop's 'relation does not exist' raised."""
    orphan = f"{partitions.tables()[0]}_p20250111"
    with connection.cursor() as cur:
        cur.execute(f"CREATE TABLE {orphan} (id int)")
    outcome: dict[str, Any] = {}

    def sweep() -> Any:
        return partitions.drop_detached(lock_timeout_ms=30_000)

    with (
        psycopg.connect(database_url()) as other_round,
        psycopg.connect(database_url(), autocommit=True) as observer,
    ):
        other_round.execute(f"LOCK TABLE {orphan} IN ACCESS EXCLUSIVE MODE")
        sweeper = in_thread(sweep, outcome)
        wait_for_a_lock_wait(observer, "TRUNCATE", "the sweep never waited for the table's lock")
        other_round.execute(f"DROP TABLE {orphan}")
        other_round.commit()
    sweeper.join(timeout=60)
    assert "error" not in outcome, outcome.get("error")
    assert outcome["result"] == [orphan]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("width", [timedelta(days=1), timedelta(hours=6)])
def test_a_detached_table_of_any_slot_width_is_swept(width: timedelta) -> None:
    """What a round left detached is found by its name, daily or narrower slots alike
    (a 6-hour slot's name carries the hour and minute). Seen failing for 6 hours: the
    sweep's pattern knew 8 and 10 digits, the names have 12."""
    start = (
        datetime(2025, 1, 11, 6, tzinfo=UTC) if width < DAY else datetime(2025, 1, 11, tzinfo=UTC)
    )
    orphan = partitions.slot_name(partitions.tables()[0], start, width)
    with connection.cursor() as cur:
        cur.execute(f"CREATE TABLE {orphan} (id int)")
    assert partitions.drop_detached(lock_timeout_ms=30_000) == [orphan]


# -- a race across midnight, real processes ---------------------------------------------


def child_env() -> dict[str, str]:
    params = connection.settings_dict
    url = f"postgres://{params.get('USER') or 'postgres'}@{params['HOST'] or '127.0.0.1'}"
    url += f":{params['PORT'] or 5432}/{params['NAME']}"
    env = {k: v for k, v in os.environ.items() if k != "CELERY_SCHEDULER_FAULT"}
    env.update(DATABASE_URL=url, DJANGO_SETTINGS_MODULE="example_project.settings")
    return env


def run_python(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", "import django\ndjango.setup()\n" + code],
        cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


# Each child runs the same simulated timeline: 10 simulated seconds per real second.
TIMELINE = """
import json, sys, time
from datetime import datetime, timedelta
import django
django.setup()
from celery_scheduler.core import timeset
from celery_scheduler.core.clock import FrozenClock
START = datetime.fromisoformat(sys.argv[1])
END = datetime.fromisoformat(sys.argv[2])
t0 = time.monotonic()
clock = FrozenClock(START)
def tick():
    clock.set(START + timedelta(seconds=(time.monotonic() - t0) * 10))
    return clock.now()
"""

MATERIALIZER = (
    TIMELINE
    + """
from django_app.db import partitions
from django_app.wiring import materialize_due
made = ensured = 0
midnight = END.replace(hour=0, minute=0, second=0)
while tick() < END:
    made += materialize_due(clock=clock, horizon=timedelta(seconds=5), node="m").occurrences_created
    if not ensured and clock.now() >= midnight:
        # The first slots appear mid-race: the rows already written move out of the
        # default partition while the relay and the workers use them.
        ensured = len(partitions.ensure(clock.now(), width=timedelta(days=1), ahead=1,
                                        behind=1, wait=True).created)
print(json.dumps({"created": made, "slots": ensured}))
"""
)

RELAY = (
    TIMELINE
    + """
from celery_scheduler.publishers import RecordingPublisher
from django_app.relay.batch import relay_due
publisher = RecordingPublisher()
while tick() < END:
    relay_due(clock=clock, publisher=publisher, node="r")
print(json.dumps([m.occurrence_id for m in publisher.sent], default=str))
"""
)

WORKER = (
    TIMELINE
    + """
from django_app.models import Occurrence
from django_app.worker import claim, finish
outcomes = {}
while tick() < END:
    ids = list(Occurrence.objects.filter(state="ENQUEUED").order_by("?")
               .values_list("id", flat=True)[:10])
    for oid in ids:
        r = claim.claim(oid, worker=sys.argv[3], clock=clock, lease=timedelta(minutes=5))
        outcomes[r.outcome.value] = outcomes.get(r.outcome.value, 0) + 1
        if r.outcome.value == "CLAIMED":
            finish.complete(oid, r.fencing_token, {"ok": 1}, clock=clock)
print(json.dumps(outcomes))
"""
)


@pytest.mark.concurrent_db
@pytest.mark.django_db(transaction=True)
def test_materialize_relay_and_claims_race_across_midnight_without_duplicate_or_loss(
    tenant: Any,
) -> None:
    occ, att, out = partitions.tables()
    start = datetime(2031, 6, 30, 23, 58, 30, tzinfo=UTC)
    stop = datetime(2031, 7, 1, 0, 1, 30, tzinfo=UTC)
    # Slots are DDL: a flush keeps them. Start without the three days' slots (a rerun).
    first = datetime(2031, 6, 30, tzinfo=UTC)
    with connection.cursor() as cur:
        for table in (occ, att, out):
            for part in partitions.partitions(table):
                if part.start is not None and first <= part.start < first + 3 * DAY:
                    cur.execute(f"DROP TABLE {part.name}")
    schedules = [
        make_schedule(tenant, next_run_at=start + timedelta(seconds=30)) for _ in range(60)
    ]
    args = [start.isoformat()]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, *args, end.isoformat(), *extra],
            cwd=ROOT,
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for code, end, extra in [
            (MATERIALIZER, stop, []),
            (RELAY, stop + timedelta(seconds=30), []),
            (WORKER, stop + timedelta(seconds=60), ["w1"]),
            (WORKER, stop + timedelta(seconds=60), ["w2"]),
        ]
    ]
    results = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=180)
        assert p.returncode == 0, stderr[-3000:]
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    made, published, *workers = results
    assert made["slots"] == 9  # 06-30, 07-01 and 07-02 on three tables
    rows = list(Occurrence.objects.filter(schedule__in=schedules).values_list("id", "state"))
    fire_times = [start.replace(second=0) + timedelta(minutes=k) for k in range(1, 4)]
    # Every schedule fired at 23:59, 00:00 and 00:01, once each, on both sides of midnight.
    assert len(rows) == made["created"] == len(schedules) * len(fire_times)
    expected = {occurrence_id(s.id, s.version, t) for s in schedules for t in fire_times}
    assert {r[0] for r in rows} == expected
    assert {r[1] for r in rows} == {S.SUCCEEDED.value}
    assert sorted(published) == sorted(str(i) for i in expected)  # each published once
    claimed = sum(w.get("CLAIMED", 0) for w in workers)
    assert claimed == len(expected)
    assert Attempt.objects.filter(occurrence_id__in=expected).count() == len(expected)
    assert OutboxEntry.objects.filter(
        occurrence_id__in=expected, sent_at__isnull=False
    ).count() == (len(expected))
    # ...and every row sits in the slot of its own day, none left in a default partition.
    for table, column in ((occ, "id"), (att, "occurrence_id"), (out, "occurrence_id")):
        with connection.cursor() as cur:
            cur.execute(
                f"SELECT tableoid::regclass::text, count(*) FROM {table} "
                f"WHERE {column} = ANY(%s) GROUP BY 1 ORDER BY 1",
                [list(expected)],
            )
            assert cur.fetchall() == [
                (f"{table}_p20310630", len(schedules)),
                (f"{table}_p20310701", 2 * len(schedules)),
            ]


@pytest.mark.concurrent_db
@pytest.mark.django_db(transaction=True)
def test_a_lock_cycle_with_the_run_path_is_broken_by_maintenance_yielding() -> None:
    """The run path holds the attempt table and then asks for the occurrence table, which
    the slot creation took first (the relay and the claim have no one order over the three).
    Maintenance gives up its try before PostgreSQL's deadlock check, the run path goes on,
    and the next try creates the slots. Seen failing with one lock statement per table and
    the 2 s lock_timeout: the deadlock check ended the slot creation with an error."""
    occ, att, _ = partitions.tables()
    day = datetime(2037, 1, 1, tzinfo=UTC)
    with connection.cursor() as cur:
        for table in partitions.tables():
            for part in partitions.partitions(table):
                if part.start == day:
                    cur.execute(f"DROP TABLE {part.name}")
    outcome: dict[str, Any] = {}

    def maintain() -> Any:
        return partitions.ensure(day, width=DAY, ahead=0, wait=True).created

    with (
        psycopg.connect(database_url()) as run_path,
        psycopg.connect(database_url(), autocommit=True) as observer,
    ):
        run_path.execute(f"SELECT 1 FROM {att} LIMIT 1")  # holds the attempt parent
        maintenance = in_thread(maintain, outcome)
        wait_for_a_lock_wait(observer, "LOCK TABLE", "the slot creation never waited for a lock")
        # Closes the cycle: waits for the occurrence lock the slot creation holds.
        run_path.execute(f"SELECT 1 FROM {occ} LIMIT 1")
        run_path.commit()
    maintenance.join(timeout=60)
    assert "error" not in outcome, outcome.get("error")
    assert sorted(outcome["result"]) == sorted(
        partitions.slot_name(table, day, DAY) for table in partitions.tables()
    )


# -- converting a populated install ------------------------------------------------------


def seed_plain(schedule: Schedule, now: datetime, n: int) -> None:
    """``n`` occurrences over the last days, a few far ahead, each with an attempt and an
    outbox row written before the key existed (``scheduled_for`` NULL on them)."""
    occ, att, out = partitions.tables()
    with connection.cursor() as cur:
        cur.execute(
            f"INSERT INTO {occ} (id, schedule_id, schedule_version, tenant_id, scheduled_for, "
            "available_at, state, manual, overlap_policy, attempt_count, fencing_token, "
            "lease_owner, created_at, last_error, reason) "
            "SELECT gen_random_uuid(), %s, 1, %s, t, t, "
            "CASE WHEN g %% 50 = 0 THEN 'DEAD' ELSE 'SUCCEEDED' END, true, '', 1, 1, '', t, '', '' "
            "FROM generate_series(1, %s) g, "
            "LATERAL (SELECT %s::timestamptz - g * interval '37 seconds' "
            "  + CASE WHEN g %% 100 = 0 THEN interval '400 days' ELSE interval '0' END AS t) x",
            [schedule.pk, schedule.tenant_id, n, now],
        )
        cur.execute(
            f"INSERT INTO {att} (occurrence_id, number, fencing_token, worker, started_at, "
            f"outcome, error) SELECT id, 1, 1, 'w', scheduled_for, 'SUCCEEDED', '' FROM {occ}"
        )
        cur.execute(
            f"INSERT INTO {out} (occurrence_id, tenant_id, shard, available_at, priority, "
            f"sent_at, publish_count, claimed_by, created_at) SELECT id, tenant_id, 0, "
            f"scheduled_for, 0, scheduled_for, 1, '', scheduled_for FROM {occ}"
        )


@contextmanager
def plain_tables() -> Iterator[tuple[str, str, str]]:
    """The history tables as a populated install's migration 0020 leaves them (plain, no
    partition), given back empty and partitioned, as the migration made them, afterwards."""
    occ, att, out = partitions.tables()
    assert partitions.unpartition_empty_tables() == [occ, att, out]
    try:
        yield occ, att, out
    finally:
        with connection.cursor() as cur:
            for table in (occ, att, out):
                cur.execute(f"TRUNCATE {table}")
        partitions.partition_empty_tables(datetime.now(UTC), width=DAY, ahead=3)


@pytest.mark.django_db(transaction=True)
def test_the_key_backfill_waits_for_rows_others_hold_locked(tenant: Any) -> None:
    """The conversion copies the key in batches that skip locked rows; when only rows a
    relay or a worker held were left, a batch found none and the loop ended, and the
    orphans' fallback gave those rows a key from their own created_at: not their
    occurrence's time (here an hour off), so lookups by key missed them from then on."""
    from django_app.db import convert

    now = datetime.now(UTC)
    with plain_tables() as (occ, _att, out):
        seed_plain(make_schedule(tenant), now, 60)
        held = list(OutboxEntry.objects.order_by("id").values_list("id", flat=True)[:5])
        OutboxEntry.objects.filter(id__in=held).update(created_at=now - timedelta(hours=1))
        locked, release = threading.Event(), threading.Event()

        def hold() -> None:
            with transaction.atomic():
                list(OutboxEntry.objects.filter(id__in=held).select_for_update())
                locked.set()
                assert release.wait(timeout=30)
            connection.close()

        holder = threading.Thread(target=hold)
        holder.start()
        assert locked.wait(timeout=30)
        done: dict[str, int] = {}

        def backfill() -> None:
            done["rows"] = convert._backfill(out, occ, 10)
            connection.close()

        worker = threading.Thread(target=backfill)
        worker.start()
        deadline = time.monotonic() + 30
        with connection.cursor() as cur:
            while worker.is_alive() and time.monotonic() < deadline:
                cur.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock' AND query LIKE 'UPDATE%%'"
                )
                if cur.fetchone()[0]:
                    break
                time.sleep(0.05)
        release.set()
        holder.join(timeout=30)
        worker.join(timeout=30)
        assert done["rows"] == 60
        with connection.cursor() as cur:
            cur.execute(
                f"SELECT count(*) FROM {out} b JOIN {occ} o ON o.id = b.occurrence_id "
                "WHERE b.scheduled_for IS DISTINCT FROM o.scheduled_for"
            )
            assert cur.fetchone() == (0,)


@pytest.mark.django_db(transaction=True)
def test_a_dead_run_from_before_the_key_is_replayed_on_an_unconverted_install(
    tenant: Any,
) -> None:
    """Migration 0020 leaves a populated PostgreSQL install's tables plain with the key of
    the old attempt and outbox rows empty (until `partitions convert`): the replay's outbox
    update by key found nothing, and the insert of a second row for the occurrence broke
    the outbox's unique key (IntegrityError)."""
    from celery_scheduler import api

    with plain_tables():
        seed_plain(make_schedule(tenant), datetime.now(UTC), 100)
        dead = Occurrence.objects.filter(state=S.DEAD).order_by("scheduled_for").first()
        assert dead is not None
        replayed = api.replay_occurrence(dead.id)
        assert replayed.state == S.ENQUEUED
        entry = OutboxEntry.objects.get(occurrence_id=dead.id)
        assert (entry.sent_at, entry.scheduled_for) == (None, dead.scheduled_for)


@contextmanager
def converted_afterwards(now: datetime) -> Iterator[None]:
    """The three tables made plain for the body; afterwards, whatever a conversion left,
    the test database as the migration made it (empty partitioned tables)."""
    occ, att, out = partitions.tables()
    assert partitions.unpartition_empty_tables() == [occ, att, out]
    try:
        yield
    finally:
        with connection.cursor() as cur:
            for table in (occ, att, out):
                cur.execute(f"DROP TABLE IF EXISTS {table}__future")
                cur.execute(f"TRUNCATE {table}")
                cur.execute(f"ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {table}_history_range")
                cur.execute(
                    "SELECT i.relname FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
                    "WHERE x.indrelid = %s::regclass AND i.relname LIKE %s",
                    [table, "%\\_k"],
                )
                for (name,) in cur.fetchall():  # a conversion's prebuilt keys, left behind
                    cur.execute(f"DROP INDEX {name}")
        if partitions.is_partitioned():
            partitions.unpartition_empty_tables()
        partitions.partition_empty_tables(now, width=DAY, ahead=3)


@pytest.mark.django_db(transaction=True)
def test_a_populated_install_is_converted_and_keeps_every_row(tenant: Any) -> None:
    from django.core.management import call_command

    occ, att, out = partitions.tables()
    now = datetime.now(UTC)
    with converted_afterwards(now):
        schedule = make_schedule(tenant)
        seed_plain(schedule, now, 5000)
        with connection.cursor() as cur:
            cur.execute(f"SELECT id, scheduled_for, state FROM {occ} ORDER BY id")
            before = cur.fetchall()
        stdout = StringIO()
        call_command("partitions", "convert", "--batch", "700", "--json", stdout=stdout)
        report = json.loads(stdout.getvalue())
        assert report["converted"] == [occ, att, out]
        assert report["backfilled"] == {att: 5000, out: 5000}
        assert report["set_aside"] == {occ: 50, att: 50, out: 50}  # the far-future rows
        assert report["seconds"]["lock_held"] < 5
        assert all(partitions.is_partitioned(t) for t in (occ, att, out))
        with connection.cursor() as cur:
            cur.execute(f"SELECT id, scheduled_for, state FROM {occ} ORDER BY id")
            assert cur.fetchall() == before
            cur.execute(f"SELECT count(*) FROM {att} WHERE scheduled_for IS NULL")
            assert cur.fetchone() == (0,)
            # The past is the history partition, the far future the default one.
            cur.execute(f"SELECT tableoid::regclass::text, count(*) FROM {occ} GROUP BY 1")
            assert dict(cur.fetchall()) == {f"{occ}__history": 4950, f"{occ}_default": 50}
        # The outbox's new partitions leave the claim its room; the other tables' do not.
        room = [f"fillfactor={partitions.OUTBOX_FILLFACTOR}"]
        first_slot = partitions.slot_name(out, datetime.fromisoformat(report["boundary"]), DAY)
        assert (options(f"{out}_default"), options(first_slot)) == (room, room)
        assert options(f"{occ}_default") is None
        assert options(f"{att}_default") is None
        # The scheduler writes on: today's rows into the history partition (it covers up to
        # the boundary, two days ahead), later ones into their slots; keys still unique.
        assert where(occ, id=add(schedule, now, S.SCHEDULED).id) == [f"{occ}__history"]
        later = now + 3 * DAY
        row = add(schedule, later, S.SCHEDULED)
        day = later.replace(hour=0, minute=0, second=0, microsecond=0)
        assert where(occ, id=row.id) == [partitions.slot_name(occ, day, DAY)]
        with pytest.raises(IntegrityError), transaction.atomic():
            Occurrence.objects.create(
                id=row.id, schedule=schedule, schedule_version=1, tenant_id=schedule.tenant_id,
                scheduled_for=row.scheduled_for, available_at=row.scheduled_for,
            )  # fmt: skip
        # The old rows are still found by id, through the parent.
        assert Occurrence.objects.filter(id=before[0][0]).count() == 1
        assert OutboxEntry.objects.filter(occurrence_id=before[0][0]).count() == 1


def rows_of(*tables: str) -> dict[str, list[tuple[Any, ...]]]:
    with connection.cursor() as cur:
        found = {}
        for table in tables:
            cur.execute(f"SELECT * FROM {table} ORDER BY 1")
            found[table] = cur.fetchall()
        return found


class Interrupted(BaseException):
    """What Ctrl-C or a killed session leaves: no except clause of the code handles it."""


@pytest.mark.django_db(transaction=True)
def test_a_conversion_interrupted_before_its_swap_runs_again_to_the_end(
    tenant: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C in the checks' VALIDATE leaves the NOT VALID checks, the far-future rows set
    aside and the prebuilt unique indexes (one of them INVALID, as a killed concurrent build
    leaves it): the next `partitions convert` picks those up and finishes, every row kept,
    and the partitioned tables carry none of the leftovers."""
    from django.core.management import call_command

    from django_app.db import convert, queries

    occ, att, out = partitions.tables()
    now = datetime.now(UTC)
    with converted_afterwards(now):
        seed_plain(make_schedule(tenant), now, 2000)
        before = rows_of(occ)

        def interrupt(table: str, name: str) -> str:
            raise Interrupted

        monkeypatch.setattr(queries, "validate_constraint", interrupt)
        with pytest.raises(Interrupted):
            convert.convert(now, width=DAY, ahead=3, batch=500)
        monkeypatch.undo()
        with connection.cursor() as cur:
            cur.execute(f"SELECT count(*) FROM {occ}__future")
            assert cur.fetchone() == (20,)  # set aside, out of sight of the plain table
            cur.execute(
                "UPDATE pg_index SET indisvalid = false WHERE indexrelid = "
                f"'{occ}_pkey_k'::regclass"
            )
        stdout = StringIO()
        call_command("partitions", "convert", "--batch", "500", "--json", stdout=stdout)
        assert json.loads(stdout.getvalue())["converted"] == [occ, att, out]
        assert rows_of(occ) == before
        with connection.cursor() as cur:
            cur.execute(
                "SELECT conrelid::regclass::text, conname FROM pg_constraint WHERE conname LIKE %s",
                ["%history_range"],
            )
            assert cur.fetchall() == []
            cur.execute("SELECT relname FROM pg_class WHERE relname LIKE %s", ["django_app%\\_k"])
            assert cur.fetchall() == []
            cur.execute(f"SELECT to_regclass('{occ}__future')")
            assert cur.fetchone() == (None,)
        # A far-future time is written through the new parent like any other.
        later = add(make_schedule(tenant), now + 400 * DAY, S.SCHEDULED)
        assert where(occ, id=later.id) == [f"{occ}_default"]


@pytest.mark.django_db(transaction=True)
def test_a_first_conversion_asks_for_no_exclusive_lock_to_take_back_leftovers() -> None:
    """Taking back an interrupted run's leftovers drops checks: a first run has none, and
    must not ask for ACCESS EXCLUSIVE on the busy tables anyway (DROP CONSTRAINT IF EXISTS
    does), where every claim and relay would queue behind the request. Seen failing: the
    request waited, unbounded, behind a writer's open transaction."""
    from django_app.db import convert

    occ, att, out = partitions.tables()
    with converted_afterwards(datetime.now(UTC)), psycopg.connect(database_url()) as writer:
        writer.execute(f"LOCK TABLE {occ} IN ROW EXCLUSIVE MODE")  # a claim, mid-transaction
        outcome: dict[str, Any] = {}
        taking_back = in_thread(lambda: convert._take_back([occ, att, out], 5000), outcome)
        taking_back.join(3)
        waits = writer.execute(
            "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = %s::regclass",
            [occ],
        ).fetchone()
        writer.rollback()
        taking_back.join(10)
        assert waits == (0,)
        assert not taking_back.is_alive()
        assert "error" not in outcome, outcome


@pytest.mark.django_db(transaction=True)
def test_a_second_conversion_while_one_runs_is_refused() -> None:
    """A second run would take the first's checks and set-aside rows for an interrupted
    run's leftovers and undo them under its feet."""
    from django.core.management import CommandError, call_command

    from django_app.db import convert

    with (
        converted_afterwards(datetime.now(UTC)),
        psycopg.connect(database_url(), autocommit=True) as other,
    ):
        other.execute("SELECT pg_advisory_lock(%s)", [convert.CONVERT_LOCK_KEY])
        with pytest.raises(CommandError, match="another `partitions convert` is running"):
            call_command("partitions", "convert", stdout=StringIO())
        assert not partitions.is_partitioned()
        other.execute("SELECT pg_advisory_unlock(%s)", [convert.CONVERT_LOCK_KEY])
        call_command("partitions", "convert", "--json", stdout=StringIO())
        assert partitions.is_partitioned()


@pytest.mark.django_db(transaction=True)
def test_rows_set_aside_by_a_conversion_interrupted_after_its_swap_come_back(
    tenant: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Interrupted between the swap's commit and the set-aside rows' return, the tables are
    partitioned and the far-future rows wait in their holding tables: the next run puts
    them back instead of saying "already partitioned" and leaving them out of sight."""
    from django.core.management import call_command

    from django_app.db import convert, queries

    occ, att, out = partitions.tables()
    now = datetime.now(UTC)
    with converted_afterwards(now):
        seed_plain(make_schedule(tenant), now, 2000)
        before = rows_of(occ)

        def interrupt(target: str, hold: str, columns: list[str]) -> str:
            raise Interrupted

        monkeypatch.setattr(queries, "route_back", interrupt)
        with pytest.raises(Interrupted):
            convert.convert(now, width=DAY, ahead=3, batch=500)
        monkeypatch.undo()
        assert partitions.is_partitioned()
        assert len(rows_of(occ)[occ]) == 2000 - 20
        call_command("partitions", "convert", "--json", stdout=StringIO())
        assert rows_of(occ) == before
        assert [len(rows) for rows in rows_of(att, out).values()] == [2000, 2000]
        with connection.cursor() as cur:
            cur.execute(f"SELECT to_regclass('{occ}__future')")
            assert cur.fetchone() == (None,)
