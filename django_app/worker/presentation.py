"""How a scheduled run presents itself to Celery: as the user's task, not the wrapper.

Every occurrence is published as ``celery_scheduler.run_occurrence`` (the wrapper claims,
fences and settles it). Celery's tools look at the *task being traced*: result backend,
worker log line, ``task-*`` events, ``task_prerun``/``task_postrun``/``task_success``/
``task_failure``/``task_retry`` signals, and through those Flower, Sentry's Celery
integration and OpenTelemetry's Celery instrumentation. So the worker traces each
occurrence with the *user's* task:

- :class:`OccurrenceRequest` (the wrapper's ``Request`` class, in the consumer) shows the
  user's args and kwargs in ``task-received`` and takes the user task's
  ``time_limit``/``soft_time_limit`` when the message sets none;
- :func:`install` (at ``worker_init``, before any tracer is built) gives every task a
  ``run`` that, inside a scheduled run of that task only, does the wrapper's work (claim,
  run, settle) around the task's own body. Integrations that wrap ``run`` when Celery
  builds the tracer (Sentry) wrap that one, so they see the scheduler's RETRY as a Celery
  retry. A task with ``autoretry_for`` gets it one level down, on ``_orig_run``: Celery's
  autoretry wrapper stays in place and passes the scheduler's Retry through;
- :class:`OccurrenceTask` (the wrapper's base class, in the pool) replaces the wrapper's
  tracer: it runs the occurrence through the *user's task's* own tracer. The signals'
  ``sender`` is the user's task object; results are stored per its ``ignore_result`` and
  ``result_extended``, under the message's task id (the occurrence id).

A task whose tracer was built before :func:`install` ran (a worker that does not send
``worker_init``) runs through the wrapper's own tracer, as every scheduled run did before
(see docs/howto/celery-tools.md).
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from billiard.einfo import ExceptionWithTraceback  # type: ignore[attr-defined]
from celery import Task, states
from celery.app import trace as celery_trace
from celery.app.task import Context
from celery.exceptions import Retry, TimeLimitExceeded
from celery.utils.saferepr import saferepr
from celery.worker.request import Request

from celery_scheduler.publishers import RUN_OCCURRENCE_TASK

#: The wrapper kwargs that hold the user's call.
_TASK, _ARGS, _KWARGS = "task", "args", "kwargs"


def user_call(wrapper_kwargs: Any) -> tuple[str, list[Any], dict[str, Any]] | None:
    """``(task name, args, kwargs)`` of the user's task in a wrapper message's kwargs."""
    if not isinstance(wrapper_kwargs, dict) or not isinstance(wrapper_kwargs.get(_TASK), str):
        return None
    return (
        wrapper_kwargs[_TASK],
        list(wrapper_kwargs.get(_ARGS) or ()),
        dict(wrapper_kwargs.get(_KWARGS) or {}),
    )


class OccurrenceRequest(Request):
    """The worker's request for a wrapper message, showing the user's call (consumer side)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: The user's task and call, when the worker has the task.
        self._user_call: tuple[Any, list[Any], dict[str, Any]] | None = None
        call = user_call(self.kwargs)
        if call is None:
            return
        name, user_args, user_kwargs = call
        app = self.task.app
        amqp = app.amqp
        maxlevels = app.conf.task_repr_maxlevels
        # task-received (and so Flower) shows these: the user's call, as apply_async would.
        self._argsrepr = saferepr(user_args, amqp.argsrepr_maxsize, maxlevels=maxlevels)
        self._kwargsrepr = saferepr(user_kwargs, amqp.kwargsrepr_maxsize, maxlevels=maxlevels)
        target = app.tasks.get(name)
        hard, soft = self.time_limits
        if target is not None and hard is None and soft is None:
            # apply_async puts the task's own limits in the message; ours carries the
            # wrapper's (none), so the pool would enforce none.
            self.time_limits = (target.time_limit, target.soft_time_limit)
        self._user_call = (target, user_args, user_kwargs) if target is not None else None

    def on_timeout(self, soft: bool, timeout: float) -> None:
        """A time limit, reported as the user's task (see :meth:`_as_user_task`): a hard
        one kills the process running the body, so the consumer, not the task's tracer,
        reports it (log line, result backend, the task's ``on_failure``, ``task_failure``,
        ``task-failed``). The scheduler needs nothing here: the run's lease lapses and the
        reaper retries it (the rerun reports its own outcome under the same id) or, on its
        last attempt, dead-letters it."""
        with self._as_user_task(hard_limit=not soft):
            super().on_timeout(soft, timeout)

    def on_failure(
        self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
    ) -> None:
        """The pool's report of a process killed by a hard time limit goes here too: as the
        user's task as well. Every other failure is the wrapper's, as before (a failure
        the task's tracer reported needs only its message acknowledged; a lost process's
        message is requeued or retried as the wrapper, which claims the run again)."""
        exc = getattr(exc_info, "exception", None)
        if isinstance(exc, ExceptionWithTraceback):
            exc = exc.exc
        with self._as_user_task(hard_limit=isinstance(exc, TimeLimitExceeded)):
            super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)

    @contextmanager
    def _as_user_task(self, *, hard_limit: bool) -> Iterator[None]:
        """While Celery's consumer reports on a run (the process running it is gone), the
        request is the user's task's: its name, task object (``on_failure``, the signals'
        sender, its backend and ``ignore_result``), args, kwargs and context. What decides
        the wrapper message's fate (ack, reject, requeue) stays the wrapper's: its options
        are lent to the user's task object meanwhile, which only a process that runs one
        handler at a time may do (:func:`_one_handler_at_a_time`: prefork, where hard time
        limits are enforced, and solo)."""
        if not hard_limit or self._user_call is None or not _one_handler_at_a_time():
            yield
            return
        target, user_args, user_kwargs = self._user_call
        celery_request: Any = self  # Celery's private attributes, which its stubs omit
        context = Context(celery_request._context.__dict__)
        context.update(task=target.name, shadow=None, args=user_args, kwargs=user_kwargs)
        ignore_result = celery_request._request_dict.get("ignore_result")
        view = {
            "_task": target,
            "name": target.name,
            "_args": user_args,
            "_kwargs": user_kwargs,
            "_ignore_result": target.ignore_result if ignore_result is None else ignore_result,
        }
        wrapper = self.task
        lent = {a: getattr(wrapper, a) for a in _MESSAGE_FATE if hasattr(wrapper, a)}
        owned = {a: target.__dict__[a] for a in lent if a in target.__dict__}
        # Celery's Request keeps these in slots; its _context is a cached_property (in
        # the instance's __dict__, which is where it is read from once set).
        saved = {key: getattr(self, key) for key in view}
        cached = self.__dict__.get("_context")
        for key, value in view.items():
            setattr(self, key, value)
        self.__dict__["_context"] = context
        for attr, value in lent.items():
            setattr(target, attr, value)
        try:
            yield
        finally:
            for attr in lent:
                if attr in owned:
                    setattr(target, attr, owned[attr])
                else:
                    target.__dict__.pop(attr, None)
            for key, value in saved.items():
                setattr(self, key, value)
            if cached is None:
                self.__dict__.pop("_context", None)
            else:
                self.__dict__["_context"] = cached


