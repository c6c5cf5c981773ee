"""``celery_scheduler.run_occurrence``: the wrapper task every scheduled occurrence runs through.

The relay publishes each occurrence as this task (task id = occurrence id). The wrapper
claims it (fenced lease, overlap policy, concurrency slot, version/cancel re-check), runs the
registered task's body with the occurrence id in context while the process's heartbeat thread
renews the lease, then completes it or, by error class, schedules a retry through the outbox or
dead-letters it, all under its fencing token.

Celery's own retry is used only when the claim itself failed on the database: the body did
not run, and the copy re-sent names the claims its tries may have committed, which its own
claim takes back as they stand (:func:`django_app.worker.claim.claim`). Retries of a claimed
occurrence go through the outbox instead, so every try keeps the occurrence id and is a new
Attempt.
"""

from __future__ import annotations

import logging
import os
import random
import time
import traceback
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

from celery import Task, shared_task
from celery.app.task import X_DEATH_HEADERS  # type: ignore[attr-defined]  # not in the stubs
from celery.exceptions import Ignore, MaxRetriesExceededError, NotRegistered, Retry
from django.db import DatabaseError, InterfaceError

from celery_scheduler import errors
from celery_scheduler.core import retry
from celery_scheduler.core.clock import SYSTEM_CLOCK, Clock
from celery_scheduler.faults import fault_point
from celery_scheduler.publishers import HEADER_MANUAL
from celery_scheduler.tasks import Origin, ScheduledRun, occurrence_context
from django_app import conf, observe
from django_app.db.connections import drop_if_broken, reset_after_error
from django_app.schedules.backfill import BACKFILL_VERSION
from django_app.worker import claim, finish, idempotency, presentation
from django_app.worker import heartbeat as heartbeats
from django_app.worker.idempotency import as_json

logger = logging.getLogger("celery_scheduler.worker")

#: Attempts to record a completion when the database flickers after the body ran.
_FINISH_TRIES = 3


def policy_for(
    target: Any, claimed: claim.ClaimResult, *, default_max_attempts: int | None = None
) -> retry.RetryPolicy:
    """Schedule fields win over task attributes, which win over the settings default.

    A task with Celery's ``autoretry_for`` retries as Celery would retry it: up to
    ``max_retries`` (or ``retry_kwargs["max_retries"]``) retries, after
    ``default_retry_delay`` (or ``retry_kwargs["countdown"]``) seconds, or with
    ``retry_backoff``/``retry_backoff_max``/``retry_jitter`` when it backs off.
    """
    autoretry = tuple(getattr(target, "autoretry_for", ()) or ())
    retry_kwargs = dict(getattr(target, "retry_kwargs", None) or {})
    celery_attempts = None
    if autoretry:
        max_retries = retry_kwargs.get("max_retries", getattr(target, "max_retries", None))
        celery_attempts = None if max_retries is None else int(max_retries) + 1
    max_attempts = (
        claimed.max_attempts
        or getattr(target, "max_attempts", None)
        or celery_attempts
        or default_max_attempts
        or conf.get().default_max_attempts  # a direct call (tests): read here
    )
    backoff = getattr(target, "retry_backoff", False)
    jitter = True
    if autoretry and not backoff:
        # Celery's fixed countdown; RetryPolicy needs a positive base.
        fixed = retry_kwargs.get("countdown", getattr(target, "default_retry_delay", None))
        base = cap = max(float(fixed if fixed is not None else 180), 0.001)
        jitter = False
    else:
        base = float(backoff) if not isinstance(backoff, bool) and backoff else 1.0
        cap = float(getattr(target, "retry_backoff_max", None) or 600)
        if autoretry:
            jitter = bool(getattr(target, "retry_jitter", True))
    return retry.RetryPolicy(
        max_attempts=max_attempts,
        backoff_base=base,
        backoff_cap=max(cap, base),
        # Celery's dont_autoretry_for: those fail at once under autoretry_for (checked first).
        permanent_errors=tuple(getattr(target, "permanent_errors", ()) or ())
        + (tuple(getattr(target, "dont_autoretry_for", ()) or ()) if autoretry else ()),
        transient_errors=tuple(getattr(target, "transient_errors", ()) or ()) + autoretry,
        jitter=jitter,
    )


