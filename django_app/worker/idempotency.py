"""The database side of ``@idempotent_task``: record the key and the effect in one transaction.

Records are namespaced by (tenant, task name, key): the same key string in another tenant
or task is another effect, never a hit. The unique index on that triple (on (task name,
key) for the default namespace, tenant NULL) is the arbiter. On PostgreSQL a second
inserter of an uncommitted key blocks on the index until the first transaction ends: if it
committed, the insert finds the key (``ON CONFLICT DO NOTHING``: no savepoint) and we read
its stored result; if it rolled back (crash, error),
the insert succeeds and this run does the work. SQLite serialises writers (IMMEDIATE
transactions), which gives the same outcome.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any, NoReturn

from celery import current_task
from django.db import IntegrityError, OperationalError, connection, transaction

from celery_scheduler import errors
from celery_scheduler.core.clock import SYSTEM_CLOCK
from celery_scheduler.core.enums import OccurrenceState
from celery_scheduler.tasks import current_fence, current_occurrence, idempotency_context
from django_app.models import IdempotencyRecord, Occurrence, Tenant
from django_app.worker import queries

logger = logging.getLogger("celery_scheduler.idempotency")


def as_json(value: Any, task_name: str) -> Any:
    """``value`` round-tripped through JSON, or a clear NotJSONSerializable."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as exc:
        raise errors.NotJSONSerializable(
            f"idempotent task {task_name} returned a {type(value).__module__}."
            f"{type(value).__qualname__}, which cannot be stored as JSON ({exc}); return "
            "JSON types (dict, list, str, int, float, bool, None), e.g. an id instead of "
            "a model instance"
        ) from exc


def recorded_effect(
    occurrence_id: str, *, tenant_id: int | None, task_name: str
) -> tuple[bool, Any]:
    """Whether the ``@idempotent_task`` ``task_name`` recorded its effect under
    ``occurrence_id`` (whatever its key), and the result it stored. A rare read (a run past
    its budget): the namespace's index narrows it to the task's records."""
    rows = IdempotencyRecord.objects.filter(task_name=task_name, occurrence_id=occurrence_id)
    rows = (
        rows.filter(tenant__isnull=True) if tenant_id is None else rows.filter(tenant_id=tenant_id)
    )
    row = rows.order_by("created_at").values_list("result").first()
    return (False, None) if row is None else (True, row[0])


def run_once(
    key: str,
    *,
    task_name: str,
    occurrence_id: str | None,
    body: Callable[[], Any],
    tenant_id: int | None = None,
) -> Any:
    """Run ``body`` once per (``tenant_id``, ``task_name``, ``key``); return its stored result.

    ``tenant_id`` None is the default namespace (a run outside the scheduler).
    """
    task_id = (current_task.request.id if current_task else None) or ""
    # tenant_id=None becomes "tenant IS NULL" in the lookups below.
    namespace = {"tenant_id": tenant_id, "task_name": task_name, "key": key}
    # Only a transaction of our own can be retried (the caller's would be lost with it).
    tries = 1 if transaction.get_connection().in_atomic_block else _KEY_DEADLOCK_TRIES
    for attempt in range(1, tries + 1):
        try:
            return _run_once(namespace, task_id, occurrence_id, body, tenant_id)
        except _KeyDeadlock as exc:
            if attempt == tries:
                raise exc.error from None
            logger.info("idempotent task %s: key %s deadlocked, retrying", task_name, key)
    raise AssertionError("unreachable")


#: MySQL/MariaDB: duplicate inserters of one key wait for the first one's lock on the index
#: record, and InnoDB may answer some of them with a deadlock (1213) instead of the duplicate
#: key error once it commits. The whole transaction is rolled back then, before the body ran:
#: running it again finds the key and returns the stored result.
_KEY_DEADLOCK_TRIES = 5


class _KeyDeadlock(Exception):
    """The key's insert or read was chosen as a deadlock victim (the body did not run)."""

    def __init__(self, error: OperationalError) -> None:
        super().__init__(str(error))
        self.error = error


def _is_deadlock(exc: OperationalError) -> bool:
    code = exc.args[0] if exc.args else None
    return code == 1213 or getattr(getattr(exc, "__cause__", None), "sqlstate", None) == "40P01"


def _run_once(
    namespace: dict[str, Any],
    task_id: str,
    occurrence_id: str | None,
    body: Callable[[], Any],
    tenant_id: int | None,
) -> Any:
    task_name, key = namespace["task_name"], namespace["key"]
    with transaction.atomic():
        try:
            found = not _insert_key(namespace, occurrence_id, str(task_id))
            if found:
                stored = IdempotencyRecord.objects.values_list("result", flat=True).get(**namespace)
        except OperationalError as exc:
            if _is_deadlock(exc):
                raise _KeyDeadlock(exc) from exc
            raise
        if found:
            if logger.isEnabledFor(logging.INFO):
                logger.info(
                    "idempotent task %s: key %s already done (tenant %s), returning the "
                    "stored result",
                    task_name,
                    key,
                    _tenant_label(tenant_id),
                    extra={"event": "idempotent_duplicate", "key": key, "tenant_id": tenant_id},
                )
            return stored
        with idempotency_context(key):
            value = body()
        result = as_json(value, task_name)
        fence = current_fence()
        if connection.vendor == "postgresql" and occurrence_id is not None and fence is not None:
            if not _store_fenced(namespace, result, occurrence_id, fence):
                _refuse_stale_effect(occurrence_id, task_name, fence)
            return result
        IdempotencyRecord.objects.filter(**namespace).update(result=result)
        _require_current_claim(occurrence_id, task_name)
        return result