#: The task options Celery's consumer reads to decide what becomes of a message after a
#: time limit (``Request.on_timeout``; ``on_failure`` with ``TimeLimitExceeded``).
_MESSAGE_FATE = ("acks_late", "acks_on_timeout", "acks_on_failure")


def _one_handler_at_a_time() -> bool:
    """Whether this process runs the consumer's handlers one at a time: in the main
    thread, without green threads (prefork and solo pools). Only there may an option be
    lent to a task object for the length of a handler; elsewhere (threads, gevent,
    eventlet) the handler reports as the wrapper, as it always did."""
    if threading.current_thread() is not threading.main_thread():
        return False
    gevent = sys.modules.get("gevent.monkey")
    if gevent is not None and gevent.is_module_patched("threading"):
        return False
    eventlet = sys.modules.get("eventlet.patcher")
    return not (eventlet is not None and eventlet.is_monkey_patched("thread"))


@dataclass(frozen=True, slots=True)
class Job:
    """One scheduled run being traced as its task: passed to that task's ``run``."""

    wrapper: OccurrenceTask
    target: Any
    wrapper_kwargs: dict[str, Any]
    request: dict[str, Any]


_job: ContextVar[Job | None] = ContextVar("scheduler_traced_job", default=None)


@dataclass(slots=True)
class _Traced:
    """The scheduled run a user's tracer is running, for the task's ``retry``."""

    target: Any
    #: The scheduler's decision once it settled the run ("RETRY_WAIT", "DEAD", ...).
    settled: str | None = None


