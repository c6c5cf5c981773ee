"""The relay and the worker report lag, queue age, time per state and counts in Prometheus."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from celery import Celery, shared_task

from celery_scheduler import api, metrics
from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.errors import CoordinationUnavailable
from celery_scheduler.publishers import OccurrenceMessage, RecordingPublisher
from django_app import observe
from django_app.models import Occurrence
from django_app.relay.batch import relay_due
from django_app.tasks import execute
from django_app.wiring import materialize_due
from django_app.worker import claim, finish

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


class BrokenPublisher(RecordingPublisher):
    def publish(self, messages: Sequence[OccurrenceMessage]) -> None:
        raise CoordinationUnavailable("broker down")


def _sample(name: str, **labels: str) -> float:
    value = metrics.registry().get_sample_value(f"celery_scheduler_{name}", labels)
    return value or 0.0


def test_relay_observes_lag_per_tenant_and_counts_publishes() -> None:
    metrics.reset()
    clock = FrozenClock(NOW)
    schedule = api.create_schedule(name="n", task="billing.ping", cron="* * * * *", clock=clock)
    api.run_now(schedule.id, clock=clock)
    clock.advance(timedelta(seconds=2))

    report = relay_due(clock=clock, publisher=RecordingPublisher())

    assert report.published == 1
    assert _sample("published_total") == 1
    assert _sample("schedule_lag_seconds_count", tenant="default") == 1
    assert _sample("schedule_lag_seconds_sum", tenant="default") == pytest.approx(2.0)


def test_relay_counts_broker_failures() -> None:
    metrics.reset()
    clock = FrozenClock(NOW)
    schedule = api.create_schedule(name="n", task="billing.ping", cron="* * * * *", clock=clock)
    api.run_now(schedule.id, clock=clock)

    with pytest.raises(CoordinationUnavailable):
        relay_due(clock=clock, publisher=BrokenPublisher())

    assert _sample("publish_failures_total") == 1
    assert _sample("published_total") == 0


metrics_app = Celery("observe-tests", set_as_current=False)
#: The frozen clock of the running test (the task body moves it: the run's duration).
running_clock: list[FrozenClock] = []


# shared_task: registered in every app, the current one included (create_schedule checks the
# name against the current app; an app.task is only added to apps finalized later, so the
# check depended on which test had finalized the current app first).
@shared_task(name="observe.takes_three_seconds")
def takes_three_seconds() -> None:
    running_clock[-1].advance(timedelta(seconds=3))


def test_each_state_an_occurrence_leaves_is_observed_per_tenant(tenant_factory: Any) -> None:
    """The default path: materialize, relay, worker claim, run, complete; one frozen clock."""
    metrics.reset()
    clock = FrozenClock(NOW)
    running_clock.append(clock)
    tenant_factory("acme")
    api.create_schedule(
        tenant="acme", name="n", task="observe.takes_three_seconds",
        run_at=NOW + timedelta(seconds=5), clock=clock,
    )  # fmt: skip
    materialize_due(clock=clock, horizon=timedelta(seconds=60))
    occ = Occurrence.objects.get()
    Occurrence.objects.update(created_at=NOW)  # auto_now_add wrote the wall clock

    clock.advance(timedelta(seconds=6))  # SCHEDULED for 6 s, published 1 s after its time
    assert relay_due(clock=clock, publisher=RecordingPublisher()).published == 1
    clock.advance(timedelta(seconds=2))  # 2 s in the queue
    outcome = execute(
        metrics_app, str(occ.id), "observe.takes_three_seconds", [], {},
        worker_name="w", clock=clock,
    )  # fmt: skip
    assert outcome["outcome"] == "SUCCEEDED"

    def seconds(name: str, **labels: str) -> tuple[float, float]:
        return (_sample(f"{name}_count", **labels), _sample(f"{name}_sum", **labels))

    assert seconds("schedule_lag_seconds", tenant="acme") == (1, pytest.approx(1.0))
    assert seconds("state_seconds", tenant="acme", state="SCHEDULED") == (1, pytest.approx(6.0))
    assert seconds("queue_age_seconds", tenant="acme") == (1, pytest.approx(2.0))
    assert seconds("state_seconds", tenant="acme", state="ENQUEUED") == (1, pytest.approx(2.0))
    assert seconds("state_seconds", tenant="acme", state="RUNNING") == (1, pytest.approx(3.0))
    # Labels are tenant and state only: never a schedule's or an occurrence's id.
    for family in metrics.registry().collect():
        for sample in family.samples:
            assert set(sample.labels) <= {"tenant", "state", "le"}, sample


def test_a_retried_occurrence_is_queued_from_its_retry_time(tenant_factory: Any) -> None:
    """Republished at ``retry_at``: its second claim's queue age starts there, not at the
    first publish (``enqueued_at`` keeps the first)."""
    metrics.reset()
    clock = FrozenClock(NOW)
    tenant_factory("acme")
    schedule = api.create_schedule(tenant="acme", name="n", task="billing.ping",
                                   run_at=NOW + timedelta(seconds=5), clock=clock)  # fmt: skip
    materialize_due(clock=clock, horizon=timedelta(seconds=60))
    occ = Occurrence.objects.get(schedule_id=schedule.id)
    clock.advance(timedelta(seconds=5))
    relay_due(clock=clock, publisher=RecordingPublisher())
    first = claim.claim(occ.id, worker="w", clock=clock)
    assert first.fencing_token is not None
    finish.fail(occ.id, first.fencing_token, "boom", retry_at=clock.now() + timedelta(seconds=60),
                clock=clock)  # fmt: skip
    clock.advance(timedelta(seconds=60))  # retry_at reached: republished now
    relay_due(clock=clock, publisher=RecordingPublisher())
    clock.advance(timedelta(seconds=4))
    assert claim.claim(occ.id, worker="w", clock=clock).claimed
    # First claim after 0 s in the queue, the second after 4 s (not 64 s).
    assert _sample("queue_age_seconds_count", tenant="acme") == 2
    assert _sample("queue_age_seconds_sum", tenant="acme") == pytest.approx(4.0)


def test_outbox_backlog_gauge_counts_due_unsent_rows() -> None:
    metrics.reset()
    clock = FrozenClock(NOW)
    for i in range(3):
        api.create_schedule(name=f"n{i}", task="billing.ping",
                            run_at=NOW + timedelta(seconds=5 + 60 * i), clock=clock)  # fmt: skip
    materialize_due(clock=clock, horizon=timedelta(minutes=5))
    clock.advance(timedelta(seconds=70))  # two of the three are due, none sent
    observe.export_outbox_backlog(clock.now())
    assert _sample("outbox_backlog") == 2
    relay_due(clock=clock, publisher=RecordingPublisher())
    observe.export_outbox_backlog(clock.now())
    assert _sample("outbox_backlog") == 0


def test_claims_refused_by_lease_or_version_count_as_rejected_stale(
    tenant: Any, frozen_clock: FrozenClock
) -> None:
    """The metric counts writes refused "by fencing token, lease or version": a renewal
    after the lease lapsed and a claim of a superseded occurrence were not counted."""
    from django_app.models import Schedule
    from django_app.worker import claim, finish
    from tests.integration.worker_support import make_occurrence, make_schedule

    metrics.reset()
    schedule = make_schedule(tenant)
    lapsed = make_occurrence(schedule, frozen_clock.now())
    token = claim.claim(lapsed.id, worker="w", clock=frozen_clock, lease=timedelta(seconds=30))
    assert token.fencing_token is not None
    frozen_clock.advance(60)
    assert not finish.renew(lapsed.id, token.fencing_token, clock=frozen_clock, holds_slot=False)
    superseded = make_occurrence(schedule, frozen_clock.now())
    Schedule.objects.filter(pk=schedule.pk).update(version=2)
    assert claim.claim(superseded.id, worker="w", clock=frozen_clock).outcome is (
        claim.ClaimOutcome.STALE
    )
    assert _sample("claims_rejected_stale_total") == 2
