"""Two burst relays split one burst: chunked claims, each row held and sent by one relay."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

import pytest

from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.publishers import (
    OccurrenceMessage,
    PreparingPublisher,
    RecordingPublisher,
)
from django_app.models import Occurrence, OutboxEntry
from django_app.relay import burst
from django_app.relay.burst import BurstRelay
from tests.integration.relay.test_burst import NOW, drive, seed
from tests.integration.threads import run_threads

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

ROWS = 1_200
CHUNK = 100


class SlowPreparing(RecordingPublisher, PreparingPublisher):
    """A publisher with a prepare step that takes a while, as building envelopes does."""

    def prepare(self, messages: Iterable[OccurrenceMessage]) -> list[OccurrenceMessage]:
        time.sleep(0.05)
        return list(messages)

    def publish_prepared(self, prepared: Sequence[OccurrenceMessage]) -> None:
        self.publish(prepared)


def test_two_relays_claiming_at_once_split_the_burst(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(burst, "SQL_CHUNK", CHUNK)
    clock = FrozenClock(NOW - timedelta(seconds=20))
    seed(clock, [(NOW, ROWS)])
    relays = [
        BurstRelay(clock=clock, publisher=SlowPreparing(), node=f"n{i}", lookahead=timedelta(30))
        for i in range(2)
    ]
    # While one relay prepares a chunk the other claims the next.
    assert run_threads(*(relay.claim_ahead for relay in relays)) == []
    held = [r.held() for r in relays]
    # Both hold a share.
    assert sum(held) == ROWS
    assert min(held) >= CHUNK, held
    claimed = Counter(OutboxEntry.objects.values_list("claimed_by", flat=True))
    assert claimed == {relays[0].token: held[0], relays[1].token: held[1]}

    for relay in relays:
        drive(relay, clock)
    sent: list[str] = []
    for relay in relays:
        publisher: Any = relay.publisher
        sent += publisher.task_ids
    assert Counter(sent) == Counter(str(i) for i in Occurrence.objects.values_list("id", flat=True))
    assert not OutboxEntry.objects.filter(sent_at__isnull=True).exists()
