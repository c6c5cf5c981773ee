"""prune_occurrences on PostgreSQL: locked rows are skipped, not waited for; replays race safely."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction

from celery_scheduler import errors
from celery_scheduler.core.clock import SYSTEM_CLOCK
from celery_scheduler.core.enums import OccurrenceState as S
from django_app.models import Attempt, Occurrence, OutboxEntry
from django_app.operations.retention import prune
from django_app.worker.finish import replay_occurrence
from tests.integration.operations.test_retention import add
from tests.integration.worker_support import make_schedule

pytestmark = [pytest.mark.concurrent_db, pytest.mark.django_db(transaction=True)]
MONTH = timedelta(days=30)


def in_thread(target: Callable[[], None]) -> threading.Thread:
    def run() -> None:
        try:
            target()
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_row_locked_by_another_transaction_is_skipped_not_waited_for(
    tenant_factory: Any,
) -> None:
    schedule = make_schedule(tenant_factory())
    occs = [add(schedule, S.SUCCEEDED, due_days_ago=41, finished_days_ago=40) for _ in range(5)]
    busy = occs[2]
    locked, release = threading.Event(), threading.Event()

    def hold_lock() -> None:
        with transaction.atomic():
            Occurrence.objects.select_for_update().get(id=busy.id)
            locked.set()
            release.wait(30)

    holder = in_thread(hold_lock)
    try:
        assert locked.wait(10)
        started = SYSTEM_CLOCK.monotonic()
        report = prune(now=SYSTEM_CLOCK.now(), older_than=MONTH, batch_size=2)
        elapsed = SYSTEM_CLOCK.monotonic() - started
    finally:
        release.set()
        holder.join(10)

    assert elapsed < 5, f"prune waited {elapsed:.1f}s on a locked row"
    assert report.occurrences == {"SUCCEEDED": 4}
    assert list(Occurrence.objects.values_list("id", flat=True)) == [busy.id]
    assert Attempt.objects.filter(occurrence=busy).count() == 2
    # The next run (lock gone) takes it.
    assert prune(now=SYSTEM_CLOCK.now(), older_than=MONTH).occurrences == {"SUCCEEDED": 1}


def test_replay_racing_prune_of_dead_either_replays_or_finds_nothing(tenant_factory: Any) -> None:
    schedule = make_schedule(tenant_factory())
    dead = [add(schedule, S.DEAD, due_days_ago=41, finished_days_ago=40) for _ in range(40)]
    outcomes: dict[uuid.UUID, str] = {}
    failures: list[BaseException] = []
    go = threading.Barrier(2)

    def replay_all() -> None:
        go.wait()
        for occ in dead:
            try:
                replay_occurrence(occ.id)
                outcomes[occ.id] = "replayed"
            except errors.OccurrenceNotFound:
                outcomes[occ.id] = "gone"

    def prune_dead() -> None:
        go.wait()
        try:
            prune(now=SYSTEM_CLOCK.now(), older_than=MONTH, batch_size=1, include_dead=True)
        except BaseException as exc:  # a deadlock or stale write would land here
            failures.append(exc)

    threads = [in_thread(replay_all), in_thread(prune_dead)]
    for thread in threads:
        thread.join(60)
    assert failures == []
    assert len(outcomes) == len(dead)
    for occ in dead:
        row = Occurrence.objects.filter(id=occ.id).first()
        if outcomes[occ.id] == "replayed":
            # A successful replay must never be undone by the prune.
            assert row is not None, f"replayed {occ.id} was deleted"
            assert row.state == S.ENQUEUED
            assert OutboxEntry.objects.get(occurrence_id=occ.id).sent_at is None
        else:
            assert row is None
            assert not Attempt.objects.filter(occurrence_id=occ.id).exists()
    # Interleaving varies, but a replay after the prune passed must leave its row in place.
    assert Occurrence.objects.count() == list(outcomes.values()).count("replayed")
