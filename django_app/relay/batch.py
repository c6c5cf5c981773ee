"""Relay: publish due outbox rows to the broker, then mark them sent. Never the other way round.

One transaction per batch, in this order:

1. take the batch: on PostgreSQL ``SELECT ... FOR UPDATE SKIP LOCKED`` on the outbox (each
   relay gets disjoint rows, nobody waits); on databases without SKIP LOCKED a conditional
   ``UPDATE outbox SET claimed_by=<token>`` (which on SQLite also takes the write lock, so the
   batch is serialised with every other writer);
2. lock the occurrence rows (``FOR UPDATE SKIP LOCKED``: a row a worker or a lifecycle call
   holds right now is left for the next pass, so the relay never waits in a lock cycle);
3. re-read the schedules and drop what must not be published: an occurrence no longer
   SCHEDULED/ENQUEUED/RETRY_WAIT, or one of an old schedule version (-> CANCELED); its outbox
   row is closed without publishing;
4. publish the rest; fault points ``relay.after_publish`` and ``relay.before_mark``;
5. ``UPDATE outbox SET sent_at, publish_count+1 WHERE id IN .. AND sent_at IS NULL`` and
   ``UPDATE occurrence SET state=ENQUEUED, enqueued_at=COALESCE(enqueued_at, now) WHERE id IN
   .. AND state IN (SCHEDULED, ENQUEUED, RETRY_WAIT)``; commit.

Holding the occurrence locks across the publish is what makes "no old-version occurrence is
published after an update or cancel committed" true: the lifecycle's invalidating UPDATE
blocks on those locks until this batch commits, and once it has committed, step 3 sees the
CANCELED state. A crash between 4 and 5 rolls the marks back: the same occurrence ids are
published again later (at-least-once by design; the task id makes duplicates recognisable).

:class:`LookaheadRelay` adds the in-memory dispatcher: rows due within ``lookahead`` are
claimed durably (``claimed_by``/``claim_expires_at``) and published at their ``available_at``
instead of at the next poll.
"""

from __future__ import annotations

import gc
import logging
import math
import time
import uuid
from collections.abc import Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, connection, transaction
from django.db.models import F, QuerySet, Value
from django.db.models.functions import Coalesce

from celery_scheduler.core.clock import Clock
from celery_scheduler.core.dispatcher import Dispatcher
from celery_scheduler.core.enums import OccurrenceState
from celery_scheduler.core.reports import RelayReport
from celery_scheduler.core.states import PUBLISHABLE
from celery_scheduler.faults import fault_point
from celery_scheduler.publishers import OccurrenceMessage, Publisher
from celery_scheduler.stopping import stop_deferred
from django_app import conf, observe
from django_app.db import queries as db_queries
from django_app.models import Occurrence, OutboxEntry, Schedule, Tenant
from django_app.relay import queries
from django_app.tenancy import quotas

logger = logging.getLogger(__name__)

_PUBLISHABLE_VALUES = [s.value for s in PUBLISHABLE]


def _skip_locked() -> bool:
    return bool(connection.features.has_select_for_update_skip_locked)


def _of_self() -> tuple[str, ...]:
    """``FOR UPDATE OF`` the outbox only, where the database has ``OF`` (not MariaDB, whose
    ``FOR UPDATE`` locks the rows of every table the statement reads: here only the outbox)."""
    return ("self",) if connection.features.has_select_for_update_of else ()


def _due_rows(
    now: datetime, token: str, shards: Collection[int] | None, until: datetime | None = None
) -> QuerySet[OutboxEntry]:
    rows = OutboxEntry.objects.due(until or now).claimable(now, token)
    if shards is not None:
        rows = rows.filter(shard__in=list(shards))
    # Callers take batches in tenant-fair order (quotas.take_fair_batch).
    return quotas.without_exhausted(rows, now)


def idle_bound(settings: conf.SchedulerSettings) -> float:
    """Seconds a relay transaction may sit idle before PostgreSQL ends its session."""
    return max(float(settings.claim_grace_seconds), 1.0)


