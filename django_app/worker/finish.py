"""After the claim: renew, complete, fail, reap expired leases, replay dead letters.

The second half of the worker store, next to :mod:`django_app.worker.claim` (the claim).
Each write is conditional on the attempt's fencing token and the RUNNING state, so a worker
whose lease expired and was taken over cannot overwrite the newer attempt: it gets
:class:`errors.StaleWrite` and the newer attempt's state stands. A concurrency slot is
released or renewed only by the attempt that holds it (owner ``"<occurrence id>#<token>"``).
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Max, QuerySet

from celery_scheduler import errors
from celery_scheduler.core.clock import SYSTEM_CLOCK, Clock
from celery_scheduler.core.enums import AttemptOutcome, ScheduleState
from celery_scheduler.core.enums import OccurrenceState as S
from django_app import conf, observe
from django_app.models import Attempt, ConcurrencySlot, Occurrence, OutboxEntry, Schedule
from django_app.querysets import by_key, transition
from django_app.tenancy import waiting
from django_app.worker import complete_pg, limits

logger = logging.getLogger("celery_scheduler.worker")
_ERROR_LIMIT = 4000


def slot_owner(occurrence_id: uuid.UUID | str, token: int) -> str:
    """The owner of a slot held by one attempt: only that attempt may renew or release it."""
    return f"{occurrence_id}#{token}"


def lease_or_default(lease: timedelta | None) -> timedelta:
    return lease or timedelta(seconds=conf.get().occurrence_lease_seconds)


def republish(occ: Occurrence, at: datetime) -> None:
    """Make the relay publish ``occ`` again (same id) at ``at``: reset its outbox row.

    A worker received the message (a deferral, a retry, a lost lease), so the count of
    unanswered publishes starts over: the redelivery backoff must not read these copies as
    a long queue (:func:`django_app.relay.redelivery.lost_after`).
    """
    reset = {
        "sent_at": None, "available_at": at, "claimed_by": "", "claim_expires_at": None,
        "publish_count": 0,
    }  # fmt: skip
    rows = OutboxEntry.objects.filter(occurrence_id=occ.pk)
    n = by_key(rows, occ.scheduled_for).update(**reset)
    if n == 0:
        # A row written before the key existed, on a PostgreSQL install whose populated
        # tables migration 0020 left plain with the key empty (until `partitions convert`).
        n = rows.filter(scheduled_for__isnull=True).update(scheduled_for=occ.scheduled_for, **reset)
    if n == 0:  # occurrences created without an outbox row (imports, tests)
        shard, priority = Schedule.objects.values_list("shard", "priority").get(pk=occ.schedule_id)
        OutboxEntry.objects.create(
            occurrence_id=occ.pk, scheduled_for=occ.scheduled_for, tenant_id=occ.tenant_id,
            shard=shard, priority=priority, available_at=at,
        )  # fmt: skip


def release_slot(occurrence_id: uuid.UUID, token: int, now: datetime) -> None:
    """Free the attempt's slot and wake the oldest waiter of its key to take it now.

    The wake is what keeps a line's hand-over short: the next waiter does not wait for its
    next poll (:mod:`django_app.tenancy.waiting`). One read when the run held no slot.
    """
    owner = slot_owner(occurrence_id, token)
    held = list(ConcurrencySlot.objects.filter(owner=owner).values_list("pk", "tenant_id", "key"))
    # The owner again in the update: a slot whose lease expired after the read above is free
    # to take, and a claim that took it (waited for here, on its row lock) holds it now.
    released = [
        (tenant_id, key)
        for pk, tenant_id, key in held
        if ConcurrencySlot.objects.filter(pk=pk, owner=owner).update(
            owner="", occurrence_id=None, expires_at=None
        )
    ]
    _wake_after_release(released, occurrence_id, now)


def _wake_after_release(
    released: list[tuple[int, str]], occurrence_id: uuid.UUID, now: datetime
) -> None:
    """Wake the oldest waiter of each released slot's key to take it now."""
    for tenant_id, key in released:
        waiting.Line.for_slots(tenant_id, key).wake_oldest(
            now, besides=occurrence_id, unless_due_within=timedelta(0)
        )


