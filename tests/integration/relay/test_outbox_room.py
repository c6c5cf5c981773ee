"""PostgreSQL: the outbox's partitions leave room on each page for the relay's claim
(``fillfactor``, migration 0027), so the claim's new row version stays on its page and,
since the claim changes no indexed column, writes no index entry (a HOT update)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.publishers import RecordingPublisher
from django_app.db import partitions
from django_app.models import OutboxEntry
from django_app.relay.burst import BurstRelay
from tests.integration.relay.test_burst import seed

pytestmark = [pytest.mark.django_db, pytest.mark.postgres]
DAY = timedelta(days=1)


def _pages() -> dict[int, int]:
    """outbox row id -> the heap page its current version is on."""
    with connection.cursor() as cur:
        cur.execute(f"SELECT id, (ctid::text::point)[0]::int FROM {OutboxEntry._meta.db_table}")
        return dict(cur.fetchall())


def _fillfactors() -> dict[str, str | None]:
    """Every partition of the outbox (the default one too) -> its fillfactor setting."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT c.relname, (SELECT split_part(o, '=', 2) FROM unnest(c.reloptions) o "
            "WHERE o LIKE 'fillfactor=%%') FROM pg_inherits i JOIN pg_class c "
            "ON c.oid = i.inhrelid WHERE i.inhparent = %s::regclass",
            [OutboxEntry._meta.db_table],
        )
        return dict(cur.fetchall())


def test_the_relays_claim_keeps_every_outbox_row_on_its_page(frozen_clock: FrozenClock) -> None:
    due = frozen_clock.now() + timedelta(seconds=20)
    partitions.ensure(frozen_clock.now(), width=DAY, ahead=1, wait=True)
    seed(frozen_clock, [(due, 600)])  # many pages of rows written together, as a plan does
    before = _pages()
    assert len(set(before.values())) > 3

    relay = BurstRelay(clock=frozen_clock, publisher=RecordingPublisher(), node="n1", lookahead=DAY)
    assert relay.poll().held == 600
    assert OutboxEntry.objects.filter(claimed_by=relay.token).count() == 600

    moved = {pk for pk, page in _pages().items() if page != before[pk]}
    assert not moved, f"{len(moved)} of 600 claimed rows left their page (not HOT)"


def test_every_outbox_partition_leaves_the_room(frozen_clock: FrozenClock) -> None:
    partitions.ensure(frozen_clock.now(), width=DAY, ahead=2, behind=2, wait=True)
    factors = _fillfactors()
    assert len(factors) >= 6  # the default partition, the slots from migrate and these
    assert set(factors.values()) == {str(partitions.OUTBOX_FILLFACTOR)}, factors


@pytest.mark.django_db(transaction=True)
def test_migration_0027_sets_the_room_on_existing_partitions_and_takes_it_back() -> None:
    room = {str(partitions.OUTBOX_FILLFACTOR)}
    assert set(_fillfactors().values()) == room
    try:
        MigrationExecutor(connection).migrate(
            [("django_app", "0026_state_indexes_without_succeeded")]
        )
        assert set(_fillfactors().values()) == {None}
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())
    assert set(_fillfactors().values()) == room