def _finish(action: str, call: Any, occurrence_id: str, clock: Clock = SYSTEM_CLOCK) -> bool:
    """Run a fenced write, riding out a brief DB outage; False if it was rejected as stale.

    Each retry runs on a new connection: the one that failed may be dead (a killed backend,
    a failover), and reusing it would fail every retry and leave the occurrence RUNNING
    until its lease expires and the reaper runs it again.
    """
    for attempt in range(_FINISH_TRIES):
        try:
            call()
            return True
        except errors.StaleWrite:
            return False  # logged and counted by the store
        except (DatabaseError, InterfaceError):
            reset_after_error()
            if attempt == _FINISH_TRIES - 1:
                # The lease will expire and the reaper will re-run it; the idempotency
                # record (if any) makes that re-run return the stored result.
                logger.exception(
                    "could not record %s of occurrence %s",
                    action,
                    occurrence_id,
                    extra={"event": "outcome_write_failed", "occurrence_id": occurrence_id},
                )
                return False
            clock.sleep(2**attempt)
    return False


#: The header of a wrapper message re-sent after its claim failed: ``[name, tried_at]`` of
#: its earlier tries (``tried_at`` in Unix seconds), whose claims the copy's claim may take
#: back (:func:`django_app.worker.claim.claim`).
HEADER_CLAIMED_AS = "scheduler_claimed_as"


def claimed_as(message: Mapping[str, Any] | None) -> list[str]:
    """The names a re-sent message's earlier tries claimed under (empty for a first try)."""
    return [name for name, _ in _tries(message)]


def _tries(message: Mapping[str, Any] | None) -> list[tuple[str, float]]:
    entries = (message or {}).get(HEADER_CLAIMED_AS)
    if not isinstance(entries, list):
        return []
    return [
        (entry[0], float(entry[1]))
        for entry in entries
        if isinstance(entry, list | tuple) and len(entry) == 2
        and isinstance(entry[0], str) and isinstance(entry[1], int | float)
    ]  # fmt: skip


def names_to_resend(
    message: Mapping[str, Any] | None, worker_name: str, *, now: float, lease_seconds: float
) -> list[list[Any]]:
    """The header of the copy a failed claim sends: this try after the earlier ones (a try
    whose claim failed before it committed must not hide one that committed), each kept
    while a claim it made could still be live (younger than a lease)."""
    live = [[name, at] for name, at in _tries(message) if at > now - lease_seconds]
    return [*live, [worker_name, now]]


class ClaimUnconfirmed(errors.CoordinationUnavailable):
    """The claim failed on the database and may have committed (its reply lost): the body
    did not run. ``resend_as`` is the header the copy the wrapper re-sends carries."""

    def __init__(self, message: str, *, resend_as: list[list[Any]]) -> None:
        super().__init__(message)
        self.resend_as = resend_as


def claim_name(hostname: str | None) -> str:
    """The name a delivery claims under: the worker process, and a nonce of this delivery
    (only a copy re-sent by this delivery can take its claim back; see ``HEADER_CLAIMED_AS``)."""
    return f"{(hostname or 'worker')[:160]}/{os.getpid()}#{uuid.uuid4().hex[:12]}"