def _rejected(verb: str, occurrence_id: uuid.UUID, token: int) -> errors.StaleWrite:
    observe.worker_event("stale_writes")
    current = Occurrence.objects.filter(pk=occurrence_id).values("state", "fencing_token").first()
    logger.warning(
        "%s of occurrence %s with token %s rejected: now %s",
        verb,
        occurrence_id,
        token,
        current,
        extra={"event": "stale_write", "occurrence_id": str(occurrence_id)},
    )
    return errors.StaleWrite(
        f"{verb} of occurrence {occurrence_id} under fencing token {token} rejected: the "
        f"occurrence is now {current} (a newer attempt or the reaper took over)"
    )


def _attempt(
    occurrence_id: uuid.UUID, token: int, scheduled_for: datetime | None
) -> QuerySet[Attempt]:
    """The attempt that holds ``token``, found by its partition key when it is known."""
    rows = Attempt.objects.filter(occurrence_id=occurrence_id, fencing_token=token)
    return by_key(rows, scheduled_for)


def renew(
    occurrence_id: uuid.UUID | str,
    token: int,
    *,
    clock: Clock | None = None,
    lease: timedelta | None = None,
    scheduled_for: datetime | None = None,
    holds_slot: bool,
) -> bool:
    """Extend the occurrence lease and the attempt's slot lease; False if the token is stale
    or the lease has lapsed.

    False means the run may no longer count on its lease: stop renewing, and a body that has
    not started must not start. A lapsed lease is never renewed, even under a current token:
    from its expiry on, claims stopped counting the run (its concurrency slot could be
    taken, the overlap policy and the tenant's ``max_running`` let the next run start), so
    renewing it would bring a second run to life beside them. ``holds_slot`` (the claim took
    a concurrency slot): a slot found taken is such a lapse too (a claimer whose clock is
    ahead of this one's saw it expire), and nothing is renewed. ``scheduled_for`` (the
    claim's) keeps it to the occurrence's history partition.
    """
    occ_id = uuid.UUID(str(occurrence_id))
    mine = by_key(Occurrence.objects.filter(pk=occ_id, fencing_token=token), scheduled_for)
    with transaction.atomic():
        # The row first, then the time: a renewal that waited for the row (a fence, a
        # duplicate delivery's claim) judges the lease as of its write, not of its request.
        list(mine.select_for_update().values_list("pk", flat=True))
        now = (clock or SYSTEM_CLOCK).now()
        expires = now + lease_or_default(lease)
        # RUNNING -> RUNNING under the same token: only the lease moves.
        moved = mine.filter(lease_expires_at__gt=now).transition(
            S.RUNNING, only_from=S.RUNNING, if_token=token, lease_expires_at=expires
        )
        slots = 0
        if moved:
            slots = ConcurrencySlot.objects.filter(owner=slot_owner(occ_id, token)).update(
                expires_at=expires
            )
        if not moved or (holds_slot and not slots):
            transaction.set_rollback(True)
            observe.worker_event("lease_lost")
            return False
        _attempt(occ_id, token, scheduled_for).update(heartbeat_at=now)
    return True


def complete(
    occurrence_id: uuid.UUID | str,
    token: int,
    result: Any = None,
    *,
    clock: Clock | None = None,
    scheduled_for: datetime | None = None,
) -> None:
    """RUNNING -> SUCCEEDED iff ``token`` is current; else :class:`errors.StaleWrite`.

    On PostgreSQL one statement (:mod:`django_app.worker.complete_pg`), unless the
    schedule counts failures; ``scheduled_for`` (the claim's) keeps it to the occurrence's
    history partition.
    """
    occ_id = uuid.UUID(str(occurrence_id))
    now = (clock or SYSTEM_CLOCK).now()
    if connection.vendor == "postgresql":
        moved, counts_failures, released = complete_pg.complete(
            occ_id, token, result, now=now, slot_owner=slot_owner(occ_id, token),
            scheduled_for=scheduled_for,
        )  # fmt: skip
        if moved:
            _wake_after_release(released, occ_id, now)
            return
        if not counts_failures:
            raise _rejected("completion", occ_id, token)
    with transaction.atomic():
        # The schedule before the occurrence, as claims lock them.
        schedule = limits.lock_for_failures(occ_id, scheduled_for)
        transition(
            occ_id, S.SUCCEEDED, only_from=S.RUNNING, if_token=token,
            stale=lambda: _rejected("completion", occ_id, token),
            finished_at=now, result=result, lease_owner="", lease_expires_at=None, retry_at=None,
            scheduled_for=scheduled_for,
        )  # fmt: skip
        limits.record_outcome(schedule, dead=False, occurrence_id=occ_id, now=now)
        _attempt(occ_id, token, scheduled_for).update(
            outcome=AttemptOutcome.SUCCEEDED, finished_at=now, result=result
        )
        release_slot(occ_id, token, now)