def bound_relay_transaction(settings: conf.SchedulerSettings) -> bool:
    """First statement of a relay transaction: bound its waits.

    PostgreSQL (``SET LOCAL``, gone with the transaction): ``lock_timeout``, a lock wait
    gives up after ``publish_timeout_seconds``; ``idle_in_transaction_session_timeout``, if
    the process stalls (SIGSTOP, a frozen VM) while holding the transaction, PostgreSQL ends
    the session after ``claim_grace_seconds`` and its row locks go with it, so another beat
    can publish the rows once their claims lapse. Only set in the relay's own (outermost)
    transaction, never a caller's.

    MySQL/MariaDB have no transaction-local settings: the same bounds are session values
    (``innodb_lock_wait_timeout``; MariaDB's ``idle_transaction_timeout``, or on MySQL 8,
    which has no idle-transaction bound, ``wait_timeout``, which the server also applies
    while a transaction waits for the client), in whole seconds. Returns True when it
    changed them: :func:`relay_transaction` then puts the connection's own values back.
    """
    cfg = settings
    if connection.vendor == "mysql":
        idle = _idle_variable()
        sets = [
            "@celery_scheduler_lock_wait = @@session.innodb_lock_wait_timeout",
            f"SESSION innodb_lock_wait_timeout = {max(1, math.ceil(cfg.publish_timeout_seconds))}",
        ]
        if len(connection.atomic_blocks) == 1:
            sets += [
                f"@celery_scheduler_idle = @@session.{idle}",
                f"SESSION {idle} = {max(1, math.ceil(idle_bound(cfg)))}",
            ]
        with connection.cursor() as cur:
            # One statement: the old values are read before any is changed.
            cur.execute(queries.mysql_set(sets))
        return True
    if connection.vendor != "postgresql":
        return False
    with connection.cursor() as cur:
        cur.execute(db_queries.lock_timeout(max(1, int(cfg.publish_timeout_seconds * 1000))))
        if len(connection.atomic_blocks) == 1:
            ms = int(idle_bound(cfg) * 1000)
            cur.execute(db_queries.idle_timeout(ms))
    return False


@contextmanager
def relay_transaction(settings: conf.SchedulerSettings) -> Iterator[None]:
    """``transaction.atomic()`` for one relay transaction, its waits bounded
    (:func:`bound_relay_transaction`); on MySQL/MariaDB the session's values are restored
    once it ended (after the commit: the idle bound must cover the wait for it too)."""
    restore = False
    outermost = not connection.in_atomic_block
    # A batch is short (bounded by its lock, idle and publish timeouts): a stop waits for
    # its commit from the start (celery_scheduler.stopping says why).
    with stop_deferred() as stopping, no_cyclic_gc():
        stopping.hold()
        try:
            with transaction.atomic():
                restore = bound_relay_transaction(settings)
                yield
        finally:
            if restore:
                _restore_session_bounds(outermost)


@contextmanager
def no_cyclic_gc() -> Iterator[None]:
    """The cyclic garbage collector off for the block (a relay transaction).

    A relay transaction may sit silent for only ``claim_grace_seconds`` (2 s by default)
    before the database ends its session; a full collection in a beat that holds a
    prepared burst (hundreds of thousands of objects) can take that long on a loaded
    machine (bench/README.md, "How 500,000 with two beats got there"). The block allocates
    little, so nothing piles up.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _idle_variable() -> str:
    """MariaDB's idle-transaction bound; MySQL 8 has none, and ``wait_timeout`` serves."""
    mariadb = bool(getattr(connection, "mysql_is_mariadb", False))
    return "idle_transaction_timeout" if mariadb else "wait_timeout"


def _restore_session_bounds(outermost: bool) -> None:
    if connection.connection is None:
        return  # closed after a failed rollback: a new session starts with its own values
    idle = _idle_variable()
    sets = ["SESSION innodb_lock_wait_timeout = @celery_scheduler_lock_wait"]
    if outermost:
        sets.append(f"SESSION {idle} = @celery_scheduler_idle")
    try:
        with connection.cursor() as cur:
            cur.execute(queries.mysql_set(sets))
    except DatabaseError:
        # The server ended the session (the bound did its job) or the connection broke: a
        # session left with the relay's short bounds must not serve the caller's next work.
        logger.debug("relay: could not restore the session's lock bounds", exc_info=True)
        if not connection.in_atomic_block:
            connection.close()