def execute(
    app: Any,
    occurrence_id: str,
    task: str,
    args: list[Any],
    kwargs: dict[str, Any],
    *,
    worker_name: str,
    clock: Clock = SYSTEM_CLOCK,
    lease: timedelta | None = None,
    body: Callable[[], Any] | None = None,
    message: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Claim, run and settle one occurrence; returns what happened (for logs and tests).

    ``body`` runs the user's task (default: ``target(*args, **kwargs)``); the traced path
    passes the task's own ``run``, under the request Celery's tracer already pushed.
    ``message``: the wrapper's kwargs and headers, for :func:`current_occurrence`.
    """
    settings = conf.get()  # the worker's entry point: read once, passed down
    lease = lease or timedelta(seconds=settings.occurrence_lease_seconds)
    drop_if_broken()  # a connection kept from an earlier task may have been broken by it
    sent_for = message_time(message)
    try:
        claimed = claim.claim(
            occurrence_id, worker=worker_name, clock=clock, lease=lease, scheduled_for=sent_for,
            taking_back=claimed_as(message),
        )  # fmt: skip
    except errors.CoordinationUnavailable as exc:
        resend_as = names_to_resend(
            message, worker_name, now=time.time(), lease_seconds=lease.total_seconds()
        )
        raise ClaimUnconfirmed(str(exc), resend_as=resend_as) from exc
    if not claimed.claimed:
        return {"outcome": claimed.outcome.value, "reason": claimed.reason}
    token = claimed.fencing_token
    assert token is not None
    target = app.tasks.get(task)
    if target is None:
        error = f"UnknownTask: no task {task!r} is registered in this worker"
        _dead_letter_unrun(occurrence_id, token, error, claimed, clock)
        return {"outcome": "DEAD", "reason": error, "unknown_task": True}
    policy = policy_for(target, claimed, default_max_attempts=settings.default_max_attempts)
    if claimed.attempts_in_run > policy.max_attempts:
        return _exhausted(occurrence_id, task, token, claimed, policy.max_attempts, clock)
    if not lease_still_held(claimed, lease, clock):
        return {"outcome": "LEASE_LOST", "reason": "the lease lapsed before the body started"}
    heartbeat = heartbeats.hold(
        occurrence_id, token, lease, clock, claimed.scheduled_for,
        holds_slot=claimed.slot is not None,
    )  # fmt: skip
    try:
        with occurrence_context(
            occurrence_id, tenant_id=claimed.tenant_id, fencing_token=token, clock=clock,
            run=scheduled_run(claimed, message, sent_for),
        ):  # fmt: skip
            value = body() if body is not None else target(*args, **kwargs)
    except Ignore:
        # Celery's "this task ends here, record nothing" (and self.replace(), which sent
        # its replacement): the run is over, not failed. Recorded as done, then Celery's
        # own Ignore goes on up (its state is not stored).
        heartbeat.stop()  # before the completion, as on success: no renewal after it
        ignored = _settle_success(occurrence_id, token, None, claimed, clock)
        return {**ignored, "ignored": True}
    except Exception as exc:
        heartbeat.stop()
        decision = retry.decide(
            exc,
            attempts_used=claimed.attempts_in_run,
            policy=policy,
            now=clock.now(),
            deadline=claimed.deadline,
            rng=random.Random(),
            # The body's own task.retry(countdown=...): its delay, through the outbox.
            requested_delay=presentation.retry_delay(exc, clock.now()),
        )
        retry_at = None
        if decision.delay is not None:
            retry_at = clock.now() + timedelta(seconds=decision.delay)
        # The whole traceback: it is what the admin shows on the attempt and the occurrence.
        error = "".join(traceback.format_exception(exc)).strip()
        error = f"{error}\n[{decision.reason}]"
        ok = _finish(
            "failure",
            lambda: finish.fail(
                occurrence_id,
                token,
                error,
                retry_at=retry_at,
                clock=clock,
                scheduled_for=claimed.scheduled_for,
            ),
            occurrence_id,
            clock,
        )
        if ok:
            _ran(claimed, clock)
        outcome = ("RETRY_WAIT" if retry_at else "DEAD") if ok else "STALE_WRITE"
        return {
            "outcome": outcome, "reason": decision.reason, "token": token,
            "exception": exc, "retry_at": retry_at, "delay": decision.delay,
        }  # fmt: skip
    finally:
        heartbeat.stop()
    fault_point("worker.after_effect")
    return {**_settle_success(occurrence_id, token, value, claimed, clock), "value": value}


def _settle_success(
    occurrence_id: str, token: int, value: Any, claimed: claim.ClaimResult, clock: Clock
) -> dict[str, Any]:
    """Write a finished body's completion: SUCCEEDED, or STALE_WRITE if the run was lost."""
    result = _jsonable(value)
    ok = _finish(
        "completion",
        lambda: finish.complete(
            occurrence_id, token, result, clock=clock, scheduled_for=claimed.scheduled_for
        ),
        occurrence_id,
        clock,
    )
    if ok:
        _ran(claimed, clock)
    return {"outcome": "SUCCEEDED" if ok else "STALE_WRITE", "result": result, "token": token}


def message_time(message: Mapping[str, Any] | None) -> datetime | None:
    """The occurrence's scheduled time as its message carries it (None if it does not)."""
    if message is None or not message.get("scheduled_for"):
        return None
    return datetime.fromisoformat(str(message["scheduled_for"])).astimezone(UTC)


def scheduled_run(
    claimed: claim.ClaimResult, message: Mapping[str, Any] | None, sent_for: datetime | None
) -> ScheduledRun | None:
    """The body's view of its run: the claim's facts plus the message's (no query);
    ``sent_for`` is the message's time (:func:`message_time`)."""
    if message is None or sent_for is None:
        return None
    # The row's time, as the claim read it (the fence's lookup uses it as the partition
    # key); the message's is the same instant.
    scheduled_for = claimed.scheduled_for or sent_for
    version = int(message.get("schedule_version") or 0)
    attempt = claimed.attempts_in_run or 1
    if (claimed.attempt_number or 1) > attempt:
        origin = Origin.REPLAY  # attempts before the last dead-letter: a replayed run
    elif message.get(HEADER_MANUAL):
        origin = Origin.BACKFILL if version == BACKFILL_VERSION else Origin.RUN_NOW
    else:
        origin = Origin.SCHEDULED
    return ScheduledRun(
        occurrence_id=str(claimed.occurrence_id),
        schedule_id=str(message.get("schedule_id") or ""),
        schedule_version=version,
        tenant=claimed.tenant,
        tenant_id=claimed.tenant_id,
        scheduled_for=scheduled_for,
        timezone=claimed.timezone,
        attempt=attempt,
        origin=origin,
    )


def lease_still_held(claimed: claim.ClaimResult, lease: timedelta, clock: Clock) -> bool:
    """Whether the body may start: a claim older than one renewal period is renewed first.

    A worker stalled between its claim and the body (SIGSTOP, a long pause, a frozen VM)
    may have lost the lease meanwhile, to the reaper and perhaps to an update that then
    cancelled the occurrence. Fencing rolls back the body's database writes, not what it
    sends elsewhere, so a body never starts on a lease it cannot renew. The common case (the
    body starts right after the claim) costs nothing.
    """
    assert claimed.fencing_token is not None
    assert claimed.started_at is not None
    if clock.now() - claimed.started_at < lease / 3:  # the heartbeat's renewal period
        return True
    return finish.renew(
        claimed.occurrence_id, claimed.fencing_token, clock=clock, lease=lease,
        scheduled_for=claimed.scheduled_for, holds_slot=claimed.slot is not None,
    )  # fmt: skip


def _exhausted(
    occurrence_id: str,
    task: str,
    token: int,
    claimed: claim.ClaimResult,
    budget: int,
    clock: Clock,
) -> dict[str, Any]:
    """Settle, unrun, a run whose earlier attempts lost their lease (their workers died or
    stalled, or a completion write was lost) until this claim went past the task's budget
    (the reaper, which cannot see the task's own, left it to the claim).

    An ``@idempotent_task`` body that did its effect under this occurrence recorded it: the
    run is done (SUCCEEDED with the stored result), as a re-run would have found. Otherwise
    it is dead-lettered."""
    done, stored = idempotency.recorded_effect(
        occurrence_id, tenant_id=claimed.tenant_id, task_name=task
    )
    if done:
        return {**_settle_success(occurrence_id, token, stored, claimed, clock), "value": stored}
    error = (
        f"attempts exhausted: all {budget} used, the last one's lease lost "
        f"(its worker died or stalled); not run again"
    )
    ok = _dead_letter_unrun(occurrence_id, token, error, claimed, clock)
    return {"outcome": "DEAD" if ok else "STALE_WRITE", "reason": error}


def _dead_letter_unrun(
    occurrence_id: str, token: int, error: str, claimed: claim.ClaimResult, clock: Clock
) -> bool:
    """Dead-letter the claimed run without running its body; False if the write did not
    land (a stale token, or the database gone for every try)."""
    ok = _finish(
        "failure",
        lambda: finish.fail(
            occurrence_id, token, error, clock=clock, scheduled_for=claimed.scheduled_for
        ),
        occurrence_id,
        clock,
    )
    if ok:
        _ran(claimed, clock)
    return ok


def _ran(claimed: claim.ClaimResult, clock: Clock) -> None:
    """``state_seconds{state="RUNNING"}``: the claim's time to the committed finish."""
    if claimed.started_at is not None:
        seconds = (clock.now() - claimed.started_at).total_seconds()
        observe.left_state(claimed.tenant, "RUNNING", seconds)


def _jsonable(value: Any) -> Any:
    try:
        return as_json(value, "occurrence result")
    except errors.NotJSONSerializable:
        return {"repr": repr(value)[:1000]}


class RunOccurrenceTask(presentation.OccurrenceTask):
    """The wrapper's class: the worker traces each run as the user's task (see
    :mod:`django_app.worker.presentation`), with this body around the user's ``run``."""

    def run_scheduled(
        self,
        job: presentation.Job,
        body: Callable[..., Any],
        args: list[Any],
        kwargs: dict[str, Any],
    ) -> Any:
        occurrence_id = str(job.wrapper_kwargs["occurrence_id"])
        worker_name = claim_name(job.request.get("hostname"))
        try:
            outcome = execute(
                self.app, occurrence_id, job.target.name, args, kwargs,
                worker_name=worker_name, body=lambda: _started(job, body, args, kwargs),
                message={**job.request, **job.wrapper_kwargs},
            )  # fmt: skip
        except ClaimUnconfirmed as exc:
            # The body did not run. The claim may have committed with its reply lost: the
            # copy re-sent carries the names it may have been made under, to take it back.
            retries = int(job.request.get("retries") or 0)
            countdown = min(60, 2 ** min(retries, 6))
            logger.warning("claim of %s deferred %ss: %s", occurrence_id, countdown, exc)
            self._resend(job, countdown, retries + 1, claimed_as=exc.resend_as)
            raise Retry(exc=exc, when=countdown) from exc
        _log_outcome(occurrence_id, outcome)
        presentation.settled(outcome["outcome"])
        failure = outcome.pop("exception", None)
        if failure is not None and outcome["outcome"] in SETTLED_BY_THIS_ATTEMPT:
            report_failure(failure, outcome)
        if outcome["outcome"] != "SUCCEEDED" or outcome.get("ignored"):
            # Not run by this delivery (a duplicate, a deferral, a lapsed lease) or
            # superseded (a stale write): the attempt that owns the run reports it.
            raise Ignore()
        return outcome["value"]

    def _resend(
        self, job: presentation.Job, countdown: int, retries: int, *, claimed_as: list[list[Any]]
    ) -> None:
        headers = {k: v for k, v in job.request.items() if k.startswith("scheduler_")}
        headers[HEADER_CLAIMED_AS] = claimed_as
        routing_key = (job.request.get("delivery_info") or {}).get("routing_key")
        self.app.send_task(
            self.name, kwargs=job.wrapper_kwargs, task_id=job.request["id"],
            countdown=countdown, shadow=job.target.name, headers=headers, retries=retries,
            **({"queue": routing_key} if routing_key else {}),
        )  # fmt: skip


def _started(
    job: presentation.Job, body: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]
) -> Any:
    """The claimed run's body, after its STARTED (``track_started``, see presentation)."""
    presentation.started(job)
    return body(*args, **kwargs)


