"""The worker's claim: start a delivered occurrence, or defer, skip or drop it (ClaimOutcome).

The first half of the worker store; what follows the claim (renew, complete, fail, reap
expired leases, replay dead letters) is :mod:`django_app.worker.finish`.

Every state change is a conditional UPDATE checked by row count (``WHERE state IN
sources_of(target) AND fencing_token = %s``, :func:`django_app.querysets.transition`); a
zero count raises :class:`errors.StaleWrite` instead of overwriting a newer attempt. The
database, not Python, is the boundary.

Lock order is schedule row, then occurrence row, then the tenant row (only when it sets
``max_running``: counting its RUNNING occurrences under that lock makes the quota atomic),
then concurrency slot rows. The lifecycle API locks schedule then occurrences, and a tenant
row only to insert a new schedule, so claims cannot deadlock with pause or cancel. Locking
the schedule row is also what makes the overlap policy atomic: two workers claiming
occurrences of one schedule are serialized on it, so they cannot both see "none running".

Unclaimed occurrences that must wait (QUEUE_ONE, tenant at max_running, no free slot) go
back to the outbox (``sent_at = NULL, available_at = now + defer``) as ENQUEUED without a
new Attempt: waiting is not a try and does not burn the retry budget. Waiters for a slot or
for the tenant's ``max_running`` are served oldest ``scheduled_for`` first, and only the
head of each line polls (:mod:`django_app.tenancy.waiting`). Retries and
lease-expiry recovery (in :mod:`django_app.worker.finish`) reset the outbox the same way,
so the relay republishes the same occurrence id.

On PostgreSQL the common claim (no duplicate, still current, no overlap, no quota, no slot,
no run for ``max_runs`` to count) is one statement (:mod:`django_app.worker.claim_pg`): the
same locks in the same order and the same writes. Any other case falls back to the
transaction here, which decides it.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from django.db import InterfaceError, OperationalError, connection, transaction
from django.db.models import F, Max, Q

from celery_scheduler import errors
from celery_scheduler.core.clock import SYSTEM_CLOCK, Clock
from celery_scheduler.core.enums import AttemptOutcome, OverlapPolicy, ScheduleState
from celery_scheduler.core.enums import OccurrenceState as S
from celery_scheduler.core.states import TERMINAL
from django_app import observe
from django_app.db import checks
from django_app.db.connections import reset_after_error
from django_app.db.retry import retry_lock_conflicts
from django_app.models import Attempt, ConcurrencySlot, Occurrence, OutboxEntry, Schedule
from django_app.querysets import by_key, transition
from django_app.tenancy import quotas, waiting
from django_app.worker import claim_pg, limits
from django_app.worker.finish import (
    lease_or_default,
    logger,
    release_slot,
    republish,
    slot_owner,
)

#: How long an occurrence that must wait (QUEUE_ONE, no free slot) stays in the outbox.
DEFER = timedelta(seconds=1)
#: Marks the one occurrence a QUEUE_ONE schedule holds back while another runs.
QUEUED_REASON = "overlap: queued behind a running occurrence"


class ClaimOutcome(StrEnum):
    CLAIMED = "CLAIMED"  # run the body under fencing_token
    DUPLICATE = "DUPLICATE"  # running under a live lease, or already finished: do nothing
    STALE = "STALE"  # old schedule version or canceled: recorded, now CANCELED
    SKIPPED_OVERLAP = "SKIPPED_OVERLAP"
    DEFERRED = "DEFERRED"  # back in the outbox until retry_at (overlap queue, no slot)
    NOT_FOUND = "NOT_FOUND"


@dataclass(frozen=True, kw_only=True)
class SlotLease:
    key: str
    slot: int
    fencing_token: int


@dataclass(frozen=True, kw_only=True)
class ClaimResult:
    outcome: ClaimOutcome
    occurrence_id: uuid.UUID
    fencing_token: int | None = None
    attempt_number: int | None = None
    #: Attempts since the last dead-letter (a replay gets a fresh budget), this one included.
    attempts_in_run: int = 0
    slot: SlotLease | None = None
    retry_at: datetime | None = None
    reason: str = ""
    #: The schedule's own retry bounds (None: use the task's or the settings' default).
    max_attempts: int | None = None
    deadline: datetime | None = None
    #: The occurrence's tenant: its idempotency namespace and the scope of its slot names.
    tenant_id: int | None = None
    #: The tenant's slug (the metrics' label) and the claim's time (the run's start).
    tenant: str = ""
    started_at: datetime | None = None
    #: Seconds the claimed message waited in the queue (an ENQUEUED occurrence's claim).
    queued_seconds: float | None = None
    #: The schedule's IANA zone: the run's local scheduled time (``current_occurrence()``).
    timezone: str = "UTC"
    #: The claimed occurrence's time, its history partition's key (the completion's lookup).
    scheduled_for: datetime | None = None

    @property
    def claimed(self) -> bool:
        return self.outcome is ClaimOutcome.CLAIMED


def concurrency_key(schedule: Schedule) -> str:
    """The slot key within the schedule's tenant (slots are scoped by tenant, not by name)."""
    return schedule.concurrency_group or f"schedule:{schedule.pk}"


