"""The user task's own options on scheduled runs, and the run's context in the body (issue 23).

- ``autoretry_for`` / ``max_retries`` / ``default_retry_delay`` / ``retry_backoff`` retry a
  scheduled run as Celery would retry the task (``policy_for``);
- ``expires`` is refused at create time, naming the field, with nothing written;
- ``current_occurrence()`` gives the body its schedule, version, tenant, scheduled time
  (UTC, local, nominal), attempt and origin (scheduled, run_now, backfill, replay).

The worker-side presentation (results, events, signals, Sentry, OpenTelemetry) is proven
with real processes in tests/acceptance/test_celery_tools.py.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from celery import Celery, shared_task

from celery_scheduler import api, current_occurrence, errors
from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.tasks import Origin, ScheduledRun
from django_app.http import tokens
from django_app.models import Occurrence, Schedule
from django_app.schedules.backfill import BACKFILL_VERSION
from django_app.tasks import execute, policy_for
from django_app.worker import claim
from tests.integration.http.http_support import HttpClient
from tests.integration.worker_support import make_occurrence, make_schedule, message_kwargs

pytestmark = pytest.mark.django_db
app = Celery("options-tests", set_as_current=False)
runs: list[ScheduledRun | None] = []
fail_next: list[bool] = []


@app.task(name="o.context")
def context_task() -> str:
    runs.append(current_occurrence())
    if fail_next and fail_next.pop():
        raise ValueError("bad data")
    return "ok"


@app.task(name="o.autoretry", autoretry_for=(ConnectionError,), max_retries=2)
def autoretry_task() -> None:
    raise ConnectionError("reset")


@shared_task(name="tests.options.expiring", expires=60)
def expiring() -> None:
    """Registered on the current app, where create-time validation looks tasks up."""


def claimed(**fields: Any) -> claim.ClaimResult:
    return claim.ClaimResult(
        outcome=claim.ClaimOutcome.CLAIMED, occurrence_id=uuid.uuid4(), **fields
    )


def test_autoretry_for_retries_as_celery_would_max_retries_and_a_fixed_countdown() -> None:
    task = app.tasks["o.autoretry"]
    task.default_retry_delay = 7
    policy = policy_for(task, claimed())
    # max_retries=2: three attempts; not retry_backoff: Celery's fixed default_retry_delay.
    assert (policy.max_attempts, policy.backoff_base, policy.backoff_cap) == (3, 7.0, 7.0)
    assert policy.jitter is False
    assert ConnectionError in policy.transient_errors
    # The schedule's own max_attempts still wins.
    assert policy_for(task, claimed(max_attempts=5)).max_attempts == 5


@app.task(name="o.autoretry_but", autoretry_for=(Exception,), dont_autoretry_for=(ValueError,))
def autoretry_but_task() -> None:
    raise ValueError("bad input")


def test_dont_autoretry_for_fails_at_once_as_celery_would() -> None:
    """autoretry_for=(Exception,) made every error transient, dont_autoretry_for ignored:
    a ValueError was retried (Celery fails it at once)."""
    from celery_scheduler.core import retry

    policy = policy_for(app.tasks["o.autoretry_but"], claimed())
    assert retry.classify(ValueError("bad input"), policy) is retry.ErrorClass.PERMANENT
    assert retry.classify(ConnectionError("reset"), policy) is retry.ErrorClass.TRANSIENT


def test_retry_backoff_keeps_celerys_exponential_backoff_and_jitter() -> None:
    task: Any = app.tasks["o.autoretry"]
    task.retry_backoff, task.retry_backoff_max, task.retry_jitter = 2, 60, False
    try:
        policy = policy_for(task, claimed())
    finally:
        task.retry_backoff, task.retry_backoff_max, task.retry_jitter = False, 600, True
    assert (policy.backoff_base, policy.backoff_cap, policy.jitter) == (2.0, 60.0, False)


def test_a_task_with_expires_is_refused_at_create_time_naming_the_field() -> None:
    before = Schedule.objects.count()
    with pytest.raises(errors.ValidationError) as caught:
        api.create_schedule(name="expiring", task="tests.options.expiring", interval=60)
    assert caught.value.field == "task"
    assert "expires=60" in str(caught.value)
    assert "deadline" in str(caught.value)
    assert Schedule.objects.count() == before  # nothing half-written


def run(occ: Any, clock: FrozenClock, *, manual: bool = False) -> dict[str, Any]:
    message = message_kwargs(occ)
    if manual:  # an operator's occurrence, as run_now and backfill create them
        Occurrence.objects.filter(pk=occ.pk).update(manual=True)
        message["scheduler_manual"] = True
    return execute(
        app, str(occ.id), occ.schedule.task, [], {}, worker_name="w", clock=clock,
        lease=timedelta(seconds=30), message=message,
    )  # fmt: skip


def test_current_occurrence_describes_the_scheduled_run(
    tenant: Any, frozen_clock: FrozenClock
) -> None:
    schedule = make_schedule(tenant, task="o.context", timezone="Europe/Paris")
    occ = make_occurrence(schedule, frozen_clock.now())
    assert run(occ, frozen_clock)["outcome"] == "SUCCEEDED"
    seen = runs[-1]
    assert seen is not None
    assert seen.occurrence_id == str(occ.id)
    assert (seen.schedule_id, seen.schedule_version) == (str(schedule.id), schedule.version)
    assert (seen.tenant, seen.tenant_id) == ("acme", tenant.id)
    assert seen.scheduled_for == datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    assert seen.scheduled_for_local.isoformat() == "2026-03-01T13:00:00+01:00"
    assert seen.nominal == datetime(2026, 3, 1, 13, 0)
    assert (seen.attempt, seen.origin) == (1, Origin.SCHEDULED)
    assert current_occurrence() is None  # only inside the body


def test_origin_run_now_backfill_and_replay(tenant: Any, frozen_clock: FrozenClock) -> None:
    schedule = make_schedule(tenant, task="o.context")
    occ = make_occurrence(schedule, frozen_clock.now())
    run(occ, frozen_clock, manual=True)
    assert runs[-1] is not None
    assert runs[-1].origin is Origin.RUN_NOW

    schedule.version = BACKFILL_VERSION  # backfills live under version 0
    backfilled = make_occurrence(schedule, frozen_clock.now() - timedelta(hours=1))
    run(backfilled, frozen_clock, manual=True)
    assert runs[-1] is not None
    assert runs[-1].origin is Origin.BACKFILL

    schedule = make_schedule(tenant, task="o.context", max_attempts=1)
    dead = make_occurrence(schedule, frozen_clock.now())
    fail_next.append(True)
    assert run(dead, frozen_clock)["outcome"] == "DEAD"
    api.replay_occurrence(dead.id)
    assert run(dead, frozen_clock)["outcome"] == "SUCCEEDED"
    last = runs[-1]
    assert last is not None
    assert (last.origin, last.attempt) == (Origin.REPLAY, 1)


@pytest.mark.django_db(transaction=True)
def test_http_refuses_a_task_with_expires_with_a_400_naming_the_field(live_server: Any) -> None:
    api.create_tenant("acme", name="Acme")
    client = HttpClient(live_server.url, token=tokens.issue("acme", "ci").secret)
    body = {"name": "expiring", "task": "tests.options.expiring", "interval": 60}
    reply = client.post("schedules/", body)
    assert (reply.status, reply.body["field"]) == (400, "task"), reply.body
    assert "expires=60" in str(reply.body)
    assert Schedule.objects.count() == 0
