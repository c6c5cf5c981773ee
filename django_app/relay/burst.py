"""Burst relay (PostgreSQL): publish a top-of-the-hour burst at its instant, not after it.

The per-batch relay does everything after ``available_at``: lock, read, build, publish,
mark. For 500,000 rows due at one instant that is far too late. Here the work moves ahead:

1. **claim** (``lookahead`` before the rows are due, committed; the lookahead grows with
   the rows due, see :meth:`BurstRelay.claim_window`): rows due within the window, and rows
   already past due (a backlog after an outage, a restart, a late plan; oldest first, so
   they go out at the burst rate), are claimed durably (``claimed_by`` = this relay,
   ``claim_expires_at`` = each row's ``available_at`` plus ``claim_grace_seconds``), so no
   other relay takes them, and
   the rows of a relay that died or stalled are taken over that soon after they were due;
2. **prepare** (no transaction): one joined read loads what the messages need; the
   publisher's ``prepare`` builds and serialises the envelopes. Rows are grouped in waves
   (rows due within ``WAVE_SECONDS`` of the wave's first row);
3. **hold** (shortly before the wave is due): one transaction locks the occurrence rows
   (``FOR UPDATE SKIP LOCKED``), re-reads schedule versions and outbox rows in a fresh
   statement, and drops what must not go out (not publishable, old version -> CANCELED,
   already sent): the same checks as :mod:`django_app.relay.batch`, with the shard fencing check
   when tokens are given;
4. **publish** at each row's ``available_at`` (never before: the clock is waited on, in
   short slices that keep the session busy), pipelined in chunks; the time each chunk was
   accepted is recorded. After every sleep the wall clock is checked again: woken more than
   ``claim_grace_seconds`` late (the process was stopped), the rest of the wave is given
   back, not published (its claims have lapsed; another relay publishes it). The wave's
   transaction is bounded: lock waits by ``publish_timeout_seconds``, idleness by
   ``claim_grace_seconds`` (PostgreSQL ends the session of a stalled beat, freeing its row
   locks), and the publish by the publisher's timeout (Redis: socket waits; RabbitMQ: those and
   the wait for its publisher confirms);
5. **mark** in bulk inside the same transaction (``sent_at`` / ``enqueued_at`` = the
   chunk's acceptance time, conditional on ``sent_at IS NULL`` / a publishable state),
   then commit.

**Tenant trigger rate.** Just before step 3, the wave's rate-limited tenants
(``Tenant.max_trigger_rate``) take their tokens from the shared database budget
(:mod:`django_app.tenancy.budget`, one short transaction for the wave); a tenant's rows beyond its
tokens leave the wave, their claims given back, and go out through the polling path when
the tenant has tokens again. Tenants without a rate cost nothing here.

"Never mark before the broker accepted" holds durably: the marks are written after the
publish and only the commit makes them real, so a crash before it rolls them back and the
same occurrence ids are published again (at-least-once). Lifecycle calls that invalidate
these occurrences block on the row locks from the hold until the commit (about the hold
lead plus the publish), then see ENQUEUED rows; an update or cancel that committed before
the hold is seen by step 3, so no old-version occurrence goes out after it committed.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.db import connection, transaction

from celery_scheduler import metrics
from celery_scheduler.core.clock import Clock
from celery_scheduler.core.enums import OccurrenceState
from celery_scheduler.core.fairness import fair_positions
from celery_scheduler.core.lead import RateMeter, lead_seconds, pending_cap
from celery_scheduler.faults import fault_point
from celery_scheduler.publishers import OccurrenceMessage, Publisher, preparing
from celery_scheduler.stopping import StopDeferral, stop_deferred
from django_app import conf, observe
from django_app.db import partitions
from django_app.db.queries import TIMESTAMPTZ, array_literal
from django_app.models import OutboxEntry, Tenant
from django_app.relay import queries
from django_app.relay.batch import (
    PUBLISHABLE,
    PULSE_ROWS,
    Pulse,
    RelayReport,
    bound_relay_transaction,
    fetch_pulsing,
    idle_bound,
    keepalive,
    new_token,
    no_cyclic_gc,
    relay_due,
)
from django_app.relay.burst_rows import (
    CANCEL_FROM,
    ENQUEUE_FROM,
    BurstStats,
    HeldRow,
    Wave,
    decode_json,
    due,
)
from django_app.tenancy import budget, quotas

logger = logging.getLogger(__name__)
T = TypeVar("T")

#: Rows due within this span of a wave's first row go into that wave (one transaction).
WAVE_SECONDS = 1.0
#: Rows per claim / read statement (outside a wave's transaction).
SQL_CHUNK = 20_000
#: Rows per statement inside a wave's transaction (lock, re-reads, drop, mark). The client
#: turns a statement's parameters into text before sending it, and the server counts that
#: as idle: one mark statement for a whole 250,000-row wave stayed silent past the idle
#: bound on a loaded machine (bench/README.md, "How 500,000 with two beats got there").
WAVE_STATEMENT_ROWS = 2_000
#: Locking rate assumed when choosing how early to open a wave's transaction (rows/s).
LOCK_ROWS_PER_SECOND = 20_000
#: Claim + prepare rate assumed before one was measured (rows/s): low on purpose, so the
#: first burst after a start is prepared early rather than late (the stage rates measured
#: with two beats on two cores: bench/README.md, "Steady state at the top of the hour").
ASSUMED_PREPARE_ROWS_PER_SECOND = 2_000
#: Waves at least this large log the relay's per-stage rates at INFO.
STAGE_LOG_ROWS = 10_000
#: Seconds between two readings of the rows due within the largest lookahead.
LOOKAHEAD_REFRESH_SECONDS = 5.0

_PUBLISHABLE = [s.value for s in PUBLISHABLE]
_SCHEDULED = OccurrenceState.SCHEDULED.value


@dataclass(frozen=True, slots=True)
class WaveOutcome:
    """A fired wave as committed: what was published when, and the occurrence rows locked."""

    wave: Wave
    opened: datetime
    locked: datetime
    accepted: list[tuple[list[HeldRow], datetime]]
    states: dict[uuid.UUID, tuple[Any, ...]]


def _first_created_at(done: WaveOutcome) -> datetime | None:
    """When the wave's first published row was created (its locked row's ``created_at``)."""
    if not done.accepted or not done.accepted[0][0]:
        return None
    # locked: (state, version, manual, schedule_id, scheduled_for, created_at)
    locked = done.states.get(done.accepted[0][0][0].occurrence_id)
    return locked[5] if locked is not None else None


class BurstRelay:
    """The :class:`celery_scheduler.ports.Relay` for PostgreSQL with a Redis or AMQP broker.

    :meth:`poll` relays rows already due (the general path) and claims + prepares the next
    window; :meth:`publish_held` fires every wave whose hold time had come when it was called
    (it blocks until the wave's rows are due and published); :meth:`next_due_at` is the next
    hold time.
    ``shard_fencing`` (shard -> token) makes each wave check the lease rows of its shards.
    """

    def __init__(
        self,
        *,
        clock: Clock,
        publisher: Publisher,
        node: str = "",
        lookahead: timedelta | None = None,
        hold: timedelta | None = None,
        shards: Collection[int] | None = None,
        shard_fencing: Mapping[int, int] | None = None,
        max_rows: int | None = None,
        settings: conf.SchedulerSettings | None = None,
    ) -> None:
        #: Read at beat start by the composition root (a direct construction: here).
        cfg = self.settings = settings or conf.get()
        self.clock = clock
        self.publisher = preparing(publisher)
        self.token = new_token(node)
        #: What the wave being fired published, for the log and metrics after its commit.
        self._committed: WaveOutcome | None = None
        # Given a lookahead, it is fixed; else it is sized from the rows due (claim_window).
        floor = lookahead or timedelta(seconds=cfg.burst_lookahead_seconds)
        self.lookahead = floor
        self.max_lookahead = (
            floor if lookahead else max(floor, timedelta(seconds=cfg.burst_max_lookahead_seconds))
        )
        self.prepare_rate = RateMeter(assumed=ASSUMED_PREPARE_ROWS_PER_SECOND)
        self._floor = floor
        self._next_sizing = 0.0
        self.hold = hold if hold is not None else timedelta(seconds=cfg.burst_hold_seconds)
        self.shard_fencing = dict(shard_fencing) if shard_fencing is not None else None
        self.shards = list(self.shard_fencing) if self.shard_fencing is not None else shards
        self.max_rows = max_rows or cfg.burst_max_rows
        self.stats = BurstStats()
        #: Partitioned history (the outbox's key is never NULL there): the claim finds its
        #: rows by key. Read at the first claim, not here: a relay may be built before the
        #: database is reachable.
        self._partitioned: bool | None = None
        self._waves: list[Wave] = []
        #: Rows per pipelined publish call (acceptance time is recorded per chunk): the
        #: publisher's choice (the AMQP fast path takes fewer: each call must return within
        #: the transaction's idle bound, and RabbitMQ confirms far fewer messages/s).
        self.publish_chunk = self.publisher.publish_chunk

    # -- the LookaheadRelay interface used by the beat loop --------------------------------

    def held(self) -> int:
        return sum(len(w.rows) for w in self._waves)

    def next_due_at(self) -> datetime | None:
        return self._hold_at(self._waves[0]) if self._waves else None

    def poll(self) -> RelayReport:
        """Claim and prepare the window (late rows first), fire what is due, then relay
        through the general path what the window left (rate-limited tenants' late rows,
        rows given back by a wave)."""
        report = self.claim_ahead()
        report += self.publish_held()
        return report + relay_due(
            clock=self.clock,
            publisher=self.publisher,
            shards=self.shards,
            node=self.token,
            settings=self.settings,
        )

    def step(self) -> RelayReport:
        return self.publish_held() + self.poll()

    def publish_held(self) -> RelayReport:
        """Fire the waves whose hold time had come when called, oldest first.

        A wave whose time comes while these are fired waits for the next call, so the beat
        loop gets a turn between waves (its leases, heartbeat and plan): firing on until no
        wave was due kept a beat that started with its predecessor's window of waves held
        from taking any shard until it had fired them all.
        """
        report = RelayReport()
        called_at = self.clock.now()
        while self._waves and called_at >= self._hold_at(self._waves[0]):
            report += self.fire(self._waves.pop(0))
        return report

    def close(self) -> int:
        rows = [r.outbox_id for w in self._waves for r in w.rows]
        self._waves = []
        return self._release(rows)

    # -- 1 + 2: claim and prepare ahead ------------------------------------------------------

    def claim_ahead(self) -> RelayReport:
        """Claim rows due within the lookahead (up to ``max_rows`` held), prepare them.

        Chunk by chunk, preparing each before claiming the next: while this relay builds
        envelopes, other relays claim the following chunks, so a burst splits between them.
        """
        held = 0
        window = self.claim_window()
        rate_limited = sorted(budget.rate_limited_tenants())
        spent = 0.0  # claiming and preparing only: the waves fired in between do not count
        while (room := min(self.max_rows - self.held(), SQL_CHUNK)) > 0:
            started = time.perf_counter()
            now = self.clock.now()
            until = now + window
            with transaction.atomic(), connection.cursor() as cur:
                cur.execute(
                    queries.claim(sharded=self.shards is not None, keyed=self._keyed_claim()),
                    {
                        "token": self.token,
                        "lease": self.settings.claim_grace_seconds,
                        "now": now,
                        "until": until,
                        "limit": room,
                        "shards": list(self.shards or ()),
                        "rate_limited": rate_limited,
                    },
                )
                got = cur.fetchall()
            self.stats.add("claim", len(got), started)
            if got:
                self._add_rows(self._prepare_rows(got))
                held += len(got)
            spent += time.perf_counter() - started
            if len(got) < room:
                break
            # A long claim (a large burst) must not delay waves already due meanwhile.
            self.publish_held()
        self.prepare_rate.observe(held, spent)
        return RelayReport(held=held)

    def claim_window(self) -> timedelta:
        """How far ahead to claim: ``burst_lookahead_seconds`` for a light load, longer
        (up to ``burst_max_lookahead_seconds``) when the unsent rows due within the largest
        window would take this relay long to claim and prepare at its measured rate
        (:mod:`celery_scheduler.core.lead`). Re-read every few seconds, not every poll."""
        if self.max_lookahead == self._floor:
            return self._floor
        mono = self.clock.monotonic()
        if mono < self._next_sizing:
            return self.lookahead
        started = time.perf_counter()
        floor, ceiling = self._floor.total_seconds(), self.max_lookahead.total_seconds()
        rate = self.prepare_rate.rate
        cap = min(pending_cap(rate, floor=floor, ceiling=ceiling), self.max_rows)
        rows = OutboxEntry.objects.due(self.clock.now() + self.max_lookahead)
        if self.shards is not None:
            rows = rows.filter(shard__in=list(self.shards))
        pending = rows.order_by().values("available_at")[:cap].count()
        # A count over a large backlog is not free: keep it under ~5 % of the loop.
        every = max(LOOKAHEAD_REFRESH_SECONDS, 20.0 * (time.perf_counter() - started))
        self._next_sizing = mono + every
        seconds = lead_seconds(pending, rate, floor=floor, ceiling=ceiling)
        self.lookahead = timedelta(seconds=seconds)
        return self.lookahead

    def _keyed_claim(self) -> bool:
        if self._partitioned is None:
            self._partitioned = partitions.is_partitioned()
        return self._partitioned

    def _prepare_rows(
        self, claimed: list[tuple[int, uuid.UUID, int, datetime, int, datetime | None]]
    ) -> list[HeldRow]:
        started = time.perf_counter()
        by_outbox = {c[0]: c for c in claimed}
        messages: list[OccurrenceMessage] = []
        meta: list[tuple[int, int]] = []
        slugs: dict[int, str] = {}
        for start in range(0, len(claimed), SQL_CHUNK):
            chunk = claimed[start : start + SQL_CHUNK]
            with connection.cursor() as cur:
                occ_ids = array_literal([c[1] for c in chunk], "uuid")
                keyed, keys = key_set(c[5] for c in chunk)
                cur.execute(queries.read_occurrences(keyed=keyed), {"ids": occ_ids, "keys": keys})
                occurrences = {row[0]: row[1:] for row in cur.fetchall()}
                schedule_ids = array_literal(list({o[0] for o in occurrences.values()}), "uuid")
                cur.execute(queries.read_schedules(), {"ids": schedule_ids})
                schedules = {row[0]: row[1:] for row in cur.fetchall()}
            unknown = {o[3] for o in occurrences.values()} - slugs.keys()
            if unknown:
                slugs.update(Tenant.objects.filter(id__in=unknown).values_list("id", "slug"))
            for outbox_id, occ_id, *_ in chunk:
                occurrence = occurrences.get(occ_id)
                schedule = schedules.get(occurrence[0]) if occurrence else None
                if occurrence is None or schedule is None or occurrence[3] not in slugs:
                    continue  # gone since the claim (a deleted schedule): nothing to send
                sid, version, at, tenant_id, attempts, manual = occurrence
                sver, task, args, kwargs, queue, prio = schedule
                messages.append(
                    OccurrenceMessage(
                        occurrence_id=str(occ_id),
                        schedule_id=str(sid),
                        schedule_version=version,
                        scheduled_for=at,
                        tenant=slugs[tenant_id],
                        task=task,
                        args=tuple(decode_json(args) or ()),
                        kwargs=dict(decode_json(kwargs) or {}),
                        queue=queue or "",
                        priority=int(prio),
                        retries=int(attempts),
                        manual=bool(manual),
                    )
                )
                meta.append((outbox_id, sver))
        self.stats.add("read", len(messages), started)
        started = time.perf_counter()
        prepared = self.publisher.prepare(messages)
        self.publisher.declare(prepared)  # once per queue, now rather than at the instant
        self.stats.add("prepare", len(messages), started)
        del messages  # the envelopes are built: only the prepared bytes are held
        instants: dict[datetime, datetime] = {}
        tenants: dict[int, int] = {}
        rows = []
        for (outbox_id, sver), item in zip(meta, prepared, strict=True):
            _, occ_id, shard, available_at, tenant_id, key = by_outbox[outbox_id]
            available_at = instants.setdefault(available_at, available_at)
            key = instants.setdefault(key, key) if key is not None else None
            tenant_id = tenants.setdefault(tenant_id, tenant_id)  # one int object per tenant
            rows.append(HeldRow(outbox_id, occ_id, shard, tenant_id, available_at, sver, item, key))
        return rows

    def _add_rows(self, rows: Iterable[HeldRow]) -> None:
        new = sorted(rows, key=due)
        if not new:
            return
        if self._waves and new[0].available_at < self._waves[-1].rows[-1].available_at:
            # Out of order (rows released by another relay): regroup everything.
            new = sorted([r for w in self._waves for r in w.rows] + new, key=due)
            self._waves = []
        # Claims come in available_at order, so a chunk usually extends the last wave:
        # appending keeps a 500k burst at one pass over each chunk, not a re-sort per chunk.
        waves = self._waves
        span = timedelta(seconds=WAVE_SECONDS)
        for row in new:
            if not waves or row.available_at - waves[-1].start > span:
                waves.append(Wave(start=row.available_at))
            waves[-1].rows.append(row)
            waves[-1].tenants.add(row.tenant_id)

    def _hold_at(self, wave: Wave) -> datetime:
        # Open the wave's transaction early enough to lock all its rows before it is due,
        # with 50 % to spare, at the lock rate measured so far; before any lock, at half
        # the claim rate (an UPDATE of as many rows, but the lock stage also re-reads the
        # versions and the outbox and checks every row, so it is slower, and a first wave
        # opened at the claim rate went out late: bench/README.md, "How 500,000 with two
        # beats got there"), else the assumed one. Opening far too early costs: the beat loop
        # (materializing the rest of the burst) waits inside the wave until its instant.
        rate = float(LOCK_ROWS_PER_SECOND)
        for stage, share in (("claim", 0.5), ("lock", 1.0)):
            rows, spent = self.stats.rows.get(stage, 0), self.stats.seconds.get(stage, 0.0)
            if rows >= 1_000 and spent > 0:
                rate = share * rows / spent
        return wave.start - self.hold - timedelta(seconds=1.5 * len(wave.rows) / rate)

    # -- 3-5: hold, publish at the instant, mark, commit -------------------------------------

    def fire(self, wave: Wave) -> RelayReport:
        """One transaction for one wave (module docstring, steps 3 to 5), after the wave's
        trigger-rate tokens were taken (:meth:`_take_tokens`)."""
        rates = budget.trigger_rates(wave.tenants)
        throttled = 0
        granted: dict[int, int] = {}
        if rates:
            try:
                wave, granted, throttled = self._take_tokens(wave, rates)
            except BaseException:
                self._release_quietly([r.outbox_id for r in wave.rows])
                raise
        wave = self._in_fair_order(wave)
        self._committed = None
        # A stop (SIGTERM) after the first publish waits for the marks' commit and the
        # release of what the wave did not send (celery_scheduler.stopping).
        with stop_deferred() as stopping:
            try:
                # A session silent past claim_grace_seconds is ended by the database: no
                # collector pause inside the wave (see relay.batch.no_cyclic_gc), and every
                # piece of client-side work that grows with the wave runs between pulses.
                pulse = Pulse(self.settings)
                with no_cyclic_gc(), transaction.atomic(), pulse.watching():
                    bound_relay_transaction(self.settings)
                    report, release = self._fire_locked(wave, pulse, stopping)
            except BaseException:
                self._release_quietly([r.outbox_id for r in wave.rows])
                raise  # (tokens taken for a wave that may be half published are not returned)
            sent = self._after_commit()
            self._release(release)
        if granted:
            used = Counter(r.tenant_id for r in sent if r.tenant_id in granted)
            unused = {t: n - used[t] for t, n in granted.items()}
            budget.give_back_trigger(unused, rates, self.clock.now())
        return report + RelayReport(throttled=throttled)

    def _in_fair_order(self, wave: Wave) -> Wave:
        """The wave's rows in the tenants' weighted fair order wherever they compete.

        Rows compete when they are due together: every row already due when the wave fires
        (a backlog) is one group, and each later instant is another. Within a group the rows
        follow :func:`celery_scheduler.core.fairness.fair_positions` with the tenants'
        ``relay_weight`` (the order the polling relay's batches follow), so every publish
        chunk of a top-of-the-hour burst carries each tenant's share by weight while all
        have rows left; groups stay in time order, so no row is published before its time.
        """
        if len(wave.tenants) < 2:
            return wave
        weights = dict(Tenant.objects.filter(id__in=wave.tenants).values_list("id", "relay_weight"))
        rows = wave.rows
        now = self.clock.now()
        ordered: list[HeldRow] = []
        start = 0
        while start < len(rows):
            bound = max(rows[start].available_at, now)
            end = start
            while end < len(rows) and rows[end].available_at <= bound:
                end += 1
            group = rows[start:end]
            positions = fair_positions([row.tenant_id for row in group], weights)
            ordered.extend(group[i] for i in positions)
            start = end
        return Wave(start=wave.start, rows=ordered, tenants=wave.tenants)

    def _take_tokens(self, wave: Wave, rates: dict[int, int]) -> tuple[Wave, dict[int, int], int]:
        """Take the trigger-rate tokens of the wave's rate-limited tenants; returns the wave
        without the rows over budget (their claims given back at once, for the polling path
        to publish when the tenant has tokens again), the grants and the rows left.

        In a short transaction of its own, before the wave's: the budget rows are not held
        locked while the wave waits for its instant, so other relays are not stalled on
        them. The tokens are taken as of the wave's first due time (the rows are published
        then or later, never before), and tokens of rows the wave then does not publish
        (dropped, locked, already sent) are given back after its commit.
        """
        wanted: Counter[int] = Counter(r.tenant_id for r in wave.rows if r.tenant_id in rates)
        at = max(self.clock.now(), wave.start)
        with transaction.atomic():
            granted = budget.take_trigger(wanted, rates, at)
        left = dict(granted)
        keep: list[HeldRow] = []
        over: list[HeldRow] = []
        for row in wave.rows:  # in due order: a tenant's earliest rows go first
            if row.tenant_id not in rates:
                keep.append(row)
            elif left[row.tenant_id] > 0:
                left[row.tenant_id] -= 1
                keep.append(row)
            else:
                over.append(row)
        if over:
            self._release([r.outbox_id for r in over])
            quotas.count_throttled(dict(Counter(r.tenant_id for r in over)))
        return Wave(start=wave.start, rows=keep, tenants=wave.tenants), granted, len(over)

    def _fire_locked(
        self, wave: Wave, pulse: Pulse, stopping: StopDeferral
    ) -> tuple[RelayReport, list[int]]:
        started = time.perf_counter()
        opened = self.clock.now()
        lost = self._fence({r.shard for r in wave.rows})
        rows = [r for r in wave.rows if r.shard not in lost]
        release = [r.outbox_id for r in wave.rows if r.shard in lost]
        fenced = len(release)
        states = self._lock(rows, pulse)
        versions, unsent = self._current(rows, states, pulse)
        send: list[HeldRow] = []
        drop: list[int] = []
        stale: list[uuid.UUID] = []
        for i, row in enumerate(rows):
            if i % PULSE_ROWS == 0:
                pulse()
            locked = states.get(row.occurrence_id)
            if locked is None:
                release.append(row.outbox_id)  # a worker or lifecycle call holds it: later
                continue
            state, version, manual, schedule_id = locked[:4]
            if row.outbox_id not in unsent:
                continue  # another relay sent it before our lock
            current = versions.get(schedule_id)
            if state not in _PUBLISHABLE:
                drop.append(row.outbox_id)
            elif current != version and not manual:
                drop.append(row.outbox_id)
                stale.append(row.occurrence_id)
            elif current != row.schedule_version:
                release.append(row.outbox_id)  # manual, schedule changed: rebuild later
            else:
                send.append(row)
        now = self.clock.now()
        invalidated = self._drop(drop, stale, now, pulse)
        self.stats.add("lock", len(wave.rows), started)
        locked_at = self.clock.now()
        if send:
            fault_point("relay.before_publish")
        accepted, late = self._publish_at_times(send, stopping)
        release.extend(r.outbox_id for r in late)
        fault_point("relay.after_publish")
        fault_point("relay.before_mark")
        marked = self._mark(accepted, pulse)
        # Logged and observed after the commit: nothing between the marks and the commit.
        self._committed = WaveOutcome(wave, opened, locked_at, accepted, states)
        return (
            RelayReport(
                claimed=len(wave.rows),
                published=len(send) - len(late),
                marked=marked,
                dropped=len(drop),
                invalidated=invalidated,
                locked=len(release) - fenced - len(late),
            ),
            release,
        )

    def _after_commit(self) -> list[HeldRow]:
        """Log the committed wave and observe what it published; returns the rows sent."""
        done, self._committed = self._committed, None
        if done is None:
            return []
        self._log_wave(
            done.wave,
            opened=done.opened,
            locked=done.locked,
            accepted=done.accepted,
            created_at=_first_created_at(done),
        )
        self._observe_sent(done)
        return [r for chunk, _ in done.accepted for r in chunk]

    def _observe_sent(self, done: WaveOutcome) -> None:
        """``published_total``, ``schedule_lag_seconds`` and ``state_seconds{SCHEDULED}`` of
        the committed wave, after the commit: work per row that must not lengthen the
        wave's transaction."""
        if not done.accepted or not metrics.is_enabled():
            return
        observed = [
            (r.tenant_id, done.states[r.occurrence_id], at)
            for chunk, at in done.accepted
            for r in chunk
        ]
        slugs = dict(
            Tenant.objects.filter(id__in={t for t, _, _ in observed}).values_list("id", "slug")
        )
        by_time: dict[datetime, list[tuple[str, tuple[Any, ...]]]] = {}
        for tenant_id, locked, at in observed:
            by_time.setdefault(at, []).append((slugs.get(tenant_id, str(tenant_id)), locked))
        for at, rows in by_time.items():
            # locked: (state, version, manual, schedule_id, scheduled_for, created_at)
            first = [
                (tenant, locked[4])
                for tenant, locked in rows
                if observe.first_publish(locked[0], locked[2], locked[1])
            ]
            observe.published(first, at, count=len(rows))
            observe.left_scheduled(
                ((tenant, locked[5]) for tenant, locked in rows if locked[0] == _SCHEDULED), at
            )

    def _log_wave(
        self,
        wave: Wave,
        *,
        opened: datetime,
        locked: datetime,
        accepted: list[tuple[list[HeldRow], datetime]],
        created_at: datetime | None = None,
    ) -> None:
        """One short INFO line per wave (a WARNING when its first row reached the broker
        late: the hold opened too late for the lock, or the loop was busy past the hold
        time), and the stage-by-stage detail at DEBUG for whoever tunes the burst path.

        A first row created at or after its due time (a new schedule's first run "now", a
        run now) could not be planned ahead: being a poll late is expected, not a fault,
        so it stays at INFO.
        """
        if not accepted:
            return
        late = (accepted[0][1] - wave.start).total_seconds()
        last = (accepted[-1][1] - wave.start).total_seconds()
        planned_ahead = created_at is None or created_at < wave.start
        logger.log(
            logging.WARNING if late > 1.0 and planned_ahead else logging.INFO,
            "burst relay: %d row(s) due %s sent %.3f-%.3fs after due",
            len(wave.rows), wave.start.strftime("%H:%M:%S"), late, last,
        )  # fmt: skip
        if len(wave.rows) >= STAGE_LOG_ROWS:
            # Per-stage rates for a capacity plan (docs, "Retention and scale"), for large waves.
            logger.info(
                "burst relay %s: stage rates (rows/s) %s",
                self.token,
                {k: v["rows_per_s"] for k, v in self.stats.rates().items()},
            )
        logger.debug(
            "burst relay %s: wave of %d row(s) due %s: opened %.2fs before, locked in %.2fs, "
            "first accepted %.3fs after due, last %.3fs after; stages %s",
            self.token, len(wave.rows), wave.start.isoformat(),
            (wave.start - opened).total_seconds(), (locked - opened).total_seconds(),
            late, last, self.stats.rates(),
        )  # fmt: skip

    def _fence(self, shards: set[int]) -> set[int]:
        # Read, not locked: a wave holds its transaction for seconds, and a lock on the lease
        # rows would stall their renewal. A takeover during the wave cannot double-publish:
        # the occurrence row locks and the unsent re-check already prevent that.
        if self.shard_fencing is None or not shards:
            return set()
        with connection.cursor() as cur:
            cur.execute(queries.fence(), {"shards": sorted(shards)})
            current = dict(cur.fetchall())
        return {s for s in shards if current.get(s) != self.shard_fencing.get(s)}

    def _lock(self, rows: list[HeldRow], pulse: Pulse) -> dict[uuid.UUID, tuple[Any, ...]]:
        states: dict[uuid.UUID, tuple[Any, ...]] = {}
        with connection.cursor() as cur:
            for chunk in in_pieces(rows, pulse):
                keyed, keys = key_set(r.scheduled_for for r in chunk)
                ids = array_literal([r.occurrence_id for r in chunk], "uuid")
                cur.execute(queries.lock(keyed=keyed), {"ids": ids, "keys": keys})
                states.update((row[0], row[1:]) for row in fetch_pulsing(cur, pulse))
        return states

    def _current(
        self, rows: list[HeldRow], states: Mapping[uuid.UUID, tuple[Any, ...]], pulse: Pulse
    ) -> tuple[dict[uuid.UUID, int], set[int]]:
        """Schedule versions and unsent outbox ids, read in statements after the locks."""
        schedule_ids = list({s[3] for s in states.values()})
        pulse()
        outbox_rows = [r for r in rows if r.occurrence_id in states]
        pulse()
        versions: dict[uuid.UUID, int] = {}
        unsent: set[int] = set()
        with connection.cursor() as cur:
            for chunk in in_pieces(schedule_ids, pulse):
                cur.execute(queries.versions(), {"ids": array_literal(chunk, "uuid")})
                versions.update(fetch_pulsing(cur, pulse))
            for piece in in_pieces(outbox_rows, pulse):
                keyed, keys = key_set(r.scheduled_for for r in piece)
                ids = array_literal([r.outbox_id for r in piece], "bigint")
                params = {"ids": ids, "keys": keys, "token": self.token}
                cur.execute(queries.unsent(keyed=keyed), params)
                unsent.update(i for (i,) in fetch_pulsing(cur, pulse))
        return versions, unsent

    def _drop(self, drop: list[int], stale: list[uuid.UUID], now: datetime, pulse: Pulse) -> int:
        invalidated = 0
        reason = "invalidated: schedule version changed before publishing"
        with connection.cursor() as cur:
            for chunk in in_pieces(stale, pulse):
                cur.execute(
                    queries.cancel_stale(),
                    {
                        "state": OccurrenceState.CANCELED.value,
                        "now": now,
                        "reason": reason,
                        "ids": chunk,
                        "sources": CANCEL_FROM,
                    },
                )
                invalidated += cur.rowcount
            for ids in in_pieces(sorted(drop), pulse):
                cur.execute(queries.drop(), {"now": now, "ids": ids})
        return invalidated

    def _publish_at_times(
        self, send: list[HeldRow], stopping: StopDeferral
    ) -> tuple[list[tuple[list[HeldRow], datetime]], list[HeldRow]]:
        """Publish in the wave's order (instants in time order, each one's rows in fair
        order), each row not before its time; returns chunks with the instant the broker had
        accepted each, and the rows not published because the wave woke too late for them
        (given back to the general path)."""
        accepted: list[tuple[list[HeldRow], datetime]] = []
        started = time.perf_counter()
        size = self.publish_chunk
        i = 0
        while i < len(send):
            due_at = send[i].available_at
            slept = self._wait_until(due_at)
            started += slept
            if not self._still_ours(due_at, slept=slept):
                return accepted, send[i:]
            due_by = max(due_at, self.clock.now())
            j = i
            while j < len(send) and j - i < size and send[j].available_at <= due_by:
                j += 1
            chunk = send[i:j]
            stopping.hold()  # from the first message on, a rollback would send it again
            try:
                self.publisher.publish_prepared([r.prepared for r in chunk])
            except Exception:
                observe.publish_failed(len(chunk))
                raise
            accepted.append((chunk, self.clock.now()))
            i = j
        self.stats.add("publish", len(send), started)
        return accepted, []

    def _wait_until(self, due_at: datetime) -> float:
        """Sleep until ``due_at`` in short slices, keeping the transaction's session busy
        (a session idle past ``claim_grace_seconds`` is ended by PostgreSQL, by design: that
        is what frees the locks of a stalled beat). Returns the seconds slept."""
        slept = 0.0
        slice_seconds = idle_bound(self.settings) / 4
        while (wait := (due_at - self.clock.now()).total_seconds()) > 0:
            if wait > self.max_lookahead.total_seconds() + self.hold.total_seconds():
                break  # the wall clock stepped back: _still_ours gives the rows up
            step = min(wait, slice_seconds)
            self.clock.sleep(step)
            slept += step
            keepalive()
        keepalive()
        return slept

    def _still_ours(self, due_at: datetime, *, slept: float) -> bool:
        """Re-check the wall clock after every sleep before publishing.

        Woken from a sleep more than ``claim_grace_seconds`` past the rows' time (the
        process was stopped, or the clock jumped), the claims have lapsed and another relay
        may be publishing these rows: give them up instead. Rows a wave reaches late without
        having slept (a large burst publishing behind its instant) stay ours: their
        occurrence rows are locked, no other relay can send them. A wave due far in the
        future (the clock stepped back) is not held either.
        """
        now = self.clock.now()
        late = (now - due_at).total_seconds()
        overslept = slept > 0 and late > self.settings.claim_grace_seconds
        if not overslept and -late <= self.max_lookahead.total_seconds():
            return True
        logger.warning(
            "burst relay %s: woke %.1fs %s its rows' time %s; not publishing them here",
            self.token, abs(late), "after" if late > 0 else "before", due_at.isoformat(),
        )  # fmt: skip
        return False

    def _mark(self, accepted: list[tuple[list[HeldRow], datetime]], pulse: Pulse) -> int:
        """Mark what the broker accepted, a piece at a time (see WAVE_STATEMENT_ROWS).

        The outbox rows are not locked by the wave (only their occurrences are), so their
        marks take them in id order, as the releases do: two relays updating overlapping
        outbox rows then wait on each other in one direction, never in a cycle.
        """
        started = time.perf_counter()
        sent = [
            (r.outbox_id, r.occurrence_id, at, r.scheduled_for)
            for chunk, at in accepted
            for r in chunk
        ]
        pulse()
        if not sent:
            return 0
        sent.sort()
        pulse()
        marked = 0
        enqueued = OccurrenceState.ENQUEUED.value
        with connection.cursor() as cur:
            for piece in in_pieces(sent, pulse):
                outbox_ids, occ_ids, times, row_keys = zip(*piece, strict=True)
                keyed, keys = key_set(row_keys)
                cur.execute(
                    queries.mark_outbox(keyed=keyed),
                    {
                        "ids": array_literal(list(outbox_ids), "bigint"),
                        "times": array_literal(list(times), TIMESTAMPTZ),
                        "keys": keys,
                    },
                )
                marked += cur.rowcount
                cur.execute(
                    queries.mark_occurrence(keyed=keyed),
                    {
                        "state": enqueued,
                        "ids": array_literal(list(occ_ids), "uuid"),
                        "times": array_literal(list(times), TIMESTAMPTZ),
                        "sources": ENQUEUE_FROM,
                        "keys": keys,
                    },
                )
        self.stats.add("mark", len(sent), started)
        return marked

    def _release_quietly(self, ids: list[int]) -> None:
        try:
            self._release(ids)
        except Exception:  # the database may be what failed; the claims then just expire
            logger.warning("burst relay %s: could not release %d claim(s)", self.token, len(ids))

    def _release(self, ids: list[int]) -> int:
        released = 0
        ids = sorted(ids)  # in id order, as the marks (see _mark)
        for start in range(0, len(ids), SQL_CHUNK):
            with connection.cursor() as cur:
                cur.execute(
                    queries.release(),
                    {"ids": ids[start : start + SQL_CHUNK], "token": self.token},
                )
                released += cur.rowcount
        return released


def key_set(times: Iterable[datetime | None]) -> tuple[bool, Any]:
    """(keyed, the distinct partition keys as an array literal) of rows about to be named by
    id in one statement (``queries._KEYS``); (False, None) when one row's key is unknown."""
    distinct = set(times)
    if None in distinct:
        return False, None
    return True, array_literal(sorted(t for t in distinct if t is not None), TIMESTAMPTZ)


def in_pieces(rows: list[T], pulse: Pulse) -> Iterator[list[T]]:
    """``rows`` in pieces of ``WAVE_STATEMENT_ROWS``, one per statement, with a pulse before
    each: what a statement inside the wave's transaction may carry (see the constant)."""
    for start in range(0, len(rows), WAVE_STATEMENT_ROWS):
        pulse()
        yield rows[start : start + WAVE_STATEMENT_ROWS]