def _log_outcome(occurrence_id: str, outcome: dict[str, Any]) -> None:
    # A success is what Celery's own worker line says ("Task <task>[<occurrence id>]
    # succeeded in ..."): ours is DEBUG then. The outcomes Celery cannot tell (a duplicate
    # delivery, a deferral, a lapsed lease, a stale write) and the failures stay INFO.
    succeeded = outcome["outcome"] == "SUCCEEDED"
    logger.log(
        logging.DEBUG if succeeded else logging.INFO,
        "occurrence %s: %s",
        occurrence_id,
        outcome["outcome"],
        extra={
            "event": "occurrence_run",
            "occurrence_id": occurrence_id,
            "outcome": outcome["outcome"],
        },
    )


# acks_late + reject_on_worker_lost: a worker that dies before (or while) running the
# wrapper gives the message back to the broker instead of having acked it on receipt, so a
# crash between receiving and claiming does not wait for the redelivery timeout. A copy that
# arrives while the first is still running, or after it finished, is a duplicate at the claim.
# ignore_result: only the wrapper's own tracer (a task that cannot be traced as itself, an
# unknown task) runs this function; the traced path stores per the user's task.
@shared_task(
    name="celery_scheduler.run_occurrence",
    base=RunOccurrenceTask,
    bind=True,
    max_retries=None,
    ignore_result=True,
    acks_late=True,
    reject_on_worker_lost=True,
)
def run_occurrence(
    self: Task[Any, Any],
    occurrence_id: str,
    task: str,
    args: list[Any] | None = None,
    kwargs: dict[str, Any] | None = None,
    schedule_id: str | None = None,
    schedule_version: int | None = None,
    scheduled_for: str | None = None,
) -> dict[str, Any]:
    """Run one scheduled occurrence (see the module docstring)."""
    worker_name = claim_name(self.request.hostname)
    try:
        message = {
            "schedule_id": schedule_id, "schedule_version": schedule_version,
            "scheduled_for": scheduled_for,
            HEADER_MANUAL: getattr(self.request, HEADER_MANUAL, None),
            HEADER_CLAIMED_AS: getattr(self.request, HEADER_CLAIMED_AS, None),
        }  # fmt: skip
        outcome = execute(
            self.app, occurrence_id, task, list(args or ()), dict(kwargs or {}),
            worker_name=worker_name, message=message,
        )  # fmt: skip
    except ClaimUnconfirmed as exc:
        # As in run_scheduled: the copy re-sent may take back a claim whose reply was lost.
        countdown = min(60, 2 ** min(self.request.retries, 6))
        logger.warning("claim of %s deferred %ss: %s", occurrence_id, countdown, exc)
        # Celery's own retry drops RabbitMQ's dead-letter headers: so does this one.
        kept = {k: v for k, v in (self.request.headers or {}).items() if k not in X_DEATH_HEADERS}
        headers = {**kept, HEADER_CLAIMED_AS: exc.resend_as}
        raise self.retry(exc=exc, countdown=countdown, headers=headers) from exc
    _log_outcome(occurrence_id, outcome)
    outcome.pop("value", None)  # the wrapper's own result is its outcome dict
    failure = outcome.pop("exception", None)
    if failure is not None and outcome["outcome"] in SETTLED_BY_THIS_ATTEMPT:
        report_failure(failure, outcome)
    if outcome.get("unknown_task"):
        # Dead-lettered (recorded): Celery's own word for it, not a success of the wrapper.
        raise NotRegistered(task)
    return outcome


