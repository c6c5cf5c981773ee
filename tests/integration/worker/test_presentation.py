"""The wrapper's tracer hands a scheduled run to the user task's own Celery tracer (issue 23).

In-process, with Celery's real tracer and an in-memory result backend (the processes, Redis,
Flower, Sentry and OpenTelemetry are in tests/acceptance/test_celery_tools.py): results are
stored per the user task's ``ignore_result``, the signals' sender is the user's task, and a
duplicate delivery stores nothing over the result of the attempt that ran.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from celery import Celery, signals

from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.publishers import RUN_OCCURRENCE_TASK
from celery_scheduler.tasks import idempotent_task
from django_app.tasks import run_occurrence
from django_app.worker import presentation
from tests.integration.worker_support import make_occurrence, make_schedule, message_kwargs

pytestmark = pytest.mark.django_db
app = Celery(
    "presentation-tests", broker="memory://", backend="cache+memory://", set_as_current=False
)
assert run_occurrence.name == RUN_OCCURRENCE_TASK  # a shared task: on this app too


@app.task(name="p.kept")
def kept(x: int) -> dict[str, int]:
    return {"double": 2 * x}


@app.task(name="p.ignored", ignore_result=True)
def ignored() -> str:
    return "not stored"


@app.task(name="p.raises")
def raises() -> None:
    raise ValueError("bad row")


@app.task(name="p.retries", bind=True)
def retries(self: Any) -> None:
    raise self.retry(exc=ConnectionError("vendor down"), countdown=10)


notified: list[str] = []


@idempotent_task(app=app, name="p.notify")
def notify(to: str) -> str:
    notified.append(to)
    return to


@app.task(name="p.notifies_twice")
def notifies_twice() -> None:
    notify("a@example.com")
    notify("b@example.com")


@app.task(name="p.ignores")
def ignores() -> None:
    from celery.exceptions import Ignore

    raise Ignore()


@app.task(name="p.superseded")
def superseded() -> None:
    # Another worker re-claimed the run meanwhile (its lease had lapsed): a new token.
    from django.db.models import F

    from celery_scheduler.tasks import current_occurrence_id
    from django_app.models import Occurrence

    Occurrence.objects.filter(pk=str(current_occurrence_id())).update(
        fencing_token=F("fencing_token") + 1
    )
    raise ValueError("failed after losing the run")


@app.task(name="p.tracked", track_started=True)
def tracked(fail: bool) -> str:
    # What the result backend shows while the body runs (STARTED, as for apply_async).
    from celery_scheduler.tasks import current_occurrence_id

    seen_running.append(app.AsyncResult(str(current_occurrence_id())).state)
    if fail:
        raise ValueError("bad row")
    return "done"


seen_running: list[str] = []


@app.task(name="p.autoretries", autoretry_for=(ConnectionError,), max_retries=3)
def autoretries() -> None:
    raise ConnectionError("vendor down")


def deliver(occ: Any) -> Any:
    """What the pool does with one wrapper message: ``tasks[name].__trace__(...)``."""
    wrapper = app.tasks[RUN_OCCURRENCE_TASK]
    request = {"id": str(occ.id), "hostname": "w@test", "delivery_info": {}, "retries": 0}
    return wrapper.__trace__(str(occ.id), (), message_kwargs(occ), request)


@pytest.fixture(autouse=True)
def installed() -> None:
    presentation.install(app)


def test_the_result_is_the_users_under_the_occurrence_id_and_signals_name_the_user_task(
    tenant: Any, frozen_clock: FrozenClock
) -> None:
    senders: list[Any] = []

    def on_success(sender: Any = None, **_: Any) -> None:
        senders.append(sender)

    signals.task_success.connect(on_success, weak=False)
    try:
        occ = make_occurrence(make_schedule(tenant, task="p.kept", args=[21]), frozen_clock.now())
        deliver(occ)
    finally:
        signals.task_success.disconnect(on_success)
    result = app.AsyncResult(str(occ.id))
    assert (result.state, result.result) == ("SUCCESS", {"double": 42})
    assert senders == [app.tasks["p.kept"]]
    # A duplicate delivery is IGNORED: it runs nothing and stores nothing over the result.
    deliver(occ)
    assert app.AsyncResult(str(occ.id)).result == {"double": 42}


def test_ignore_result_is_honoured_and_a_failure_is_a_celery_failure(
    tenant: Any, frozen_clock: FrozenClock
) -> None:
    quiet = make_occurrence(make_schedule(tenant, task="p.ignored"), frozen_clock.now())
    deliver(quiet)
    assert app.AsyncResult(str(quiet.id)).state == "PENDING"
    failing = make_schedule(tenant, task="p.raises", max_attempts=1)
    occ = make_occurrence(failing, frozen_clock.now())
    deliver(occ)
    result = app.AsyncResult(str(occ.id))
    assert result.state == "FAILURE"
    assert isinstance(result.result, ValueError)
    assert "bad row" in str(result.result)


def deliver_watching_publishes(occ: Any, task: str) -> list[str]:
    """Deliver ``occ``; the plain messages of ``task`` published meanwhile (none expected:
    a scheduled run is retried through the outbox)."""
    seen: list[str] = []

    def on_publish(sender: Any = None, **_: Any) -> None:
        if sender == task:
            seen.append(sender)

    signals.before_task_publish.connect(on_publish, weak=False)
    try:
        deliver(occ)
    finally:
        signals.before_task_publish.disconnect(on_publish)
    return seen


def test_the_bodys_own_retry_goes_through_the_scheduler_after_its_countdown(
    tenant: Any, frozen_clock: FrozenClock
) -> None:
    """Celery's task.retry() sent the task again as a plain message under the occurrence
    id, and the scheduler retried it through its outbox too: the body ran twice more."""
    occ = make_occurrence(make_schedule(tenant, task="p.retries"), frozen_clock.now())
    assert deliver_watching_publishes(occ, "p.retries") == []
    occ.refresh_from_db()
    assert occ.state == "RETRY_WAIT"
    attempt = occ.attempts.get()
    assert attempt.finished_at is not None
    assert occ.retry_at is not None
    assert abs((occ.retry_at - attempt.finished_at).total_seconds() - 10) < 1
    result = app.AsyncResult(str(occ.id))
    assert result.state == "RETRY"
    assert isinstance(result.result, ConnectionError)


@pytest.mark.parametrize("task", ["p.retries", "p.autoretries"])
def test_a_run_with_no_retry_left_is_a_celery_failure_and_sends_nothing(
    tenant: Any, frozen_clock: FrozenClock, task: str
) -> None:
    """On its last attempt the run goes DEAD: Celery's autoretry wrapper (max_retries 3)
    retried it anyway as a plain message, shown as RETRY while the occurrence was DEAD."""
    occ = make_occurrence(make_schedule(tenant, task=task, max_attempts=1), frozen_clock.now())
    assert deliver_watching_publishes(occ, task) == []
    occ.refresh_from_db()
    assert occ.state == "DEAD"
    result = app.AsyncResult(str(occ.id))
    assert result.state == "FAILURE"
    assert isinstance(result.result, ConnectionError)


def test_an_attempt_that_lost_its_run_reports_no_failure(
    tenant: Any, frozen_clock: FrozenClock
) -> None:
    """Its failure write is refused (a stale token): the attempt that owns the run reports
    what becomes of it; this one stored a FAILURE under the occurrence id."""
    occ = make_occurrence(make_schedule(tenant, task="p.superseded"), frozen_clock.now())
    deliver(occ)
    occ.refresh_from_db()
    assert (occ.state, occ.fencing_token) == ("RUNNING", 2)
    assert app.AsyncResult(str(occ.id)).state == "PENDING"


def test_a_run_of_a_task_this_worker_does_not_know_is_not_a_celery_success(
    tenant: Any, frozen_clock: FrozenClock
) -> None:
    """Dead-lettered as before, but the wrapper returned its outcome dict: task-succeeded,
    Flower's SUCCESS and a "succeeded" log line for a run that could not start. Celery's
    own answer is NotRegistered."""
    from celery.exceptions import NotRegistered

    failures: list[Any] = []

    def on_failure(exception: Any = None, **_: Any) -> None:
        failures.append(exception)

    signals.task_failure.connect(on_failure, weak=False)
    try:
        occ = make_occurrence(make_schedule(tenant, task="p.gone"), frozen_clock.now())
        deliver(occ)
    finally:
        signals.task_failure.disconnect(on_failure)
    occ.refresh_from_db()
    assert occ.state == "DEAD"
    assert [type(e) for e in failures] == [NotRegistered]


def test_a_body_that_raises_ignore_ends_its_run_without_a_retry(
    tenant: Any, frozen_clock: FrozenClock
) -> None:
    """Celery's Ignore (also what self.replace() raises after sending its replacement)
    was an unknown error to the scheduler: transient, so retried up to max_attempts."""
    occ = make_occurrence(make_schedule(tenant, task="p.ignores"), frozen_clock.now())
    deliver(occ)
    occ.refresh_from_db()
    assert (occ.state, occ.attempt_count) == ("SUCCEEDED", 1)
    assert app.AsyncResult(str(occ.id)).state == "PENDING"  # Ignore: nothing stored


def test_an_idempotent_task_called_twice_in_a_run_without_a_key_is_refused(
    tenant: Any, frozen_clock: FrozenClock
) -> None:
    """Both calls took the run's id as their key: the second returned the first's result
    and its effect (the mail to b) silently never happened."""
    notified.clear()
    occ = make_occurrence(make_schedule(tenant, task="p.notifies_twice"), frozen_clock.now())
    deliver(occ)
    occ.refresh_from_db()
    assert notified == ["a@example.com"]
    assert occ.state == "DEAD"
    assert "MissingIdempotencyKey" in occ.last_error
    assert "called again in the same scheduled run" in occ.last_error


@pytest.mark.parametrize("fail", [False, True])
def test_track_started_shows_started_while_the_body_runs_and_never_over_a_result(
    tenant: Any, frozen_clock: FrozenClock, fail: bool
) -> None:
    """With ``track_started``, Celery's tracer stores STARTED before it calls the task: a
    delivery that then runs nothing (a duplicate, a deferral) left STARTED over the stored
    FAILURE, or over nothing while the run waited. STARTED is stored once the run is
    claimed, before its body. Seen failing: STARTED after the duplicate of a failed run,
    and after a deferral."""
    seen_running.clear()
    schedule = make_schedule(tenant, task="p.tracked", args=[fail], max_attempts=1)
    occ = make_occurrence(schedule, frozen_clock.now())
    deliver(occ)
    assert seen_running == ["STARTED"]
    final = "FAILURE" if fail else "SUCCESS"
    assert app.AsyncResult(str(occ.id)).state == final
    deliver(occ)  # a duplicate: runs nothing
    assert seen_running == ["STARTED"]
    assert app.AsyncResult(str(occ.id)).state == final

    # A run that must wait (its own cap is taken by a run still going): nothing stored.
    capped = make_schedule(tenant, task="p.tracked", args=[False], concurrency_limit=1)
    holder = make_occurrence(capped, frozen_clock.now())
    waiter = make_occurrence(capped, frozen_clock.now() + timedelta(seconds=1))
    from django_app.worker import claim

    assert claim.claim(holder.id, worker="w").claimed  # the wrapper's clock: the system's
    deliver(waiter)
    assert app.AsyncResult(str(waiter.id)).state == "PENDING"