def fail(
    occurrence_id: uuid.UUID | str,
    token: int,
    error: str,
    *,
    retry_at: datetime | None = None,
    clock: Clock | None = None,
    scheduled_for: datetime | None = None,
) -> S:
    """RUNNING -> RETRY_WAIT (``retry_at`` given: republished then) or -> DEAD, iff fenced.

    Returns the new state; raises :class:`errors.StaleWrite` if ``token`` is not current.
    ``scheduled_for`` (the claim's) keeps it to the occurrence's history partition.
    """
    occ_id = uuid.UUID(str(occurrence_id))
    now = (clock or SYSTEM_CLOCK).now()
    target = S.RETRY_WAIT if retry_at is not None else S.DEAD
    error = error[-_ERROR_LIMIT:]
    with transaction.atomic():
        schedule = limits.lock_for_failures(occ_id, scheduled_for) if target is S.DEAD else None
        transition(
            occ_id, target, only_from=S.RUNNING, if_token=token,
            stale=lambda: _rejected("failure", occ_id, token),
            retry_at=retry_at, last_error=error, lease_owner="", lease_expires_at=None,
            finished_at=now if target is S.DEAD else None, scheduled_for=scheduled_for,
        )  # fmt: skip
        limits.record_outcome(schedule, dead=target is S.DEAD, occurrence_id=occ_id, now=now)
        _attempt(occ_id, token, scheduled_for).update(
            outcome=AttemptOutcome.RETRY if retry_at else AttemptOutcome.FAILED,
            finished_at=now,
            error=error,
        )
        release_slot(occ_id, token, now)
        if retry_at is not None:
            occ = by_key(Occurrence.objects.filter(pk=occ_id), scheduled_for).get()
            republish(occ, retry_at)
    observe.worker_event("retries" if retry_at else "dead")
    return target


def reap_expired(*, clock: Clock | None = None, limit: int = 100) -> int:
    """Recover up to ``limit`` RUNNING occurrences whose lease expired; returns how many.

    Each one's current Attempt becomes LOST and the occurrence RETRY_WAIT with its outbox
    row reset (republished now, same id); if the lost attempt used up the schedule's own
    ``max_attempts`` it goes DEAD instead. Without one, the budget is the task's (its
    ``max_attempts``, its Celery ``max_retries``, else the settings default), which only a
    worker knows: the next claim dead-letters a run that used it up without running it
    (:func:`django_app.tasks.execute`), so a body that always kills its worker cannot loop
    forever either way. Cheap when nothing expired: one query over the RUNNING rows
    (bounded by worker capacity) through the (state, ...) index.
    """
    now = (clock or SYSTEM_CLOCK).now()
    expired = list(
        Occurrence.objects.lease_expired(now)
        .order_by("lease_expires_at")
        .values_list("pk", "fencing_token", "schedule__max_attempts")[:limit]
    )
    reaped = 0
    for occ_id, token, max_attempts in expired:
        with transaction.atomic():
            # Schedule row first (only if it counts failures), then the occurrence: the
            # claim's lock order.
            schedule = limits.lock_for_failures(occ_id)
            occ = (
                Occurrence.objects.select_for_update()
                .lease_expired(now)
                .filter(pk=occ_id, fencing_token=token)
                .first()
            )
            if occ is None:  # renewed, completed or re-claimed since the scan
                continue
            used = occ.attempt_count - (
                Attempt.objects.filter(
                    occurrence_id=occ_id, outcome=AttemptOutcome.FAILED
                ).aggregate(n=Max("number"))["n"]
                or 0
            )
            dead = max_attempts is not None and used >= max_attempts
            error = f"lease expired at {occ.lease_expires_at:%Y-%m-%dT%H:%M:%S}Z"
            error += (
                f" ({occ.lease_owner}); attempts exhausted" if dead else f" ({occ.lease_owner})"
            )
            # The row is locked as read just above: the move cannot miss.
            transition(
                occ_id, S.DEAD if dead else S.RETRY_WAIT, only_from=S.RUNNING, if_token=token,
                retry_at=None if dead else now, last_error=error, lease_owner="",
                lease_expires_at=None, finished_at=now if dead else None,
            )  # fmt: skip
            Attempt.objects.filter(occurrence_id=occ_id, fencing_token=token).update(
                outcome=AttemptOutcome.FAILED if dead else AttemptOutcome.LOST,
                finished_at=now,
                error=error,
            )
            release_slot(occ_id, token, now)
            if dead:
                limits.record_outcome(schedule, dead=True, occurrence_id=occ_id, now=now)
            else:
                republish(occ, now)
            reaped += 1
            observe.worker_event("dead" if dead else "leases_reaped")
            logger.warning(
                "occurrence %s: %s -> %s",
                occ_id,
                error,
                "DEAD" if dead else "RETRY_WAIT",
                extra={"event": "lease_expired", "occurrence_id": str(occ_id)},
            )
    return reaped