def claim(
    occurrence_id: uuid.UUID | str,
    *,
    worker: str,
    clock: Clock | None = None,
    lease: timedelta | None = None,
    defer: timedelta = DEFER,
    scheduled_for: datetime | None = None,
    taking_back: Collection[str] = (),
) -> ClaimResult:
    """Claim an occurrence for ``worker`` in one transaction, or say why not.

    Order: duplicate check (RUNNING under a live lease, or finished), schedule version and
    cancellation re-check, overlap policy, concurrency slot, then ``-> RUNNING`` with
    ``fencing_token + 1`` and a new Attempt. Raises :class:`errors.CoordinationUnavailable`
    when the database cannot be reached or the reply was lost: the claim may or may not
    have committed. The caller retries with ``taking_back`` holding the ``worker`` names
    it claimed as, and a claim still held under one of them (a live lease) is handed over to
    ``worker`` as it stands, same token and attempt, instead of being read as another
    worker's run: a lost reply neither spends an attempt nor leaves the run to the reaper.
    ``worker`` should be unique to the delivery (the wrapper adds a nonce), so that only the
    copies of the message that lost the reply can take the claim back, and each only once.
    On PostgreSQL the common claim is one statement (:mod:`django_app.worker.claim_pg`);
    ``scheduled_for`` (the message's) keeps its lookups to the occurrence's partition.
    """
    checks.require_safe_database()  # once per process; refuses on unsafe SQLite
    try:
        result = _claim(
            uuid.UUID(str(occurrence_id)), scheduled_for, worker, clock or SYSTEM_CLOCK, lease,
            defer, taking_back,
        )  # fmt: skip
    except (OperationalError, InterfaceError) as exc:
        reset_after_error()  # the caller's retry must not reuse a dead connection
        raise errors.CoordinationUnavailable(
            f"cannot claim occurrence {occurrence_id}: database unavailable ({exc})"
        ) from exc
    if result.queued_seconds is not None:  # observed once committed
        observe.claimed(result.tenant, result.queued_seconds)
    return result