#: A failed body's outcomes this attempt recorded; after a stale write (another attempt owns
#: the run now) that attempt reports what becomes of it, not this one.
SETTLED_BY_THIS_ATTEMPT = frozenset({"RETRY_WAIT", "DEAD"})


def report_failure(exc: Exception, outcome: dict[str, Any]) -> NoReturn:
    """Let Celery see the body's failure, after the scheduler has recorded its own state.

    A retry the scheduler will make (RETRY_WAIT, through the outbox under the same id) is a
    Celery RETRY ("Retry in <delay>s", as ``task.retry(countdown=)`` says); anything else is
    a FAILURE carrying the original exception and traceback, so worker logs, events, Flower,
    ``task_failure`` handlers and Sentry's Celery integration all see it. Neither re-sends
    the message: the scheduler owns retries.
    """
    if outcome["outcome"] == "RETRY_WAIT":
        delay = float(outcome.get("delay") or 0)
        when: Any = int(delay) if delay.is_integer() else round(delay, 3)
        raise Retry(exc=exc.exc if isinstance(exc, Retry) else exc, when=when)
    if isinstance(exc, Retry):  # the body's task.retry() with no retry left: as Celery says
        raise exc.exc or MaxRetriesExceededError(
            f"no retry left for this run ({outcome.get('reason', '')})"
        )
    raise exc
