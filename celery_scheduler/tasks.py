"""``@idempotent_task``: a Celery task whose business effect happens once per key.

Usage::

    from celery_scheduler import idempotent_task

    @idempotent_task(key=lambda customer, period: f"invoice:{customer}:{period}")
    def create_invoice(customer: str, period: str) -> dict: ...

The key comes from ``key(*args, **kwargs)`` (the task's own arguments, without ``self``
for ``bind=True`` tasks). Without ``key=`` it is the occurrence id when the task runs as a
scheduled occurrence, else the Celery task id (``.delay()``). Keys longer than 255
characters are stored as ``sha256:<hex>``.

Keys live in a namespace of (tenant, task name): the same key string in another tenant or
in another task is another effect. The tenant is the occurrence's (set by the scheduler's
wrapper task from the claimed occurrence, the tenant named in the ``scheduler_tenant``
message header); a task run outside the scheduler (``.delay()``, a direct call) has no
tenant and uses the default namespace (tenant NULL) of its task name.

The first run, in ONE database transaction: insert ``IdempotencyRecord(key)`` under its
unique constraint, run the body, store its JSON result, commit. A crash rolls back both the
effect (database writes made by the body) and the record, so a retry runs the body again. A
concurrent run of the same key waits on the unique index and then returns the stored result;
later deliveries return it without running the body. Because the record and the effect
commit together, only database effects are covered exactly; for an external call, pass
:func:`current_idempotency_key` as the downstream API's idempotency key.

Results must be JSON-serialisable (:class:`errors.NotJSONSerializable` otherwise, and the
transaction rolls back). Every delivery returns the JSON form of the result, so the first
run and a deduplicated one return equal values.

This module imports no Django at import time: the ORM is reached inside the task body.
"""

from __future__ import annotations

import enum
import functools
import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast, overload
from zoneinfo import ZoneInfo

from celery_scheduler import errors, ports
from celery_scheduler.core.clock import SYSTEM_CLOCK, Clock

if TYPE_CHECKING:
    from celery import Celery, Task

P = ParamSpec("P")
R = TypeVar("R")

_occurrence_id: ContextVar[str | None] = ContextVar("scheduler_occurrence_id", default=None)
_idempotency_key: ContextVar[str | None] = ContextVar("scheduler_idempotency_key", default=None)
_tenant_id: ContextVar[int | None] = ContextVar("scheduler_tenant_id", default=None)
_fence: ContextVar[tuple[int, Clock] | None] = ContextVar("scheduler_fence", default=None)
#: Idempotent tasks that took the running occurrence's id as their key (a fresh set per run).
_keyed_by_run: ContextVar[set[str] | None] = ContextVar("scheduler_keyed_by_run", default=None)


class Origin(enum.StrEnum):
    """Why an occurrence runs: its trigger, a "run now", a backfill, or a dead-letter replay."""

    SCHEDULED = "scheduled"
    RUN_NOW = "run_now"
    BACKFILL = "backfill"
    REPLAY = "replay"


@dataclass(frozen=True, kw_only=True)
class ScheduledRun:
    """What the body of a scheduled run can know about it (:func:`current_occurrence`).

    ``scheduled_for`` is the instant the schedule fired for, in UTC: the same value for
    every attempt and every redelivery of the run, so a key built from it is one key per
    period. ``attempt`` counts from 1 (a replay starts its count again at 1).
    """

    occurrence_id: str
    schedule_id: str
    schedule_version: int
    tenant: str
    tenant_id: int | None
    scheduled_for: datetime
    timezone: str
    attempt: int
    origin: Origin

    @property
    def scheduled_for_local(self) -> datetime:
        """``scheduled_for`` in the schedule's own zone (aware)."""
        return self.scheduled_for.astimezone(ZoneInfo(self.timezone))

    @property
    def nominal(self) -> datetime:
        """The wall-clock time the schedule named, in its zone, without a zone (naive)."""
        return self.scheduled_for_local.replace(tzinfo=None)


_run: ContextVar[ScheduledRun | None] = ContextVar("scheduler_run", default=None)


def current_occurrence() -> ScheduledRun | None:
    """The scheduled run the current task body is (None outside one: ``.delay()``, a
    direct call)."""
    return _run.get()


MAX_KEY_LENGTH = 255


def current_occurrence_id() -> str | None:
    """The occurrence the current task body runs for (None outside a scheduled run)."""
    return _occurrence_id.get()


def current_tenant_id() -> int | None:
    """The tenant (``Tenant.pk``) of the occurrence being run (None outside a scheduled run)."""
    return _tenant_id.get()


def current_fence() -> tuple[int, Clock] | None:
    """The claim the current body runs under: its fencing token and the wrapper's clock
    (None outside a scheduled run)."""
    return _fence.get()


def current_idempotency_key() -> str | None:
    """The business key of the running ``@idempotent_task`` body (None outside one).

    Pass it as the idempotency key of an external API call so the downstream service
    deduplicates what the database transaction cannot roll back.
    """
    return _idempotency_key.get()