# One transaction of its own: a deadlock victim (InnoDB, when claims of one tenant's group
# lock the slot rows and wake each other's waiters) was rolled back whole and runs again.
@retry_lock_conflicts
def _claim(
    occ_id: uuid.UUID,
    scheduled_for: datetime | None,
    worker: str,
    clock: Clock,
    lease: timedelta | None,
    defer: timedelta,
    taking_back: Collection[str] = (),
) -> ClaimResult:
    lease = lease_or_default(lease)
    if claim_pg.applies():
        now = clock.now()
        claimed = claim_pg.claim(occ_id, scheduled_for, worker, now, lease)
        if claimed is not None:
            return _claimed_in_one_statement(occ_id, claimed, now)
    with transaction.atomic():
        found = _lock_schedule(occ_id)
        if found is None:
            return ClaimResult(outcome=ClaimOutcome.NOT_FOUND, occurrence_id=occ_id)
        schedule, tenant, max_running = found
        occ = Occurrence.objects.select_for_update().get(pk=occ_id)
        now = clock.now()
        state = S(occ.state)
        live = state is S.RUNNING and occ.lease_expires_at and occ.lease_expires_at > now
        if live and occ.lease_owner in taking_back:
            taken = _take_back(schedule, occ, worker, now, lease, tenant)
            if taken is not None:
                return taken
        if state in TERMINAL or state is S.DEAD or live:
            observe.worker_event("duplicate_claims")
            logger.info(
                "duplicate delivery of occurrence %s (%s): body not run",
                occ_id,
                state,
                extra={"event": "duplicate_claim", "occurrence_id": str(occ_id)},
            )
            return ClaimResult(outcome=ClaimOutcome.DUPLICATE, occurrence_id=occ_id, reason=state)
        stale = _stale_reason(schedule, occ) or limits.over_max_runs(schedule, occ)
        if stale:
            return _mark_stale(occ, worker, now, stale)
        if state is S.RETRY_WAIT and occ.retry_at is not None and occ.retry_at > now:
            return _before_its_retry(occ)
        held = _apply_overlap(schedule, occ, now, defer)
        if held is not None:
            return held
        # Waiters are served oldest first (django_app.tenancy.waiting): asked under the
        # tenant row lock here, under the key's slot row locks below.
        place = waiting.Place(line=waiting.Line.for_tenant(occ.tenant_id, tenant), occ=occ)
        full = ""
        if max_running:  # the quota's lock and count are taken there
            full = quotas.running_quota_full(occ.tenant_id, occ.pk, now, behind=place.behind)
        if full:
            return _wait(occ, now, defer, place, full)
        if place.asked:  # the tenant has a max_running: its next waiter becomes the head
            place.line.wake_oldest(now, besides=occ.pk)
        token = occ.fencing_token + 1
        slot = None
        if schedule.concurrency_limit:
            key = concurrency_key(schedule)
            _lock_slots(schedule.tenant_id, key, schedule.concurrency_limit)
            place = waiting.Place(line=waiting.Line.for_slots(schedule.tenant_id, key), occ=occ)
            if not place.behind():
                slot = _acquire_slot(
                    schedule.tenant_id, key, schedule.concurrency_limit,
                    slot_owner(occ_id, token), occ_id, now, lease,
                )  # fmt: skip
            if slot is None:
                return _wait(occ, now, defer, place, waiting.slot_reason(key))
            # The next waiter becomes the head: it polls while this one runs.
            place.line.wake_oldest(now, besides=occ.pk)
        return _start(schedule, occ, worker, now, lease, slot, tenant)


def _claimed_in_one_statement(
    occ_id: uuid.UUID, claimed: claim_pg.Claimed, now: datetime
) -> ClaimResult:
    """The result :func:`_start` returns, from what ``django_app_claim()`` wrote and read."""
    queued = _queued_since(claimed.state, claimed.enqueued_at, claimed.retry_at)
    deadline = None
    if claimed.deadline_seconds:
        deadline = claimed.scheduled_for + timedelta(seconds=claimed.deadline_seconds)
    return ClaimResult(
        outcome=ClaimOutcome.CLAIMED,
        occurrence_id=occ_id,
        fencing_token=claimed.token,
        attempt_number=claimed.number,
        attempts_in_run=claimed.number - (claimed.last_dead or 0),
        max_attempts=claimed.max_attempts,
        deadline=deadline,
        tenant_id=claimed.tenant_id,
        tenant=claimed.tenant,
        started_at=now,
        queued_seconds=None if queued is None else (now - queued).total_seconds(),
        timezone=claimed.timezone,
        scheduled_for=claimed.scheduled_for,
    )


def _wait(
    occ: Occurrence, now: datetime, defer: timedelta, place: waiting.Place, reason: str
) -> ClaimResult:
    """Defer ``occ`` in its line: the head asks again after ``defer``, the others park."""
    if not place.asked_and_behind:
        return _defer(occ, now + defer, reason)
    place.line.wake_oldest(now, besides=occ.pk)  # the head may be parked or lost
    return _defer(occ, now + max(defer, waiting.PARK), reason)


def _lock_schedule(occ_id: uuid.UUID) -> tuple[Schedule, str, int | None] | None:
    """Lock the occurrence's schedule; with the tenant's slug (the metrics' label) and its
    ``max_running`` (a tenant without a quota costs no lock), or None if it is gone.

    Where ``FOR UPDATE OF`` exists (PostgreSQL) the schedule is found through the
    occurrence in the locking statement itself. Elsewhere (MariaDB has no ``OF``: a join
    would lock the occurrence and tenant rows too, in the plan's order, not the claim's)
    the keys are read first and the schedule locked by its primary key.
    """
    if connection.features.has_select_for_update_of:
        schedule = (
            Schedule.objects.select_for_update(of=("self",))
            .filter(occurrences__pk=occ_id)
            .annotate(
                tenant_slug=F("occurrences__tenant__slug"),
                tenant_max_running=F("occurrences__tenant__max_running"),
            )
            .first()
        )
        if schedule is None:
            return None
        return schedule, schedule.tenant_slug, schedule.tenant_max_running
    row = (
        Occurrence.objects.filter(pk=occ_id)
        .values_list("schedule_id", "tenant__slug", "tenant__max_running")
        .first()
    )
    if row is None:
        return None
    schedule_id, slug, max_running = row
    return Schedule.objects.select_for_update().get(pk=schedule_id), slug, max_running


