"""prune_occurrences: what is deleted, what is kept, batches, dry run, idempotency records."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import IntegrityError, connection
from django.test.utils import CaptureQueriesContext

from celery_scheduler import errors
from celery_scheduler.core.clock import SYSTEM_CLOCK
from celery_scheduler.core.enums import OccurrenceState as S
from django_app.models import (
    Attempt,
    IdempotencyRecord,
    Occurrence,
    OutboxEntry,
    Schedule,
    ScheduleVersion,
    Tenant,
)
from django_app.operations import retention
from tests.integration.worker_support import make_schedule

DAY = timedelta(days=1)
TERMINAL = [S.SUCCEEDED, S.MISSED, S.CANCELED, S.SKIPPED_OVERLAP]
NON_TERMINAL = [S.SCHEDULED, S.ENQUEUED, S.RUNNING, S.RETRY_WAIT]
pytestmark = pytest.mark.django_db


def ago(days: float) -> datetime:
    return SYSTEM_CLOCK.now() - days * DAY


def add(
    schedule: Schedule,
    state: S,
    *,
    due_days_ago: float,
    finished_days_ago: float | None = None,
    outbox: str | None = "sent",
    attempts: int = 2,
) -> Occurrence:
    """An occurrence with ``attempts`` Attempt rows and an outbox row (sent/unsent/none)."""
    due = ago(due_days_ago)
    occ = Occurrence.objects.create(
        id=uuid.uuid4(),
        schedule=schedule,
        schedule_version=1,
        tenant_id=schedule.tenant_id,
        scheduled_for=due,
        available_at=due,
        state=state.value,
        finished_at=None if finished_days_ago is None else ago(finished_days_ago),
    )
    for n in range(1, attempts + 1):
        Attempt.objects.create(occurrence=occ, number=n, fencing_token=n, started_at=due)
    if outbox is not None:
        OutboxEntry.objects.create(
            occurrence=occ,
            tenant_id=schedule.tenant_id,
            available_at=due,
            sent_at=due if outbox == "sent" else None,
        )
    return occ


def run(*args: str) -> dict[str, Any]:
    out = StringIO()
    call_command("prune_occurrences", *args, "--json", stdout=out)
    return json.loads(out.getvalue())


def surviving(occs: list[Occurrence]) -> set[str]:
    ids = Occurrence.objects.filter(id__in=[o.id for o in occs]).values_list("id", flat=True)
    return {str(i) for i in ids}


@pytest.fixture
def schedule(tenant: Tenant) -> Schedule:
    return make_schedule(tenant)


def every_state(schedule: Schedule) -> tuple[dict[S, Occurrence], dict[S, Occurrence]]:
    """For each state: one that finished 40 days ago and one that finished yesterday.

    Non-terminal ones have no finished_at, so only their (old) scheduled_for can age them.
    """
    old, recent = {}, {}
    for state in S:
        finished = state not in NON_TERMINAL
        old[state] = add(
            schedule, state, due_days_ago=41, finished_days_ago=40 if finished else None
        )
        recent[state] = add(
            schedule, state, due_days_ago=2, finished_days_ago=1 if finished else None
        )
    return old, recent


def test_deletes_old_terminal_occurrences_with_their_rows_and_keeps_everything_else(
    schedule: Schedule,
) -> None:
    old, recent = every_state(schedule)
    report = run("--older-than", "30")

    assert report["dry_run"] is False
    assert report["occurrences"] == {s.value: 1 for s in TERMINAL}
    assert report["occurrences_total"] == 4
    assert (report["attempts"], report["outbox"]) == (8, 4)
    assert report["idempotency_records"] is None
    kept = {s for s in S if Occurrence.objects.filter(id=old[s].id).exists()}
    assert kept == {S.DEAD, *NON_TERMINAL}
    assert surviving(list(recent.values())) == {str(o.id) for o in recent.values()}
    deleted_ids = [old[s].id for s in TERMINAL]
    assert not Attempt.objects.filter(occurrence_id__in=deleted_ids).exists()
    assert not OutboxEntry.objects.filter(occurrence_id__in=deleted_ids).exists()
    assert Attempt.objects.count() == 2 * (len(S) * 2 - 4)
    assert OutboxEntry.objects.count() == len(S) * 2 - 4
    assert Schedule.objects.filter(id=schedule.id).exists()


def test_dead_is_deleted_only_with_include_dead(schedule: Schedule) -> None:
    old, recent = every_state(schedule)
    run("--older-than", "30")
    assert Occurrence.objects.filter(id=old[S.DEAD].id).exists()

    report = run("--older-than", "30", "--include-dead")
    assert report["occurrences"] == {**{s.value: 0 for s in TERMINAL}, "DEAD": 1}
    assert not Occurrence.objects.filter(id=old[S.DEAD].id).exists()
    assert Occurrence.objects.filter(id=recent[S.DEAD].id).exists()
    assert {s for s in S if Occurrence.objects.filter(id=old[s].id).exists()} == set(NON_TERMINAL)


def test_age_is_the_later_of_time_and_finish(schedule: Schedule) -> None:
    never_finished_old = add(schedule, S.MISSED, due_days_ago=40, outbox=None)
    never_finished_new = add(schedule, S.MISSED, due_days_ago=1, outbox=None)
    # Due long ago but finished only yesterday (a late catch-up): young by finished_at.
    late_finish = add(schedule, S.SUCCEEDED, due_days_ago=40, finished_days_ago=1)
    # Canceled ahead of its time (a skip marker): young by its time, due in 5 days.
    canceled_early = add(schedule, S.CANCELED, due_days_ago=-5, finished_days_ago=40)

    report = run("--older-than", "30")

    assert report["occurrences_total"] == 1
    assert surviving([never_finished_old, never_finished_new, late_finish, canceled_early]) == {
        str(never_finished_new.id),
        str(late_finish.id),
        str(canceled_early.id),
    }


def test_an_unsent_outbox_row_keeps_its_occurrence(schedule: Schedule) -> None:
    unsent = add(schedule, S.SUCCEEDED, due_days_ago=41, finished_days_ago=40, outbox="unsent")
    no_outbox = add(schedule, S.SKIPPED_OVERLAP, due_days_ago=41, finished_days_ago=40, outbox=None)

    report = run("--older-than", "30")

    assert report["kept_unsent_outbox"] == 1
    assert report["occurrences"]["SKIPPED_OVERLAP"] == 1
    assert surviving([unsent, no_outbox]) == {str(unsent.id)}
    row = OutboxEntry.objects.get(occurrence=unsent)
    assert row.sent_at is None
    assert Attempt.objects.filter(occurrence=unsent).count() == 2


def test_deletes_in_batches_of_the_given_size(schedule: Schedule) -> None:
    for _ in range(25):
        add(schedule, S.SUCCEEDED, due_days_ago=41, finished_days_ago=40, attempts=1)
    with CaptureQueriesContext(connection) as queries:
        report = run("--older-than", "30", "--batch", "10")

    assert report["batches"] == 3
    assert report["occurrences"]["SUCCEEDED"] == 25
    assert Occurrence.objects.count() == 0
    occurrence_table = Occurrence._meta.db_table
    deletes = [
        q["sql"] for q in queries.captured_queries
        if q["sql"].startswith(f"DELETE FROM {connection.ops.quote_name(occurrence_table)}")
    ]  # fmt: skip
    assert len(deletes) == 3


@pytest.mark.django_db(transaction=True)
def test_each_batch_commits_on_its_own(tenant_factory: Any, monkeypatch: Any) -> None:
    schedule = make_schedule(tenant_factory())
    occs = [
        add(schedule, S.SUCCEEDED, due_days_ago=40 + i, finished_days_ago=30 + i) for i in range(25)
    ]
    real = retention._delete_occurrence_batch
    calls = []

    def failing_third(*args: Any) -> tuple[int, int, int]:
        calls.append(args)
        if len(calls) == 3:
            raise RuntimeError("connection lost mid-prune")
        return real(*args)

    monkeypatch.setattr(retention, "_delete_occurrence_batch", failing_third)
    with pytest.raises(RuntimeError):
        run("--older-than", "20", "--batch", "10")

    left = Occurrence.objects.order_by("scheduled_for")
    # Oldest first: the 20 oldest went in two committed batches, the 5 youngest stay whole.
    assert [o.id for o in left] == [o.id for o in reversed(occs[:5])]
    assert Attempt.objects.count() == 5 * 2
    assert OutboxEntry.objects.count() == 5


def test_dry_run_counts_what_a_real_run_deletes_and_writes_nothing(schedule: Schedule) -> None:
    every_state(schedule)
    add(schedule, S.CANCELED, due_days_ago=41, finished_days_ago=40, outbox="unsent")
    record = IdempotencyRecord.objects.create(key="invoice:1", task_name="billing.invoice")
    IdempotencyRecord.objects.filter(id=record.id).update(created_at=ago(100))
    before = {m: m.objects.count() for m in (Occurrence, Attempt, OutboxEntry, IdempotencyRecord)}

    args = ("--older-than", "30", "--include-dead", "--idempotency-older-than", "90")
    with CaptureQueriesContext(connection) as queries:
        dry = run(*args, "--dry-run")

    verbs = {q["sql"].split()[0] for q in queries.captured_queries}
    assert verbs.isdisjoint({"DELETE", "UPDATE", "INSERT"}), verbs
    assert {m: m.objects.count() for m in before} == before
    assert dry["dry_run"] is True
    assert dry["batches"] == 0
    real = run(*args)
    for key in ("occurrences", "attempts", "outbox", "kept_unsent_outbox", "idempotency_records"):
        assert dry[key] == real[key], key
    assert dry["occurrences_total"] == 5
    assert dry["idempotency_records"] == 1


def test_idempotency_records_are_kept_unless_asked_and_never_for_runnable_occurrences(
    schedule: Schedule,
) -> None:
    def record(key: str, days_ago: float, occ: Occurrence | None = None) -> IdempotencyRecord:
        rec = IdempotencyRecord.objects.create(
            key=key, task_name="billing.invoice", occurrence_id=None if occ is None else occ.id
        )
        IdempotencyRecord.objects.filter(id=rec.id).update(created_at=ago(days_ago))
        return rec

    old_done = add(schedule, S.SUCCEEDED, due_days_ago=100, finished_days_ago=100)
    retrying = add(schedule, S.RETRY_WAIT, due_days_ago=100)
    dead = add(schedule, S.DEAD, due_days_ago=100, finished_days_ago=100)
    record("no-occurrence", 100)
    record("of-succeeded", 100, old_done)
    record("of-retrying", 100, retrying)
    record("of-dead", 100, dead)
    record("recent", 10)

    run("--older-than", "30")
    assert IdempotencyRecord.objects.count() == 5

    report = run("--older-than", "30", "--idempotency-older-than", "60")
    assert report["idempotency_records"] == 2
    kept = set(IdempotencyRecord.objects.values_list("key", flat=True))
    assert kept == {"of-retrying", "of-dead", "recent"}


def test_schedule_versions_are_kept(schedule: Schedule) -> None:
    # The reconciler recomputes expected occurrences from these rows, old ones included.
    ScheduleVersion.objects.create(
        schedule=schedule, version=1, kind="CRON", cron="* * * * *", valid_from=ago(400),
        valid_to=ago(300),
    )  # fmt: skip
    add(schedule, S.SUCCEEDED, due_days_ago=350, finished_days_ago=350)

    assert run("--older-than", "30")["occurrences_total"] == 1
    assert ScheduleVersion.objects.filter(schedule=schedule).count() == 1
    assert Schedule.objects.filter(id=schedule.id).exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--older-than", "0"], "at least 1 day"),
        (["--older-than", "soon"], "not a whole number"),
        (["--older-than", "30", "--batch", "0"], "--batch must be from 1 to 10000, got 0"),
        (["--older-than", "30", "--idempotency-older-than", "0"], "at least 1 day"),
    ],
)
def test_bad_arguments_are_refused_before_any_write(
    schedule: Schedule, args: list[str], message: str
) -> None:
    add(schedule, S.SUCCEEDED, due_days_ago=41, finished_days_ago=40)
    with pytest.raises(CommandError, match=message):
        call_command("prune_occurrences", *args, stdout=StringIO())
    assert Occurrence.objects.count() == 1


def test_prune_refuses_a_non_positive_age() -> None:
    with pytest.raises(errors.ValidationError, match="older_than must be a positive age"):
        retention.prune(now=SYSTEM_CLOCK.now(), older_than=timedelta(0))


def test_text_summary(schedule: Schedule) -> None:
    add(schedule, S.SUCCEEDED, due_days_ago=41, finished_days_ago=40)
    add(schedule, S.MISSED, due_days_ago=41, finished_days_ago=40, outbox="unsent")
    out = StringIO()
    call_command("prune_occurrences", "--older-than", "30", "--dry-run", stdout=out)
    text = out.getvalue()
    assert "(dry run)" in text
    assert "would delete 1 occurrence(s), 2 attempt(s), 1 outbox row(s)" in text
    assert "kept 1 old finished occurrence(s) whose outbox row is still unsent" in text
    assert Occurrence.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_a_batch_that_would_orphan_an_unsent_outbox_row_fails_whole(
    tenant_factory: Any, monkeypatch: Any
) -> None:
    """Belt and braces behind the eligibility filter: the batch refuses the delete."""
    schedule = make_schedule(tenant_factory())
    sent = add(schedule, S.SUCCEEDED, due_days_ago=42, finished_days_ago=41)
    unsent = add(schedule, S.SUCCEEDED, due_days_ago=41, finished_days_ago=40, outbox="unsent")
    monkeypatch.setattr(retention, "prunable_occurrences", retention._old_terminal)

    with pytest.raises(IntegrityError):
        retention.prune(now=SYSTEM_CLOCK.now(), older_than=30 * DAY, batch_size=10)

    assert surviving([sent, unsent]) == {str(sent.id), str(unsent.id)}
    assert OutboxEntry.objects.get(occurrence=unsent).sent_at is None
    assert Attempt.objects.count() == 4


@pytest.mark.postgres
def test_a_batch_reads_the_history_only_in_the_slots_of_its_rows(schedule: Schedule) -> None:
    """Each statement of a batch names its rows' time: on the partitioned history it reads
    the slots the batch is in, not every slot's index. Seen failing when the batch's
    attempts, outbox rows and occurrences were found by id alone."""
    from django_app.db import partitions

    now = SYSTEM_CLOCK.now()
    partitions.ensure(ago(41), width=DAY, ahead=0, wait=True)
    partitions.ensure(now, width=DAY, ahead=1, behind=3, wait=True)
    old = add(schedule, S.SUCCEEDED, due_days_ago=41, finished_days_ago=40)
    others = {
        p.name
        for table in partitions.tables()
        for p in partitions.partitions(table)
        if p.start and p.end and not p.start <= old.scheduled_for < p.end
    }
    assert len(others) >= 3 * 5
    with CaptureQueriesContext(connection) as captured:
        report = retention.prune(now=now, older_than=30 * DAY, batch_size=10)
    assert report.occurrences == {S.SUCCEEDED.value: 1}
    batch = [q["sql"] for q in captured.captured_queries if old.id.hex in q["sql"]]
    assert len(batch) >= 4  # the bookkeeping, the attempts, the outbox, the occurrences
    with connection.cursor() as cur:
        for sql in batch:
            cur.execute(f"EXPLAIN {sql}")
            plan = "\n".join(row[0] for row in cur.fetchall())
            assert not [name for name in others if name in plan], (sql, plan)


def test_the_bookkeeping_of_a_chunk_at_a_time_is_the_bookkeeping_of_all_at_once(
    tenant: Tenant, monkeypatch: Any
) -> None:
    """record_pruned streams the schedules of what goes in chunks (a day's slot holds
    millions): with chunks of 2 schedules, or of 3 rows, every schedule's PrunedHistory is
    what one pass over all of them writes."""
    schedules = [make_schedule(tenant) for _ in range(5)]
    for k, schedule in enumerate(schedules):
        for i in range(k + 1):
            add(schedule, S.SUCCEEDED, due_days_ago=41 + i / 24, finished_days_ago=40)
        add(schedule, S.MISSED, due_days_ago=40.5, finished_days_ago=40)

    def bookkeeping() -> dict[Any, tuple[Any, ...]]:
        from django.db import transaction

        from django_app.models import PrunedHistory

        with transaction.atomic():
            retention.record_pruned(Occurrence.objects.all())
            rows = {
                p.schedule_id: (p.first, p.through, p.ran, p.backfilled)
                for p in PrunedHistory.objects.all()
            }
            transaction.set_rollback(True)
        return rows

    whole = bookkeeping()
    assert set(whole) == {s.pk for s in schedules}
    monkeypatch.setattr(retention, "_SPAN_CHUNK", 2)
    assert bookkeeping() == whole
    monkeypatch.setattr(retention, "_SPAN_CHUNK", 5_000)
    monkeypatch.setattr(retention, "_ROWS_CHUNK", 3)
    assert bookkeeping() == whole
