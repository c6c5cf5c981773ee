"""The burst relay finds a wave's rows by their partition key (PostgreSQL).

On the partitioned history tables an id is unique only with ``scheduled_for``: a statement
that looks occurrences or outbox rows up by id alone probes the id index of every slot of
the retention window, for every row. The relay's read (prepare), its lock and unsent
re-check at the hold, and its marks after the push name the wave's times too, so each
reads the slot the wave is in. Scans are counted from ``pg_stat_xact_user_tables``.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest

from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.core.enums import OccurrenceState as S
from celery_scheduler.publishers import RecordingPublisher
from django_app.db import partitions
from django_app.models import Occurrence, OutboxEntry
from django_app.relay.burst import BurstRelay
from tests.integration.relay.test_burst import drive, seed
from tests.integration.worker_support import partitions_scanned

pytestmark = [pytest.mark.django_db, pytest.mark.postgres]
DAY = timedelta(days=1)
#: Past daily slots: a lookup by id alone probes each one.
SLOTS = 6


def test_a_waves_read_lock_and_marks_scan_its_slot_only(frozen_clock: FrozenClock) -> None:
    due = frozen_clock.now() + timedelta(seconds=20)
    partitions.ensure(frozen_clock.now(), width=DAY, ahead=1, behind=SLOTS, wait=True)
    seed(frozen_clock, [(due, 40)])
    slot = f"p{due:%Y%m%d}"
    publisher = RecordingPublisher()
    relay = BurstRelay(
        clock=frozen_clock, publisher=publisher, node="n1", lookahead=timedelta(seconds=30)
    )

    held: list[int] = []
    prepared = partitions_scanned(lambda: held.append(relay.poll().held))
    assert held == [40]
    # The claim reads the outbox's unsent rows wherever they are; the read is by key.
    assert prepared["django_app_occurrence"] == {f"django_app_occurrence_{slot}"}, prepared

    published = partitions_scanned(lambda: drive(relay, frozen_clock))
    assert set(published) == {"django_app_occurrence", "django_app_outboxentry"}, published
    for table, names in published.items():
        assert names == {f"{table}_{slot}"}, published
    assert Counter(publisher.task_ids) == Counter(
        {str(i): 1 for i in Occurrence.objects.values_list("id", flat=True)}
    )
    assert set(Occurrence.objects.values_list("state", flat=True)) == {S.ENQUEUED.value}
    assert not OutboxEntry.objects.filter(sent_at__isnull=True).exists()