def _stale_reason(schedule: Schedule, occ: Occurrence) -> str:
    if schedule.state == ScheduleState.CANCELED:
        return "schedule canceled"
    # Manual (run now) occurrences survive version bumps, as the lifecycle API leaves them.
    if not occ.manual and occ.schedule_version != schedule.version:
        return f"schedule version {occ.schedule_version} superseded by {schedule.version}"
    return ""


def _lose_previous(occ: Occurrence, now: datetime) -> None:
    """A RUNNING occurrence whose lease expired: its attempt lost the lease."""
    if occ.state == S.RUNNING:
        Attempt.objects.filter(
            occurrence_id=occ.pk, fencing_token=occ.fencing_token, outcome=AttemptOutcome.RUNNING
        ).update(outcome=AttemptOutcome.LOST, finished_at=now, error="lease expired")


def _transition(occ: Occurrence, target: S, **fields: Any) -> None:
    """Move ``occ`` to ``target`` iff its state and fencing token are still the ones read."""
    transition(
        occ.pk, target, only_from=S(occ.state), if_token=occ.fencing_token,
        stale=lambda: errors.StaleWrite(
            f"occurrence {occ.pk} changed under the claim lock ({occ.state})"
        ),
        scheduled_for=occ.scheduled_for, **fields,
    )  # fmt: skip


def _mark_stale(occ: Occurrence, worker: str, now: datetime, reason: str) -> ClaimResult:
    # A waiter that goes stale (over max_runs) leaves its line without running.
    waiting.wake_after_leaving([(occ.tenant_id, occ.reason)], now)
    _lose_previous(occ, now)
    token = occ.fencing_token + 1
    number = occ.attempt_count + 1
    _transition(
        occ, S.CANCELED, fencing_token=token, attempt_count=number, finished_at=now,
        reason=reason, lease_owner="", lease_expires_at=None,
    )  # fmt: skip
    Attempt.objects.create(
        occurrence_id=occ.pk, scheduled_for=occ.scheduled_for, number=number,
        fencing_token=token, worker=worker, started_at=now, finished_at=now,
        outcome=AttemptOutcome.STALE, error=reason,
    )  # fmt: skip
    observe.worker_event("stale_occurrences")
    logger.info(
        "occurrence %s not run: %s",
        occ.pk,
        reason,
        extra={"event": "occurrence_stale", "occurrence_id": str(occ.pk)},
    )
    return ClaimResult(outcome=ClaimOutcome.STALE, occurrence_id=occ.pk, reason=reason)


def _apply_overlap(
    schedule: Schedule, occ: Occurrence, now: datetime, defer: timedelta
) -> ClaimResult | None:
    # A backfilled occurrence may carry its own policy; everything else uses the schedule's.
    policy = OverlapPolicy(occ.overlap_policy or schedule.overlap_policy)
    if policy is OverlapPolicy.ALLOW:
        return None
    others = Occurrence.objects.filter(schedule_id=schedule.pk).exclude(pk=occ.pk)
    if not others.running_leased(now).exists():
        return None
    if occ.attempt_count > 0:
        # It already started once (its worker died and the reaper re-queued it, it failed
        # transiently, or it was replayed): it is not "the next trigger", so the overlap
        # policy does not drop it; it waits for the running one. (Checking only RUNNING
        # missed every run the reaper had re-queued first, and RETRY_WAIT -> SKIPPED_OVERLAP
        # is no legal transition: the claim raised StaleWrite and the run was stranded.)
        return _defer(occ, now + defer, "overlap: re-claim waits for the running one")
    queued = others.unclaimed().filter(reason=QUEUED_REASON).exists()
    if policy is OverlapPolicy.QUEUE_ONE and not queued:
        return _defer(occ, now + defer, QUEUED_REASON)
    # A waiter of a slot or max_running line skipped here leaves its line without running.
    waiting.wake_after_leaving([(occ.tenant_id, occ.reason)], now)
    _lose_previous(occ, now)
    _transition(occ, S.SKIPPED_OVERLAP, finished_at=now, reason="overlap: another is running")
    observe.worker_event("overlap_skips")
    logger.info(
        "occurrence %s skipped: schedule %s already running (%s)",
        occ.pk,
        schedule.pk,
        policy,
        extra={"event": "overlap_skip", "occurrence_id": str(occ.pk)},
    )
    return ClaimResult(
        outcome=ClaimOutcome.SKIPPED_OVERLAP, occurrence_id=occ.pk, reason=str(policy)
    )


