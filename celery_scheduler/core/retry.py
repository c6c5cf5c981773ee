"""Retry decisions: classify a task failure and compute the backoff, without I/O.

The worker hands in the exception, how many attempts of this run were used, the policy
and the occurrence deadline; :func:`decide` says "retry after N seconds" or "dead, because".

Classification order (first match wins):

1. the policy's ``permanent_errors`` (user-declared) -> PERMANENT;
2. the policy's ``transient_errors`` (user-declared, plus the task's ``autoretry_for``) ->
   TRANSIENT;
3. an HTTP status on the exception (``exc.status_code`` or ``exc.response.status_code``):
   429 and 5xx -> TRANSIENT, other 4xx -> PERMANENT (the request itself is wrong);
4. built-in permanent: ``TypeError``, ``ValueError``, ``KeyError`` (bad parameters; includes
   ``errors.ValidationError`` and ``errors.NotJSONSerializable``) and
   ``errors.MissingIdempotencyKey`` (the code must pass ``key=``) -> PERMANENT;
5. built-in transient: ``errors.TransientError`` (and ``Throttled``), ``ConnectionError``,
   ``TimeoutError``, ``OSError`` (socket errors are ``OSError``) -> TRANSIENT;
6. anything else -> TRANSIENT. An unknown error is retried because the budget
   (``max_attempts`` and the deadline) bounds the cost of being wrong, whereas sending a
   passing glitch straight to DEAD needs a human to replay it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from celery_scheduler import errors

PERMANENT_BUILTINS: tuple[type[BaseException], ...] = (
    TypeError, ValueError, KeyError, errors.MissingIdempotencyKey,
)  # fmt: skip
TRANSIENT_BUILTINS: tuple[type[BaseException], ...] = (
    errors.TransientError,
    ConnectionError,
    TimeoutError,
    OSError,
)


class ErrorClass(StrEnum):
    PERMANENT = "PERMANENT"
    TRANSIENT = "TRANSIENT"


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How one task (or schedule) retries. ``max_attempts`` counts the first attempt too."""

    max_attempts: int = 5
    backoff_base: float = 1.0
    backoff_cap: float = 300.0
    permanent_errors: tuple[type[BaseException], ...] = ()
    transient_errors: tuple[type[BaseException], ...] = ()
    #: False: the ceiling itself, no jitter (Celery's fixed ``default_retry_delay``).
    jitter: bool = True

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise errors.InvalidPolicy(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.backoff_base <= 0 or self.backoff_cap < self.backoff_base:
            raise errors.InvalidPolicy(
                f"need 0 < backoff_base <= backoff_cap, got base={self.backoff_base} "
                f"cap={self.backoff_cap}"
            )


@dataclass(frozen=True, kw_only=True)
class RetryDecision:
    """``delay`` is set (seconds) iff the failure should be retried."""

    error_class: ErrorClass
    delay: float | None
    reason: str

    @property
    def retry(self) -> bool:
        return self.delay is not None


def http_status(exc: BaseException) -> int | None:
    """The HTTP status an exception carries (``requests``/``httpx`` style), if any."""
    for holder in (exc, getattr(exc, "response", None)):
        status = getattr(holder, "status_code", None)
        if isinstance(status, int) and not isinstance(status, bool):
            return status
    return None


def classify(exc: BaseException, policy: RetryPolicy | None = None) -> ErrorClass:
    """PERMANENT (goes DEAD) or TRANSIENT (retried within budget); see the module doc."""
    policy = policy or RetryPolicy()
    if policy.permanent_errors and isinstance(exc, policy.permanent_errors):
        return ErrorClass.PERMANENT
    if policy.transient_errors and isinstance(exc, policy.transient_errors):
        return ErrorClass.TRANSIENT
    status = http_status(exc)
    if status is not None and 400 <= status < 600:
        if status == 429 or status >= 500:
            return ErrorClass.TRANSIENT
        return ErrorClass.PERMANENT
    if isinstance(exc, PERMANENT_BUILTINS):
        return ErrorClass.PERMANENT
    return ErrorClass.TRANSIENT


def backoff_delay(
    retry_number: int,
    *,
    base: float,
    cap: float,
    rng: random.Random | None = None,
    jitter: bool = True,
) -> float:
    """Full jitter: ``uniform(0, min(cap, base * 2**retry_number))`` seconds.

    ``jitter=False`` returns the ceiling itself.

    ``retry_number`` is 0 for the first retry. Full jitter (rather than equal jitter)
    spreads a burst of failures over the whole window, so retries of a top-of-hour batch
    do not come back as a second synchronized burst.
    """
    if retry_number < 0:
        raise ValueError(f"retry_number must be >= 0, got {retry_number}")
    # Cap the exponent so huge retry numbers do not overflow float.
    ceiling = min(cap, base * 2 ** min(retry_number, 64))
    if not jitter:
        return ceiling
    return (rng or random.Random()).uniform(0, ceiling)


def decide(
    exc: BaseException,
    *,
    attempts_used: int,
    policy: RetryPolicy,
    now: datetime,
    deadline: datetime | None = None,
    rng: random.Random | None = None,
    requested_delay: float | None = None,
) -> RetryDecision:
    """Retry or dead-letter the failure of attempt number ``attempts_used`` of this run.

    Dead when: the error is permanent; ``attempts_used >= policy.max_attempts``; or the
    retry would start after ``deadline``. ``requested_delay``: the body asked for a retry
    itself (Celery's ``task.retry(countdown=...)``): transient whatever ``exc`` is, after
    that many seconds instead of the backoff.
    """
    error_class = ErrorClass.TRANSIENT if requested_delay is not None else classify(exc, policy)
    name = type(exc).__name__
    if error_class is ErrorClass.PERMANENT:
        return RetryDecision(error_class=error_class, delay=None, reason=f"permanent error {name}")
    if attempts_used >= policy.max_attempts:
        return RetryDecision(
            error_class=error_class,
            delay=None,
            reason=f"{name} after {attempts_used} of {policy.max_attempts} attempts",
        )
    delay = requested_delay
    if delay is None:
        delay = backoff_delay(
            attempts_used - 1 if attempts_used > 0 else 0,
            base=policy.backoff_base,
            cap=policy.backoff_cap,
            rng=rng,
            jitter=policy.jitter,
        )
    if deadline is not None and now + timedelta(seconds=delay) > deadline:
        return RetryDecision(
            error_class=error_class,
            delay=None,
            reason=f"{name}: a retry in {delay:.1f}s would pass the deadline "
            f"{deadline.isoformat()}",
        )
    return RetryDecision(
        error_class=error_class, delay=delay, reason=f"transient error {name}, retrying"
    )
