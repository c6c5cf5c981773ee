"""What Celery's consumer does with a wrapper message when the process that ran it is gone.

:class:`django_app.worker.presentation.OccurrenceRequest` against Celery's own ``Request``
handlers, in-process (a message built by Celery's ``as_task_v2``, an in-memory result
backend): a hard time limit is reported as the user's task while the wrapper message's
fate (ack, reject, requeue, a re-send) stays the wrapper's; every other failure is handled
exactly as Celery handles the wrapper's.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from billiard.einfo import ExceptionInfo
from celery import Celery, signals
from celery.exceptions import TimeLimitExceeded, WorkerLostError
from celery.worker.request import Request
from kombu.message import Message
from kombu.utils.json import dumps

from django_app.worker.presentation import OccurrenceRequest

app = Celery("requests", broker="memory://", backend="cache+memory://", set_as_current=False)
WRAPPER = "requests.wrapper"


# The wrapper's options as django_app.tasks declares them.
@app.task(name=WRAPPER, ignore_result=True, acks_late=True, reject_on_worker_lost=True)
def wrapper(occurrence_id: str, task: str, args: Any = None, kwargs: Any = None) -> None: ...


# A task whose own options would decide otherwise (a dead-letter exchange's setup).
@app.task(name="user.t", acks_on_failure_or_timeout=False)
def user(x: int) -> None: ...


def request(kind: type[Request], log: list[str]) -> Any:
    task_id = str(uuid.uuid4())
    call = {"occurrence_id": task_id, "task": "user.t", "args": [7], "kwargs": {}}
    sent = app.amqp.as_task_v2(task_id, WRAPPER, args=(), kwargs=call)
    message = Message(
        body=dumps(sent.body), headers=sent.headers, content_type="application/json",
        content_encoding="utf-8", delivery_info={"exchange": "", "routing_key": "celery"},
    )  # fmt: skip
    return kind(
        message, app=app, task=app.tasks[WRAPPER],
        on_ack=lambda *_: log.append("ack"),
        on_reject=lambda _log, _errors, requeue: log.append(f"reject(requeue={requeue})"),
    )  # fmt: skip


def failed(exc: BaseException) -> ExceptionInfo:
    try:
        raise exc
    except BaseException:
        return ExceptionInfo()


@pytest.fixture
def failures() -> Iterator[list[tuple[str, Any]]]:
    seen: list[tuple[str, Any]] = []

    def on_failure(sender: Any = None, args: Any = None, **_: Any) -> None:
        seen.append((sender.name, args))

    signals.task_failure.connect(on_failure, weak=False)
    yield seen
    signals.task_failure.disconnect(on_failure)


@pytest.mark.parametrize(
    ("exc", "return_ok"),
    [(ValueError("boom"), True), (ValueError("boom"), False), (WorkerLostError("lost"), False)],
)
def test_other_failures_are_the_wrappers_as_before(exc: BaseException, return_ok: bool) -> None:
    """A failure the task's tracer reported, or a lost process: the same acks and reports
    as Celery's own Request gives the wrapper (seen failing: a user task's
    acks_on_failure_or_timeout=False rejected the wrapper message)."""
    outcomes = []
    for kind in (Request, OccurrenceRequest):
        log: list[str] = []
        request(kind, log).on_failure(failed(exc), return_ok=return_ok)
        outcomes.append(log)
    assert outcomes[0] == outcomes[1]


def test_a_lost_process_is_retried_as_the_wrapper(monkeypatch: pytest.MonkeyPatch) -> None:
    """With task_retry_on_worker_lost the consumer re-sends the message: the wrapper's,
    which claims the run again (seen failing: the user's task, sent straight to the
    broker, would run beside the reaper's retry)."""
    from celery.canvas import Signature

    monkeypatch.setattr(
        app.tasks[WRAPPER], "retry_on_worker_lost", True
    )  # task_retry_on_worker_lost
    sent: list[Any] = []
    monkeypatch.setattr(Signature, "apply_async", lambda self, *a, **k: sent.append(self.task))
    request(OccurrenceRequest, []).on_failure(failed(WorkerLostError("lost")))
    assert sent == [WRAPPER]


def test_a_hard_time_limit_is_the_users_task_and_the_message_the_wrappers(
    failures: list[tuple[str, Any]],
) -> None:
    log: list[str] = []
    req = request(OccurrenceRequest, log)
    req.on_failure(failed(TimeLimitExceeded(1)))
    assert log == ["ack"]  # the wrapper's acks_late with acks_on_timeout, not the user's
    assert failures == [("user.t", [7])]
    meta = app.backend.get_task_meta(req.id)
    assert meta["status"] == "FAILURE"
    # Nothing of the user's task was left changed.
    left: Any = app.tasks["user.t"]
    assert (left.acks_late, left.acks_on_failure) == (False, False)
    assert req.task is app.tasks[WRAPPER]


def test_off_the_main_thread_a_hard_time_limit_stays_the_wrappers(
    failures: list[tuple[str, Any]],
) -> None:
    """Threads and green threads run handlers side by side: no option is lent there (seen
    failing: two interleaved handlers left the wrapper's options on the user's task)."""
    log: list[str] = []
    done = threading.Event()

    def handle() -> None:
        request(OccurrenceRequest, log).on_failure(failed(TimeLimitExceeded(1)))
        done.set()

    threading.Thread(target=handle).start()
    assert done.wait(10)
    assert log == ["ack"]
    assert failures == [(WRAPPER, [])]
    assert "acks_late" not in vars(app.tasks["user.t"])
