"""A schedule that cannot be planned is parked, not retried forever (issue 9, hole 6).

The stored timing is corrupted behind the API's back (a raw UPDATE, as a bad data fix or a
dropped time zone would), then materialize passes run: the schedule becomes PARKED with
the reason on the row, the metric counts it once, one log line says so (not a traceback per
pass), the other schedules of the same pass are still planned, and resume/update with a
valid timing un-park it. Both materializer paths: the per-schedule one and (PostgreSQL)
the set-based one.
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.urls import reverse

from celery_scheduler import api, errors, metrics
from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.publishers import RecordingPublisher
from django_app.materialize import per_schedule
from django_app.models import Occurrence, Schedule
from django_app.relay.batch import relay_due
from django_app.wiring import materialize_due
from django_app.worker import claim
from tests.integration.threads import run_threads, wait_for_a_lock_waiter

NOW = datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
pytestmark = pytest.mark.django_db
PARKED = "celery_scheduler_schedules_parked_total"


@pytest.fixture(params=[False, True], ids=["per-schedule", "bulk"])
def setup(
    request: Any, settings: Any, tenant: Any, monkeypatch: pytest.MonkeyPatch
) -> dict[str, Any]:
    # bulk=True is the set-based path on PostgreSQL (elsewhere it falls back by design).
    settings.CELERY_SCHEDULER = {"validate_task_names": False, "bulk_materialize": request.param}
    if request.param and connection.vendor == "postgresql":

        def per_schedule_park(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError("the set-based path must park within its batch")

        monkeypatch.setattr(per_schedule, "_park_one", per_schedule_park)
    clock = FrozenClock(NOW)
    made = {
        name: api.create_schedule(
            tenant="acme", name=name, task="billing.ping", cron="* * * * *", clock=clock
        )
        for name in ("bad", "good", "also good")
    }
    metrics.reset()
    return {"clock": clock, **made}


def corrupt(schedule: Schedule, cron: str = "not a cron") -> None:
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE django_app_schedule SET cron = %s WHERE id = %s",
            [cron, schedule.pk.hex if connection.vendor == "sqlite" else schedule.pk],
        )


def two_passes(clock: FrozenClock) -> list[Any]:
    reports = []
    for _ in range(2):
        clock.advance(MINUTE)
        reports.append(materialize_due(clock=clock, horizon=timedelta(0)))
    return reports


def test_invalid_stored_timing_is_parked_once_and_the_pass_goes_on(
    setup: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    bad, clock = setup["bad"], setup["clock"]
    corrupt(bad)
    caplog.set_level(logging.DEBUG)
    reports = two_passes(clock)
    bad.refresh_from_db()
    assert bad.state == "PARKED"
    assert "not a cron" in bad.parked_reason
    assert bad.parked_at == NOW + MINUTE
    assert metrics.get_metrics().value(PARKED, tenant="acme") == 1
    assert [r.parked for r in reports] == [1, 0]
    # The others were planned in both passes.
    for name in ("good", "also good"):
        times = set(
            Occurrence.objects.filter(schedule=setup[name]).values_list("scheduled_for", flat=True)
        )
        assert {NOW.replace(second=0) + MINUTE, NOW.replace(second=0) + 2 * MINUTE} <= times
    assert not Occurrence.objects.filter(schedule=bad).exists()
    mentions = [r for r in caplog.records if str(bad.pk) in r.getMessage()]
    assert len(mentions) == 1, [r.getMessage() for r in mentions]
    assert sum(r.exc_info is not None for r in caplog.records) <= 1


def test_resume_with_a_valid_timing_unparks_and_an_invalid_one_stays_parked(
    setup: dict[str, Any],
) -> None:
    bad, clock = setup["bad"], setup["clock"]
    corrupt(bad)
    two_passes(clock)
    with pytest.raises(errors.ValidationError) as raised:
        api.resume_schedule(bad.pk, clock=clock)
    assert raised.value.field == "cron"
    bad.refresh_from_db()
    assert bad.state == "PARKED"
    corrupt(bad, "*/5 * * * *")
    result = api.resume_schedule(bad.pk, clock=clock)
    assert result.state == "ACTIVE"
    bad.refresh_from_db()
    assert (bad.state, bad.parked_reason, bad.parked_at) == ("ACTIVE", "", None)
    assert bad.next_run_at is not None
    assert bad.next_run_at >= clock.now() - 5 * MINUTE
    clock.advance(10 * MINUTE)
    materialize_due(clock=clock, horizon=timedelta(0))
    assert Occurrence.objects.filter(schedule=bad).exists()


def test_a_resume_from_parked_runs_the_times_planned_before_the_park(
    setup: dict[str, Any],
) -> None:
    """Runs planned before the park and still unclaimed at the resume run once: 12:01,
    due and waiting for a worker, and 12:02 and 12:03, ahead. The resume's new version takes
    them over as an update's would, rather than leave them to the old version, whose
    occurrences no claim accepts any more, or judge the due one by the misfire policy."""
    bad, clock = setup["bad"], setup["clock"]
    materialize_due(clock=clock, horizon=3 * MINUTE)  # 12:01 to 12:03, ahead
    corrupt(bad)
    clock.advance(MINUTE)  # 12:01:30: the pass that would plan 12:04 parks the schedule
    materialize_due(clock=clock, horizon=3 * MINUTE)
    bad.refresh_from_db()
    assert bad.state == "PARKED"
    corrupt(bad, "* * * * *")
    api.resume_schedule(bad.pk, clock=clock)
    publisher = RecordingPublisher()
    ran: list[datetime] = []
    for _ in range(3):
        clock.advance(MINUTE)
        seen = len(publisher.sent)
        materialize_due(clock=clock, horizon=timedelta(0))
        relay_due(clock=clock, publisher=publisher)
        for message in publisher.sent[seen:]:
            taken = claim.claim(message.occurrence_id, worker="w", clock=clock).claimed
            if taken and message.schedule_id == str(bad.pk):
                ran.append(message.scheduled_for)
    at = datetime(2026, 3, 1, 12, 1, tzinfo=UTC)
    assert sorted(ran) == [at + n * MINUTE for n in range(4)], ran


def test_update_with_a_valid_timing_unparks(setup: dict[str, Any]) -> None:
    bad, clock = setup["bad"], setup["clock"]
    corrupt(bad)
    two_passes(clock)
    result = api.update_schedule(bad.pk, cron="*/2 * * * *", clock=clock)
    assert result.state == "ACTIVE"
    bad.refresh_from_db()
    assert (bad.state, bad.parked_reason, bad.cron) == ("ACTIVE", "", "*/2 * * * *")
    clock.advance(5 * MINUTE)
    materialize_due(clock=clock, horizon=timedelta(0))
    assert Occurrence.objects.filter(schedule=bad).exists()


def test_the_admin_lists_and_filters_parked_schedules_with_their_reason(
    setup: dict[str, Any], admin_client: Any
) -> None:
    corrupt(setup["bad"])
    two_passes(setup["clock"])
    url = reverse("admin:django_app_schedule_changelist")
    page = admin_client.get(url, {"state__exact": "PARKED"})
    assert page.status_code == 200
    html = page.content.decode()
    assert ">bad<" in html
    assert ">good<" not in html
    assert "cannot plan the stored timing" in html  # the reason, next to the badge
    assert 'data-state="PARKED"' in html


@pytest.mark.concurrent_db
@pytest.mark.django_db(transaction=True)
def test_a_park_that_waited_for_a_cancel_leaves_the_schedule_canceled(
    settings: Any, tenant: Any
) -> None:
    """The materializer read the schedule ACTIVE and decided to park it; a cancel held the
    row meanwhile. The park's conditions (ACTIVE, the version and cursor it read) must be
    judged on the row as the cancel left it, not on the read before the wait."""
    settings.CELERY_SCHEDULER = {"validate_task_names": False, "bulk_materialize": False}
    clock = FrozenClock(NOW)
    bad = api.create_schedule(
        tenant="acme", name="bad", task="billing.ping", cron="* * * * *", clock=clock
    )
    corrupt(bad)
    clock.advance(MINUTE)
    canceled, park_waits = threading.Event(), threading.Event()

    def cancel() -> None:
        with transaction.atomic():
            api.cancel_schedule(bad.pk, clock=clock)
            canceled.set()
            assert park_waits.wait(timeout=20), "the park never waited for the schedule row"

    def plan() -> None:
        assert canceled.wait(timeout=20)
        materialize_due(clock=clock, horizon=timedelta(0))

    assert run_threads(cancel, plan, lambda: wait_for_a_lock_waiter(canceled, park_waits)) == []
    bad.refresh_from_db()
    assert bad.state == "CANCELED"