def _before_its_retry(occ: Occurrence) -> ClaimResult:
    """A message of a run waiting out its retry's backoff (a copy the redelivery sent, or a
    retry message read by a worker whose clock lags the relay's): nothing runs before
    ``retry_at``. The outbox row is (re)opened for then, so the retry's message goes out
    whatever became of the one the failure opened."""
    assert occ.retry_at is not None
    pending = OutboxEntry.objects.filter(
        occurrence_id=occ.pk, sent_at__isnull=True, available_at=occ.retry_at
    )
    if not by_key(pending, occ.scheduled_for).exists():  # else it goes out then already
        republish(occ, occ.retry_at)
    observe.worker_event("deferred")
    return ClaimResult(
        outcome=ClaimOutcome.DEFERRED,
        occurrence_id=occ.pk,
        retry_at=occ.retry_at,
        reason="retry backoff: runs at retry_at",
    )


def _defer(occ: Occurrence, retry_at: datetime, reason: str) -> ClaimResult:
    """Put an unclaimed occurrence back in the outbox until ``retry_at`` (no new Attempt)."""
    if occ.state == S.RUNNING:  # expired lease being re-claimed: RUNNING -> ENQUEUED is illegal
        _lose_previous(occ, retry_at)
        target = S.RETRY_WAIT
    else:
        target = S.ENQUEUED
    _transition(
        occ, target, retry_at=retry_at, reason=reason, lease_owner="", lease_expires_at=None
    )
    republish(occ, retry_at)
    observe.worker_event("deferred")
    return ClaimResult(
        outcome=ClaimOutcome.DEFERRED, occurrence_id=occ.pk, retry_at=retry_at, reason=reason
    )


def _lock_slots(tenant_id: int, key: str, limit: int) -> None:
    """Create the key's ``limit`` slot rows if missing, then lock them (slot order).

    The lock serializes the key's claims, so the line's order is read and a slot taken as
    one step: a waiter that deferred before this lock was taken is seen by the check.
    """
    mine = ConcurrencySlot.objects.filter(tenant_id=tenant_id, key=key, slot__lt=limit)
    have = set(mine.values_list("slot", flat=True))
    if len(have) < limit:
        ConcurrencySlot.objects.bulk_create(
            [
                ConcurrencySlot(tenant_id=tenant_id, key=key, slot=i)
                for i in range(limit)
                if i not in have
            ],
            ignore_conflicts=True,
        )
    list(mine.select_for_update().order_by("slot").values_list("pk", flat=True))


def _acquire_slot(
    tenant_id: int,
    key: str,
    limit: int,
    owner: str,
    occ_id: uuid.UUID,
    now: datetime,
    lease: timedelta,
) -> SlotLease | None:
    """Take one of ``limit`` slots of the tenant's ``key`` that is free or expired.

    Group names are chosen by tenants, so slots are keyed by (tenant, key): another
    tenant's group of the same name is another set of rows, created on first use by
    :func:`_lock_slots` (ON CONFLICT DO NOTHING), which the caller has locked. Each take
    is still a conditional UPDATE checked by row count, so two claimers cannot both take
    one slot even where the lock is a no-op.
    """
    mine = ConcurrencySlot.objects.filter(tenant_id=tenant_id, key=key, slot__lt=limit)
    free = Q(owner="") | Q(expires_at__lt=now)
    candidates = mine.filter(free).order_by("slot").values_list("pk", "slot")
    for pk, slot in list(candidates):
        taken = (
            ConcurrencySlot.objects.filter(free, pk=pk).update(
                owner=owner,
                occurrence_id=occ_id,
                expires_at=now + lease,
                fencing_token=F("fencing_token") + 1,
            )
            == 1
        )
        if taken:
            token = ConcurrencySlot.objects.values_list("fencing_token", flat=True).get(pk=pk)
            return SlotLease(key=key, slot=slot, fencing_token=token)
    return None