_traced: ContextVar[_Traced | None] = ContextVar("scheduler_traced_run", default=None)


def settled(outcome: str) -> None:
    """Record that the scheduler has settled the run being traced (see :func:`_retry`)."""
    traced = _traced.get()
    if traced is not None:
        traced.settled = outcome


def retry_delay(exc: BaseException, now: datetime) -> float | None:
    """The seconds a body's ``task.retry(countdown=/eta=)`` asked for, if ``exc`` is its
    Retry; None for any other exception."""
    if not isinstance(exc, Retry):
        return None
    when = exc.when
    if isinstance(when, datetime):
        when = when if when.tzinfo is not None else when.replace(tzinfo=UTC)
        return max(0.0, (when - now).total_seconds())
    return max(0.0, float(when)) if isinstance(when, int | float) else None


def _retry(task: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    """``task.retry`` that, inside a scheduled run of ``task``, publishes nothing.

    Celery's ``retry`` sends the task again as a plain message under the same id; in a
    scheduled run the scheduler retries through its outbox (fenced, counted, under the
    same occurrence id), so here it only raises Celery's Retry for the scheduler to
    settle: after ``countdown`` (or ``eta``), else the task's ``default_retry_delay``, as
    Celery would. Asked after the scheduler settled the run (Celery's ``autoretry_for``
    wrapper, around the run the scheduler already dead-lettered or set to retry), it
    raises what the scheduler decided: the failure itself, or its Retry.
    """

    @functools.wraps(original)
    def retry(
        args: Any = None, kwargs: Any = None, exc: Exception | None = None,
        throw: bool = True, eta: datetime | None = None, countdown: Any = None,
        max_retries: int | None = None, **options: Any,
    ) -> Any:  # fmt: skip
        traced = _traced.get()
        if traced is None or traced.target is not task:
            return original(
                args=args, kwargs=kwargs, exc=exc, throw=throw, eta=eta, countdown=countdown,
                max_retries=max_retries, **options,
            )  # fmt: skip
        if traced.settled is not None:
            if traced.settled != "RETRY_WAIT" and exc is not None:
                raise exc
            raise Retry(exc=exc, when=countdown)
        when: Any = eta or (countdown if countdown is not None else task.default_retry_delay)
        ret = Retry(exc=exc, when=when)
        if throw:
            raise ret
        return ret

    return retry


#: Marks a task whose ``run`` (or ``_orig_run``) :func:`install` replaced.
_INSTALLED = "_scheduler_runs_occurrences"


def install(app: Any) -> None:
    """Let every task of ``app`` run as a scheduled run (idempotent; before tracers exist)."""
    for task in list(app.tasks.values()):
        if task.name != RUN_OCCURRENCE_TASK and not task.name.startswith("celery."):
            install_task(task)


def on_worker_init(sender: Any, **_: Any) -> None:
    """``worker_init`` handler (connected in ``AppConfig.ready``)."""
    install(sender.app)


def install_task(task: Any) -> None:
    """Replace ``task.run`` (``task._orig_run`` under ``autoretry_for``) with a function
    that runs the body as-is, except inside a scheduled run of this very task."""
    if getattr(task, _INSTALLED, False):
        return
    # Under autoretry_for, run is Celery's wrapper whose task.retry() re-sends the message:
    # the scheduler's work goes beneath it, and its Retry passes through the wrapper.
    attr = "_orig_run" if callable(getattr(task, "_orig_run", None)) else "run"
    body: Callable[..., Any] = getattr(task, attr)

    @functools.wraps(body)
    def run(*args: Any, **kwargs: Any) -> Any:
        job = _job.get()
        if job is None or job.target is not task:
            return body(*args, **kwargs)
        token = _job.set(None)  # the body calling its own task directly runs it plainly
        try:
            return job.wrapper.run_scheduled(job, body, list(args), kwargs)
        finally:
            _job.reset(token)

    setattr(task, attr, run)
    task.retry = _retry(task, task.retry)
    _defer_started(task)
    setattr(task, _INSTALLED, True)


#: Where a task instance's own ``track_started`` goes once :class:`_TrackStarted` is set.
_OWN_TRACK_STARTED = "_scheduler_own_track_started"
_UNSET = object()


class _TrackStarted:
    """``track_started`` on the class of a task that runs scheduled: false while the task's
    tracer starts one of its scheduled runs, the task's own value otherwise.

    Celery's tracer stores STARTED before it calls the task, but a delivery of a scheduled
    run may then run nothing (a duplicate of a finished run, a run that must wait for a
    slot), and its STARTED would stay over the stored result, or show a waiting run as
    started. The scheduled run stores it itself once claimed (:func:`started`). A data
    descriptor on the class (the tracer reads the attribute per call); a context variable
    says which run is being traced, so other runs of the task (threads, greenlets) read
    their own value.
    """

    def __init__(self, default: Any) -> None:
        self.default = default

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return self.default
        job = _job.get()
        if job is not None and job.target is obj:
            return False
        return obj.__dict__.get(_OWN_TRACK_STARTED, self.default)

    def __set__(self, obj: Any, value: Any) -> None:
        obj.__dict__[_OWN_TRACK_STARTED] = value


def _defer_started(task: Any) -> None:
    cls = type(task)
    if not isinstance(cls.__dict__.get("track_started"), _TrackStarted):
        cls.track_started = _TrackStarted(getattr(cls, "track_started", False))
    own = task.__dict__.pop("track_started", _UNSET)  # set on the instance: keep it its own
    if own is not _UNSET:
        task.__dict__[_OWN_TRACK_STARTED] = own


def started(job: Job) -> None:
    """STARTED in the result backend for a claimed run whose task has ``track_started``,
    just before its body, as Celery's tracer stores it for ``apply_async``."""
    target = job.target
    ignore_result = job.request.get("ignore_result")  # the message's, else the task's
    if ignore_result is None:
        ignore_result = target.ignore_result
    if target.track_started and not ignore_result:
        target.backend.store_result(
            job.request.get("id"),
            {"pid": os.getpid(), "hostname": job.request.get("hostname")},
            states.STARTED,
            request=Context(job.request),
        )


class OccurrenceTask(Task):
    """Base class of the wrapper task: traces each occurrence as the user's task.

    Subclasses implement :meth:`run_scheduled`. The worker sets every task's
    ``__trace__`` at start (and reads it per message); here the setter keeps the
    wrapper's own tracer (for messages whose task cannot be traced as itself) and the
    getter returns the dispatcher.
    """

    Request = "django_app.worker.presentation:OccurrenceRequest"

    _own_trace: Any = None

    def run_scheduled(
        self, job: Job, body: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]
    ) -> Any:
        raise NotImplementedError

    @property
    def __trace__(self) -> Callable[..., Any]:
        return self._dispatch

    @__trace__.setter
    def __trace__(self, tracer: Any) -> None:
        self._own_trace = tracer

    def _dispatch(
        self, uuid: str, args: Any, kwargs: Any, request: dict[str, Any] | None = None
    ) -> Any:
        call = user_call(kwargs)
        target = self.app.tasks.get(call[0]) if call is not None else None
        if target is not None and target.__trace__ is None:
            install_task(target)  # no tracer yet: nothing has bound its run
        if call is None or target is None or not getattr(target, _INSTALLED, False):
            return self._wrapper_tracer()(uuid, args, kwargs, request)
        name, user_args, user_kwargs = call
        context = dict(request or {})
        # What the result backend (result_extended) and task.request show: the user's call.
        context.update(task=name, shadow=None, args=user_args, kwargs=user_kwargs)
        if target.__trace__ is None:
            target.__trace__ = celery_trace.build_tracer(
                name, target, app=self.app, hostname=context.get("hostname")
            )
        token = _job.set(Job(wrapper=self, target=target, wrapper_kwargs=kwargs, request=context))
        traced = _traced.set(_Traced(target=target))
        try:
            return target.__trace__(uuid, user_args, user_kwargs, context)
        finally:
            _traced.reset(traced)
            _job.reset(token)

    def _wrapper_tracer(self) -> Any:
        if self._own_trace is None:
            self._own_trace = celery_trace.build_tracer(self.name, self, app=self.app)
        return self._own_trace