def _refuse_unrunnable(occ: Occurrence, schedule: Schedule) -> None:
    """Say now what a claim would do silently: cancel a replay of a superseded run."""
    if schedule.state == ScheduleState.CANCELED:
        raise errors.InvalidStateTransition(
            f"occurrence {occ.pk} cannot be replayed: its schedule {schedule.pk} is canceled"
        )
    if not occ.manual and occ.schedule_version != schedule.version:
        raise errors.InvalidStateTransition(
            f"occurrence {occ.pk} cannot be replayed: it belongs to version "
            f"{occ.schedule_version} of schedule {schedule.pk}, which is now at version "
            f"{schedule.version}, so a worker would cancel it unrun; use Run now "
            "(api.run_now) to run the current version"
        )


def replay_occurrence(occurrence_id: uuid.UUID | str, *, clock: Clock | None = None) -> Occurrence:
    """DEAD -> ENQUEUED with the same id; attempts and last_error are kept for audit.

    The replayed run gets a fresh ``max_attempts`` budget (attempts are counted from the
    last FAILED one). Raises :class:`errors.OccurrenceNotFound` or
    :class:`errors.InvalidStateTransition`: only DEAD occurrences can be replayed, and only
    if a worker would run them (schedule not canceled; the schedule's current version, or
    a manual run) rather than cancel them at claim.
    """
    now = (clock or SYSTEM_CLOCK).now()
    try:
        occ_id = uuid.UUID(str(occurrence_id))
    except ValueError:
        raise errors.OccurrenceNotFound(f"No occurrence with id {occurrence_id!s}") from None
    with transaction.atomic():
        # Schedule row first, as a claim locks it: the version read here cannot move on
        # before the replayed occurrence is enqueued.
        owner = Occurrence.objects.filter(pk=occ_id).values_list("schedule_id", flat=True).first()
        if owner is None:
            raise errors.OccurrenceNotFound(f"No occurrence with id {occurrence_id!s}")
        schedule = Schedule.objects.select_for_update().get(pk=owner)
        # Retention may have pruned it between the read above and this lock.
        found = Occurrence.objects.select_for_update().filter(pk=occ_id).first()
        if found is None:
            raise errors.OccurrenceNotFound(f"No occurrence with id {occurrence_id!s}")
        occ = found
        if occ.state == S.DEAD:
            _refuse_unrunnable(occ, schedule)
        transition(
            occ_id, S.ENQUEUED, only_from=S.DEAD,
            stale=lambda: errors.InvalidStateTransition(
                f"occurrence {occ_id} is {occ.state}; only DEAD occurrences can be replayed"
            ),
            retry_at=None, finished_at=None, reason=f"replayed at {now:%c}",
        )  # fmt: skip
        republish(occ, now)
        occ.refresh_from_db()
    observe.worker_event("replays")
    return occ
