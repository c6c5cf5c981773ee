"""Leads sized from the load (celery_scheduler.core.lead), and late work at the burst rate.

The beat's materializer horizon and the burst relay's claim window grow from their
configured floors when much is due, and stay there for a light load; a backlog of late rows
goes out through the burst path (claimed, prepared, published in waves), not one general
relay batch at a time; updates and pauses still invalidate what was planned far ahead.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from celery import Celery

from celery_scheduler import api
from celery_scheduler.beat import DatabaseScheduler
from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.core.lead import RateMeter
from celery_scheduler.publishers import RecordingPublisher
from django_app.models import Occurrence, OutboxEntry, Tenant
from django_app.relay.burst import BurstRelay
from tests.integration.relay.test_burst import seed

#: 12:00 UTC; the crons below fire at 12:07 (7 minutes ahead: far past the 60 s floor).
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
FIRE = NOW + timedelta(minutes=7)


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("lead-test", set_as_current=False)
    yield app
    app.close()


def crons(n: int, clock: FrozenClock) -> list[str]:
    return [
        str(
            api.create_schedule(name=f"c{i}", task="billing.ping", cron="7 * * * *", clock=clock).id
        )
        for i in range(n)
    ]


@pytest.mark.django_db(transaction=True)
def test_a_load_that_needs_it_is_planned_ahead_of_the_floor_and_a_light_one_is_not(
    app: Celery,
) -> None:
    clock = FrozenClock(NOW)
    ids = crons(40, clock)
    beat = DatabaseScheduler(app=app, clock=clock, publisher=RecordingPublisher())
    # 40 schedules at 40 rows/s take 1 s: well inside the 60 s floor, nothing planned yet.
    beat.materialize_rate = RateMeter(assumed=40)
    beat.tick()
    assert Occurrence.objects.count() == 0
    # The same 40 at a measured 0.1 rows/s would take 400 s: plan them now, 7 minutes ahead.
    beat.materialize_rate = RateMeter(assumed=0.1)
    clock.advance(10)  # the next sizing
    beat.tick()
    planned = Occurrence.objects.filter(state="SCHEDULED", scheduled_for=FIRE)
    assert sorted(str(o.schedule_id) for o in planned) == sorted(ids)

    # An update and a pause invalidate what was planned far ahead, as they do near.
    api.update_schedule(ids[0], cron="8 * * * *", clock=clock)
    api.pause_schedule(ids[1], clock=clock)
    old = {str(o.schedule_id): o.state for o in Occurrence.objects.filter(scheduled_for=FIRE)}
    assert (old[ids[0]], old[ids[1]], old[ids[2]]) == ("CANCELED", "CANCELED", "SCHEDULED")
    clock.set(FIRE - timedelta(seconds=10))  # the new version's 12:08 is within the floor
    beat.tick()
    replanned = Occurrence.objects.get(schedule_id=ids[0], state="SCHEDULED")
    assert (replanned.scheduled_for, replanned.schedule_version) == (
        FIRE + timedelta(minutes=1),
        2,
    )
    beat.close()


@pytest.mark.django_db(transaction=True)
def test_the_ceiling_bounds_the_horizon(app: Celery) -> None:
    from django.test import override_settings

    clock = FrozenClock(NOW)
    crons(5, clock)
    beat = DatabaseScheduler(app=app, clock=clock, publisher=RecordingPublisher())
    beat.materialize_rate = RateMeter(assumed=0.001)
    with override_settings(CELERY_SCHEDULER={"max_horizon_seconds": 300}):
        beat.tick()  # 12:07 is 420 s ahead: beyond the ceiling
        assert Occurrence.objects.count() == 0
        clock.advance(130)  # 12:02:10: now 290 s ahead
        beat.tick()
        assert Occurrence.objects.filter(scheduled_for=FIRE).count() == 5
    beat.close()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_late_backlog_goes_out_through_the_burst_path_in_one_poll() -> None:
    clock = FrozenClock(NOW - timedelta(seconds=120))
    seed(clock, [(NOW - timedelta(seconds=60), 2_000), (NOW - timedelta(seconds=1), 1_000)])
    clock.set(NOW)  # an outage: every row is late
    publisher = RecordingPublisher()
    relay = BurstRelay(clock=clock, publisher=publisher, node="n1")
    relay.poll()
    assert len(publisher.sent) == 3_000
    assert len(set(publisher.task_ids)) == 3_000
    # Claimed, prepared and published in waves (the burst rate), not by general batches.
    assert relay.stats.rows["claim"] == 3_000
    assert relay.stats.rows["publish"] == 3_000
    assert OutboxEntry.objects.filter(sent_at__isnull=True).count() == 0
    assert relay.poll().held == 0


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_late_rows_of_a_rate_limited_tenant_keep_to_its_rate() -> None:
    clock = FrozenClock(NOW - timedelta(seconds=120))
    seed(clock, [(NOW - timedelta(seconds=60), 300)])
    Tenant.objects.filter(slug="default").update(max_trigger_rate=60)  # per minute
    clock.set(NOW)
    publisher = RecordingPublisher()
    relay = BurstRelay(clock=clock, publisher=publisher, node="n1")
    relay.poll()
    assert relay.stats.rows.get("claim", 0) == 0  # left to the general, budgeted path
    assert 0 < len(publisher.sent) <= 60


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("rows", "held"), [(10, 0), (2_000, 2_000)])
def test_the_claim_window_grows_with_the_rows_due_and_not_for_a_few(rows: int, held: int) -> None:
    clock = FrozenClock(NOW - timedelta(seconds=200))
    seed(clock, [(NOW, rows)])
    clock.set(NOW - timedelta(seconds=120))
    relay = BurstRelay(clock=clock, publisher=RecordingPublisher(), node="n1")
    relay.prepare_rate = RateMeter(assumed=20)
    # 10 rows at 20 rows/s: the 30 s floor is enough. 2,000: 200 s of work, 120 s away.
    assert relay.poll().held == held
    assert (relay.lookahead > timedelta(seconds=120)) is (held > 0)
    relay.close()