def _tenant_label(tenant_id: int | None) -> str:
    """The tenant's slug for a log line (a row id means nothing to the reader).

    One indexed read, on the duplicate path only; ``default`` is the namespace of runs
    outside the scheduler (no tenant).
    """
    if tenant_id is None:
        return "default"
    slug = Tenant.objects.filter(pk=tenant_id).values_list("slug", flat=True).first()
    return slug if slug is not None else f"#{tenant_id}"


def _insert_key(namespace: dict[str, Any], occurrence_id: str | None, task_id: str) -> bool:
    """Insert the key's record; False if the key is already done (the unique index says).

    On PostgreSQL ``ON CONFLICT DO NOTHING`` waits on the index like a plain insert and
    needs no savepoint (two round trips fewer); elsewhere the insert runs in a savepoint
    and its IntegrityError is the answer.
    """
    if connection.vendor == "postgresql":
        params = {
            "tenant": namespace["tenant_id"], "task_name": namespace["task_name"],
            "key": namespace["key"], "id": occurrence_id, "task_id": task_id,
            "now": SYSTEM_CLOCK.now(),
        }  # fmt: skip
        with connection.cursor() as cursor:
            cursor.execute(queries.insert_key(), params)
            return cursor.fetchone() is not None
    try:
        with transaction.atomic():
            IdempotencyRecord.objects.create(
                **namespace, occurrence_id=occurrence_id, task_id=task_id
            )
    except IntegrityError:
        return False
    return True


def _store_fenced(
    namespace: dict[str, Any], result: Any, occurrence_id: str, fence: tuple[int, Any]
) -> bool:
    """PostgreSQL: store the result and take the fence's lock (what
    :func:`_require_current_claim` takes) in one round trip; False if the claim is stale."""
    token, clock = fence
    run = current_occurrence()
    # The run's time is its history partition's key: the fence's lock then plans one
    # partition instead of probing all of them for the id.
    scheduled_for = run.scheduled_for if run and run.occurrence_id == occurrence_id else None
    sql = queries.store_fenced(
        tenant_is_null=namespace["tenant_id"] is None, keyed=scheduled_for is not None
    )
    params = {
        "result": None if result is None else json.dumps(result),  # JSON null: SQL NULL
        "tenant": namespace["tenant_id"], "task_name": namespace["task_name"],
        "key": namespace["key"], "id": occurrence_id, "token": token,
        "running": OccurrenceState.RUNNING.value, "scheduled_for": scheduled_for,
    }  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    # The time once the row is locked: a fence that waited for it (a duplicate delivery's
    # claim held it) judges the lease as of its commit, not of its request.
    return row is not None and row[1] is not None and row[1] > clock.now()


def _require_current_claim(occurrence_id: str | None, task_name: str) -> None:
    """Refuse to commit the effect of a scheduled run whose claim is no longer current.

    A worker stalled past its lease (GC pause, SIGSTOP) wakes after the reaper re-queued its
    run and maybe another worker took it, and its concurrency slot, over. Fencing the
    scheduler's rows is not enough: its effect would commit beside the new owner's. Under
    a row lock (the reaper and a re-claim take the same lock), the occurrence must still be
    RUNNING under this claim's token with a live lease; else the whole transaction, effect
    and idempotency record, rolls back and the current owner runs it.
    """
    fence = current_fence()
    if occurrence_id is None or fence is None:
        return  # not a scheduled run (.delay(), a direct call): nothing to fence against
    token, clock = fence
    lease = (
        Occurrence.objects.select_for_update()
        .filter(pk=occurrence_id, fencing_token=token, state=OccurrenceState.RUNNING.value)
        .values_list("lease_expires_at", flat=True)
        .first()
    )
    # The time once the row is locked (as on PostgreSQL, _store_fenced).
    if lease is None or lease <= clock.now():
        _refuse_stale_effect(occurrence_id, task_name, fence)


def _refuse_stale_effect(occurrence_id: str, task_name: str, fence: tuple[int, Any]) -> NoReturn:
    """Log and raise: the claim is no longer current, so the effect must roll back."""
    token, clock = fence
    now = (
        Occurrence.objects.filter(pk=occurrence_id)
        .values("state", "fencing_token", "lease_expires_at")
        .first()
    )
    logger.warning(
        "idempotent task %s: occurrence %s is no longer claimed under token %s; its "
        "effect is rolled back",
        task_name,
        occurrence_id,
        token,
        extra={"event": "stale_effect", "occurrence_id": occurrence_id},
    )
    raise errors.StaleWrite(
        f"occurrence {occurrence_id}: the claim under fencing token {token} expired or "
        f"was taken over while the body ran (now {now}, at {clock.now():%H:%M:%S}); its "
        "effect was rolled back"
    )
