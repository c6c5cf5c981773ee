"""Beat re-queues occurrences whose worker lease expired, under the same occurrence id."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from celery import Celery

from celery_scheduler import api, errors
from celery_scheduler.beat import DatabaseScheduler
from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.publishers import RecordingPublisher
from django_app.models import Attempt, Occurrence
from django_app.worker import claim, finish

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
pytestmark = pytest.mark.django_db


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("beat-reaper-test", set_as_current=False)
    yield app
    app.close()


def test_beat_requeues_an_expired_lease_with_the_same_id(app: Celery) -> None:
    clock = FrozenClock(NOW)
    publisher = RecordingPublisher()
    schedule = api.create_schedule(name="n", task="billing.ping", cron="0 * * * *", clock=clock)
    occurrence = api.run_now(schedule.id, clock=clock)
    beat = DatabaseScheduler(app=app, clock=clock, publisher=publisher, use_shard_leases=False)
    beat.tick()
    assert publisher.task_ids == [str(occurrence.id)]

    claimed = claim.claim(occurrence.id, worker="w1", clock=clock, lease=timedelta(seconds=30))
    assert claimed.fencing_token == 1
    clock.advance(31)  # the worker died: no heartbeat, no completion
    beat._next_poll = 0.0  # poll now rather than at the next poll interval
    beat.tick()
    clock.advance(1.5)
    beat._next_poll = 0.0
    beat.tick()

    assert publisher.task_ids == [str(occurrence.id)] * 2  # re-published, same id
    occurrence.refresh_from_db()
    assert occurrence.state == "ENQUEUED"
    assert list(Attempt.objects.values_list("outcome", flat=True)) == ["LOST"]
    # The late worker's completion is refused: its token is no longer current.
    with pytest.raises(errors.StaleWrite):
        finish.complete(occurrence.id, claimed.fencing_token, {"late": True}, clock=clock)
    assert Occurrence.objects.get(id=occurrence.id).result is None
    beat.close()