def _start(
    schedule: Schedule,
    occ: Occurrence,
    worker: str,
    now: datetime,
    lease: timedelta,
    slot: SlotLease | None,
    tenant: str,
) -> ClaimResult:
    queued = _queued_since(occ.state, occ.enqueued_at, occ.retry_at)
    _lose_previous(occ, now)
    limits.count_run(schedule, occ, now)  # before the transition: reads attempt_count 0
    token = occ.fencing_token + 1
    number = occ.attempt_count + 1
    _transition(
        occ, S.RUNNING, fencing_token=token, attempt_count=number, lease_owner=worker,
        lease_expires_at=now + lease, started_at=now, finished_at=None, retry_at=None, reason="",
    )  # fmt: skip
    Attempt.objects.create(
        occurrence_id=occ.pk, scheduled_for=occ.scheduled_for, number=number,
        fencing_token=token, worker=worker, started_at=now,
    )  # fmt: skip
    queued_seconds = None if queued is None else (now - queued).total_seconds()
    return _claimed(schedule, occ, token, number, slot, tenant, now, queued_seconds)


def _take_back(
    schedule: Schedule, occ: Occurrence, worker: str, now: datetime, lease: timedelta, tenant: str
) -> ClaimResult | None:
    """Hand a claim whose reply was lost over to ``worker``: same token, same attempt, a
    fresh lease. A schedule canceled or updated meanwhile makes it stale, as any claim's
    re-check would; None if the slot it took is no longer its own (lapsed and taken by a
    claimer whose clock is ahead: the reaper decides then)."""
    token = occ.fencing_token
    stale = _stale_reason(schedule, occ)
    if stale:
        release_slot(occ.pk, token, now)
        return _mark_stale(occ, worker, now, stale)
    slot = None
    if schedule.concurrency_limit:
        held = ConcurrencySlot.objects.filter(owner=slot_owner(occ.pk, token))
        found = held.values_list("key", "slot", "fencing_token").first()
        # The count, not the read: a slot may have been taken since (renew() does the same).
        if found is None or not held.filter(expires_at__gt=now).update(expires_at=now + lease):
            return None
        slot = SlotLease(key=found[0], slot=found[1], fencing_token=found[2])
    # RUNNING -> RUNNING under the same token: another name on the lease, and a new term.
    _transition(occ, S.RUNNING, lease_owner=worker, lease_expires_at=now + lease)
    attempt = Attempt.objects.filter(occurrence_id=occ.pk, fencing_token=token)
    by_key(attempt, occ.scheduled_for).update(worker=worker)
    observe.worker_event("claims_taken_back")
    logger.info(
        "occurrence %s: the claim whose reply was lost is taken back by %s",
        occ.pk, worker,
        extra={"event": "claim_taken_back", "occurrence_id": str(occ.pk)},
    )  # fmt: skip
    return _claimed(schedule, occ, token, occ.attempt_count, slot, tenant, now, None)


def _claimed(
    schedule: Schedule,
    occ: Occurrence,
    token: int,
    number: int,
    slot: SlotLease | None,
    tenant: str,
    now: datetime,
    queued_seconds: float | None,
) -> ClaimResult:
    """The result of a claim that holds ``occ`` under ``token`` as attempt ``number``."""
    # A first attempt has no earlier FAILED one to count from: skip the read.
    last_dead = None
    if number > 1:
        last_dead = Attempt.objects.filter(
            occurrence_id=occ.pk, outcome=AttemptOutcome.FAILED
        ).aggregate(n=Max("number"))["n"]
    deadline = None
    if schedule.deadline_seconds:
        deadline = occ.scheduled_for + timedelta(seconds=schedule.deadline_seconds)
    return ClaimResult(
        outcome=ClaimOutcome.CLAIMED,
        occurrence_id=occ.pk,
        fencing_token=token,
        attempt_number=number,
        attempts_in_run=number - (last_dead or 0),
        slot=slot,
        max_attempts=schedule.max_attempts,
        deadline=deadline,
        tenant_id=occ.tenant_id,
        tenant=tenant,
        started_at=now,
        queued_seconds=queued_seconds,
        timezone=schedule.timezone,
        scheduled_for=occ.scheduled_for,
    )


def _queued_since(
    state: str, enqueued_at: datetime | None, retry_at: datetime | None
) -> datetime | None:
    """When the message being claimed was published, for an ENQUEUED occurrence.

    ``enqueued_at`` keeps the first publish; a retry or a deferred claim is published again
    at its ``retry_at`` (the outbox row's new ``available_at``), so the later of the two is
    when this message entered the queue. None for a re-claim of an expired RUNNING lease.
    """
    if state != S.ENQUEUED or enqueued_at is None:
        return None
    if retry_at is not None and retry_at > enqueued_at:
        return retry_at
    return enqueued_at