@contextmanager
def occurrence_context(
    occurrence_id: str,
    tenant_id: int | None = None,
    fencing_token: int | None = None,
    clock: Clock | None = None,
    run: ScheduledRun | None = None,
) -> Iterator[None]:
    """Run the enclosed body as occurrence ``occurrence_id`` of tenant ``tenant_id``.

    Set by the wrapper task; ``tenant_id`` selects the idempotency namespace (None: the
    default namespace); ``fencing_token`` is the claim's, which ``@idempotent_task``
    re-checks (lease measured on ``clock``, default the system clock) before it commits;
    ``run`` is what :func:`current_occurrence` returns.
    """
    token = _occurrence_id.set(str(occurrence_id))
    tenant_token = _tenant_id.set(tenant_id)
    fence = None if fencing_token is None else (fencing_token, clock or SYSTEM_CLOCK)
    fence_token = _fence.set(fence)
    run_token = _run.set(run)
    keyed_token = _keyed_by_run.set(set())
    try:
        yield
    finally:
        _keyed_by_run.reset(keyed_token)
        _run.reset(run_token)
        _fence.reset(fence_token)
        _tenant_id.reset(tenant_token)
        _occurrence_id.reset(token)


@contextmanager
def idempotency_context(key: str) -> Iterator[None]:
    token = _idempotency_key.set(key)
    try:
        yield
    finally:
        _idempotency_key.reset(token)


def normalize_key(raw: object, task_name: str) -> str:
    if not isinstance(raw, str) or not raw:
        raise errors.ValidationError(
            f"key= of idempotent task {task_name} returned {raw!r} "
            f"({type(raw).__name__}); it must return a non-empty str",
            field="key",
        )
    if len(raw) > MAX_KEY_LENGTH:
        return "sha256:" + hashlib.sha256(raw.encode()).hexdigest()
    return raw


def _default_key(task_name: str) -> str:
    occurrence = current_occurrence_id()
    if occurrence:
        keyed = _keyed_by_run.get()
        if keyed is not None and task_name in keyed:
            # Under the same key it would return the first call's result and not run.
            raise errors.MissingIdempotencyKey(
                f"idempotent task {task_name} was called again in the same scheduled run "
                f"({occurrence}) without key=: the run's id is the default key of its first "
                "call only, and a second call under it would return the first call's result "
                "without running; pass key= to @idempotent_task (e.g. built from the call's "
                "arguments)"
            )
        if keyed is not None:
            keyed.add(task_name)
        return occurrence
    # deferred (import-light): importing the decorator does not import Celery
    from celery import current_task

    task_id = current_task.request.id if current_task else None
    if task_id:
        return str(task_id)
    raise errors.MissingIdempotencyKey(
        f"idempotent task {task_name} has no key: it was called directly, not as a Celery "
        "task or scheduled occurrence; pass key= to @idempotent_task or use .delay()"
    )


@overload
def idempotent_task(fn: Callable[P, R], /) -> Task[P, R]: ...


@overload
def idempotent_task(
    *,
    key: Callable[..., str] | None = None,
    app: Celery | None = None,
    **options: Any,
) -> Callable[[Callable[P, R]], Task[P, R]]: ...


def idempotent_task(
    fn: Callable[P, R] | None = None,
    /,
    *,
    key: Callable[..., str] | None = None,
    app: Celery | None = None,
    **options: Any,
) -> Task[P, R] | Callable[[Callable[P, R]], Task[P, R]]:
    """Make ``fn`` a Celery task that performs its effect at most once per business key.

    ``app=`` registers it on that app (like ``@app.task``); otherwise ``shared_task``.
    Other keyword arguments are Celery task options (``name``, ``queue``, ``bind``,
    ``autoretry_for``, plus the scheduler's ``max_attempts``, ``permanent_errors``,
    ``transient_errors``).
    """

    def decorate(func: Callable[P, R]) -> Task[P, R]:
        bound = bool(options.get("bind"))
        registered: list[Task[P, R]] = []

        @functools.wraps(func)
        def body(*args: P.args, **kwargs: P.kwargs) -> R:
            task_name = registered[0].name if registered else func.__qualname__
            key_args = args[1:] if bound else args
            raw = key(*key_args, **kwargs) if key is not None else _default_key(task_name)
            the_key = normalize_key(raw, task_name)
            result = ports.backend().idempotency.run_once(
                the_key,
                task_name=task_name,
                occurrence_id=current_occurrence_id(),
                tenant_id=current_tenant_id(),
                body=lambda: func(*args, **kwargs),
            )
            return cast(R, result)  # the body's R, or the same value read back from JSON

        if app is not None:
            task: Task[P, R] = app.task(**options)(body)
        else:
            # deferred (import-light): importing the decorator does not import Celery
            from celery import shared_task

            task = shared_task(**options)(body)
        registered.append(task)
        return task

    if fn is not None:
        return decorate(fn)
    return decorate