def keepalive() -> None:
    """A no-op statement: keeps a held transaction's session from counting as idle, and
    fails at once if the server already ended it (the caller then publishes nothing)."""
    if connection.vendor in ("postgresql", "mysql") and connection.in_atomic_block:
        with connection.cursor() as cur:
            cur.execute(db_queries.PING)


class Pulse:
    """Speaks to the database whenever a quarter of the idle bound passed since it last did.

    A relay transaction may be silent for only :func:`idle_bound` seconds before the database
    ends its session (what frees the row locks of a stalled beat). Work a live relay does
    between two statements must therefore stay well under it however large the batch or
    wave: a slow broker, converting a 20,000-row result, a loop over 250,000 rows on a
    loaded machine. Such work runs in pieces with a call to the pulse between them: one
    clock read, and a ``SELECT 1`` at most every quarter bound (which also fails at once if
    the session is already gone, so nothing more is published). Only a stalled process
    (no CPU at all) then loses its session, as designed. A lost session after the publish
    rolls the marks back and the wave is sent again: the duplicates this prevents.
    """

    __slots__ = ("bound", "every", "spoke")

    def __init__(self, settings: conf.SchedulerSettings) -> None:
        self.bound = idle_bound(settings)
        self.every = self.bound / 4
        self.spoke = time.monotonic()

    def __call__(self) -> None:
        if time.monotonic() - self.spoke > self.every:
            keepalive()
            self.spoke = time.monotonic()

    @contextmanager
    def watching(self) -> Iterator[None]:
        """Every statement of the block counts as speaking (no keepalive right after one),
        and a silence longer than half the bound is logged with the statement it preceded:
        the client-side work that should have been cut in pieces."""
        with connection.execute_wrapper(self._statement):
            yield

    def _statement(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        silent = time.monotonic() - self.spoke
        if silent > self.bound / 2:
            logger.warning(
                "relay transaction silent for %.2fs (the database ends it after %.1fs) "
                "before: %s", silent, self.bound, " ".join(sql.split())[:80],
            )  # fmt: skip
        try:
            return execute(sql, params, many, context)
        finally:
            self.spoke = time.monotonic()


#: Messages per publish call inside a relay transaction (see _publish_in_slices).
PUBLISH_SLICE = 20
#: Rows converted (fetched) or looped over between two pulses inside a relay transaction.
PULSE_ROWS = 1_000


def _publish_in_slices(
    publisher: Publisher, messages: list[OccurrenceMessage], settings: conf.SchedulerSettings
) -> None:
    """Publish a batch a slice at a time with a :class:`Pulse` between slices: a slow but
    live broker (a busy RabbitMQ, kombu's per-message path) keeps the transaction's
    session."""
    pulse = Pulse(settings)
    for start in range(0, len(messages), PUBLISH_SLICE):
        pulse()
        publisher.publish(messages[start : start + PUBLISH_SLICE])


def fetch_pulsing(cursor: Any, pulse: Pulse) -> Iterator[tuple[Any, ...]]:
    """The cursor's rows, converted ``PULSE_ROWS`` at a time with a pulse between: turning
    a large result into Python objects is client-side work the server counts as idle."""
    while rows := cursor.fetchmany(PULSE_ROWS):
        yield from rows
        pulse()


def new_token(node: str) -> str:
    return f"{node or 'relay'}/{uuid.uuid4().hex[:12]}"


def relay_due(
    *,
    clock: Clock,
    publisher: Publisher,
    shards: Collection[int] | None = None,
    shard_fencing: Mapping[int, int] | None = None,
    limit: int | None = None,
    node: str = "",
    settings: conf.SchedulerSettings | None = None,
) -> RelayReport:
    """Publish every outbox row with ``available_at <= now`` (at most ``limit``), in batches.

    ``shards`` (or the keys of ``shard_fencing``) limits the scan. Unlike the materializer
    the relay needs no fencing for correctness (any node may publish any row: the
    conditional mark and the occurrence id make a repeat harmless), so the tokens are not
    checked. ``node`` is this relay's claim token: rows it claimed ahead (see
    :class:`LookaheadRelay`) count as its own. Raises
    :class:`celery_scheduler.errors.CoordinationUnavailable` when the broker refuses a
    batch (that batch stays unsent) and lets database errors propagate. ``settings``: the
    value the relay was built with; a direct call (a test) leaves it out: read once here.
    """
    if shards is None and shard_fencing:
        shards = list(shard_fencing)
    cfg = settings or conf.get()
    batch_size = cfg.batch_size
    token = node or new_token(node)
    report = RelayReport()
    while limit is None or report.claimed < limit:
        size = batch_size if limit is None else min(batch_size, limit - report.claimed)
        now = clock.now()
        one = _relay_batch(_due_rows(now, token, shards), size, clock, publisher, token, cfg)
        report += one
        if one.claimed < size or one.published + one.dropped == 0:
            break
    return report


def _relay_batch(
    candidates: QuerySet[OutboxEntry],
    size: int,
    clock: Clock,
    publisher: Publisher,
    token: str,
    settings: conf.SchedulerSettings,
) -> RelayReport:
    """One transaction: take up to ``size`` rows, check, publish, mark (module docstring)."""
    now = clock.now()
    with relay_transaction(settings):
        lock = _skip_locked()
        ids = quotas.take_fair_batch(candidates, size, lock=lock, now=now, until=now, token=token)
        if lock:
            found = OutboxEntry.objects.in_bulk(ids)
        else:
            lease = timedelta(seconds=settings.lease_seconds)
            OutboxEntry.objects.unsent().claimable(now, token).filter(id__in=ids).update(
                claimed_by=token, claim_expires_at=now + lease
            )
            found = OutboxEntry.objects.unsent().filter(claimed_by=token).in_bulk(ids)
        rows = [found[i] for i in ids if i in found]  # fair order
        if not rows:
            return RelayReport()
        return _publish_rows(rows, clock, publisher, settings)


def _publish_rows(
    rows: list[OutboxEntry], clock: Clock, publisher: Publisher, settings: conf.SchedulerSettings
) -> RelayReport:
    """Steps 2-5 for rows the caller holds; must run inside the batch's transaction."""
    now = clock.now()
    occurrences = Occurrence.objects.filter(id__in=[r.occurrence_id for r in rows])
    if _skip_locked():
        occurrences = occurrences.select_for_update(skip_locked=True)
    by_id = {o.id: o for o in occurrences}
    # A fresh statement after the locks: sees every lifecycle change committed before them.
    schedules = Schedule.objects.in_bulk({o.schedule_id for o in by_id.values()})
    tenants = dict(
        Tenant.objects.filter(id__in={o.tenant_id for o in by_id.values()}).values_list(
            "id", "slug"
        )
    )
    to_send: list[tuple[OutboxEntry, OccurrenceMessage]] = []
    drop: list[int] = []
    stale: list[uuid.UUID] = []
    for row in rows:
        occurrence = by_id.get(row.occurrence_id)
        if occurrence is None:
            continue  # locked by a worker or a lifecycle call right now: next pass
        schedule = schedules[occurrence.schedule_id]
        if occurrence.state not in _PUBLISHABLE_VALUES:
            drop.append(row.id)
        elif schedule.version != occurrence.schedule_version and not occurrence.manual:
            # The lifecycle cancels these in the version-bumping transaction; this is the
            # backstop for any row that escaped it (and never publishes an old version).
            drop.append(row.id)
            stale.append(occurrence.id)
        else:
            message = OccurrenceMessage.from_occurrence(
                occurrence, schedule, tenant=tenants.get(occurrence.tenant_id, "")
            )
            to_send.append((row, message))
    waiting = quotas.throttle([row for row, _ in to_send], now)
    if waiting:
        to_send = [pair for pair in to_send if pair[0].id not in waiting]
    invalidated = 0
    if stale:
        invalidated = Occurrence.objects.filter(id__in=stale).transition(
            OccurrenceState.CANCELED,
            only_from=PUBLISHABLE,
            finished_at=now,
            reason="invalidated: schedule version changed before publishing",
        )
    if drop:
        OutboxEntry.objects.unsent().filter(id__in=drop).update(
            sent_at=now, claimed_by="dropped", claim_expires_at=None
        )
    marked = 0
    if to_send:
        fault_point("relay.before_publish")
        # A process stopped in this transaction (SIGSTOP, a frozen VM) past the idle bound
        # wakes up without its session, and its rows went to another relay: this statement
        # fails then, before anything reaches the broker a second time.
        keepalive()
        try:
            _publish_in_slices(publisher, [message for _, message in to_send], settings)
        except Exception:
            observe.publish_failed(len(to_send))
            raise
        fault_point("relay.after_publish")
        fault_point("relay.before_mark")
        sent_at = clock.now()
        first = [
            (m.tenant, m.scheduled_for)
            for row, m in to_send
            if observe.first_publish(
                by_id[row.occurrence_id].state,
                by_id[row.occurrence_id].manual,
                by_id[row.occurrence_id].schedule_version,
            )
        ]
        observe.published(first, sent_at, count=len(to_send))
        observe.left_scheduled(
            (
                (m.tenant, by_id[row.occurrence_id].created_at)
                for row, m in to_send
                if by_id[row.occurrence_id].state == OccurrenceState.SCHEDULED.value
            ),
            sent_at,
        )
        marked = (
            OutboxEntry.objects.unsent()
            .filter(id__in=[row.id for row, _ in to_send])
            .update(sent_at=sent_at, publish_count=F("publish_count") + 1, claim_expires_at=None)
        )
        Occurrence.objects.filter(id__in=[row.occurrence_id for row, _ in to_send]).transition(
            OccurrenceState.ENQUEUED,
            only_from=PUBLISHABLE,
            enqueued_at=Coalesce(F("enqueued_at"), Value(sent_at)),
        )
    return RelayReport(
        claimed=len(rows),
        published=len(to_send),
        marked=marked,
        dropped=len(drop),
        invalidated=invalidated,
        locked=len(rows) - len(to_send) - len(drop) - len(waiting),
        throttled=len(waiting),
    )


@dataclass(frozen=True, slots=True)
class _Held:
    outbox_id: int
    available_at: datetime


class LookaheadRelay:
    """A relay that claims rows due within ``lookahead`` and publishes each at its time.

    Driven by the caller's loop (the beat): :meth:`step` publishes held rows that became
    due, relays anything already due that nobody holds, and claims the next window;
    :meth:`next_due_at` says when the next held row is due, so the caller sleeps exactly
    that long. Claims are durable (``claimed_by`` = this relay's token, expiring
    ``claim_grace_seconds`` after the row's time): a relay that dies or stalls loses
    nothing, its rows are published by another relay once the claim expired.
    :meth:`close` gives back the claims of rows still held.
    """

    def __init__(
        self,
        *,
        clock: Clock,
        publisher: Publisher,
        node: str = "",
        lookahead: timedelta = timedelta(seconds=3),
        shards: Collection[int] | None = None,
        max_held: int = 10_000,
        settings: conf.SchedulerSettings | None = None,
    ) -> None:
        #: Read at beat start by the composition root (a direct construction: here).
        self.settings = settings or conf.get()
        self.clock = clock
        self.publisher = publisher
        self.token = new_token(node)
        self.lookahead = lookahead
        self.shards = shards
        self.max_held = max_held
        self.dispatcher: Dispatcher[_Held] = Dispatcher(max_pending=max_held)

    def next_due_at(self) -> datetime | None:
        return self.dispatcher.next_due_at()

    def step(self) -> RelayReport:
        """Publish due held rows, relay unheld due rows, then claim the next window."""
        return self.publish_held() + self.poll()

    def publish_held(self) -> RelayReport:
        """Publish the held rows whose ``available_at`` has passed."""
        report = RelayReport()
        batch_size = self.settings.batch_size
        while due := self.dispatcher.pop_due(self.clock.now(), limit=batch_size):
            ids = [held.outbox_id for held in due]
            try:
                one = self._publish_held_batch(ids)
            except BaseException:
                # Give the claims back so the next poll (here or elsewhere) retries them now
                # rather than after the claim expires.
                self._release_quietly(ids)
                raise
            report += one
            if one.locked:
                report += RelayReport(released=self._release(ids))
        return report

    def poll(self) -> RelayReport:
        """Relay rows already due that nobody holds, then claim rows of the next window."""
        report = relay_due(
            clock=self.clock,
            publisher=self.publisher,
            shards=self.shards,
            node=self.token,
            settings=self.settings,
        )
        return report + self._claim_ahead()

    def close(self) -> int:
        """Stop holding: release every held claim; returns how many rows were released."""
        pending = self.dispatcher.close()
        return self._release(held.outbox_id for held in pending)

    def _publish_held_batch(self, ids: list[int]) -> RelayReport:
        with relay_transaction(self.settings):
            # Still this relay's claim: a held row the worker side re-opened meanwhile (a
            # retry's later available_at, its claim cleared) goes out at that time instead.
            rows_qs = OutboxEntry.objects.unsent().filter(id__in=ids, claimed_by=self.token)
            if _skip_locked():
                rows_qs = rows_qs.select_for_update(skip_locked=True, of=_of_self())
            else:
                # Takes SQLite's write lock before reading, like the polling path does.
                rows_qs.update(claimed_by=self.token)
            rows = list(rows_qs.order_by("available_at", "-priority", "id"))
            if not rows:
                return RelayReport()
            return _publish_rows(rows, self.clock, self.publisher, self.settings)

    def _claim_ahead(self) -> RelayReport:
        """Claim at most one batch of rows due within the window.

        One batch per poll, not all of them: with several relays polling, a burst is split
        between them and published in parallel instead of by whoever polled first. Rows no
        relay claimed ahead are published by the due path at their time anyway.
        """
        size = min(self.max_held - len(self.dispatcher), self.settings.batch_size)
        if size <= 0:
            return RelayReport()
        return self._claim_ahead_batch(size)

    def _claim_ahead_batch(self, size: int) -> RelayReport:
        now = self.clock.now()
        grace = timedelta(seconds=self.settings.claim_grace_seconds)
        until = now + self.lookahead
        candidates = _due_rows(now, self.token, self.shards, until=until)
        candidates = candidates.filter(available_at__gt=now)
        with transaction.atomic():
            ids = quotas.take_fair_batch(
                candidates, size, lock=_skip_locked(), now=now, until=until, token=self.token
            )
            OutboxEntry.objects.unsent().claimable(now, self.token).filter(id__in=ids).update(
                claimed_by=self.token, claim_expires_at=F("available_at") + grace
            )
            claimed = list(
                OutboxEntry.objects.unsent()
                .filter(id__in=ids, claimed_by=self.token)
                .values_list("id", "available_at", "priority")
            )
        held = 0
        refused: list[int] = []
        for outbox_id, at, priority in claimed:
            if self.dispatcher.submit(outbox_id, _Held(outbox_id, at), at, priority):
                held += 1
            else:
                refused.append(outbox_id)
        return RelayReport(held=held, released=self._release(refused))

    def _release_quietly(self, ids: list[int]) -> None:
        try:
            self._release(ids)
        except Exception:  # the database may be what failed; the claims then just expire
            logger.warning("relay %s: could not release %d claim(s)", self.token, len(ids))

    def _release(self, ids: Iterable[int]) -> int:
        ids = list(ids)
        if not ids:
            return 0
        return (
            OutboxEntry.objects.unsent()
            .filter(id__in=ids, claimed_by=self.token)
            .update(claimed_by="", claim_expires_at=None)
        )
