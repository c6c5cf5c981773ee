"""Shard leases with fencing: which beat node may materialize which logical shards.

Each of the ``shard_count`` ShardLease rows has an owner, an expiry and a fencing token.
Every write here is a conditional UPDATE whose row count is checked:

- renew: ``WHERE shard=s AND owner=me AND fencing_token=held AND expires_at > now``;
- acquire: ``SET owner=me, expires_at=now+lease, fencing_token=fencing_token+1
  WHERE shard=s AND (owner='' OR expires_at IS NULL OR expires_at <= now OR owner=me)``;
- release: ``SET owner='', expires_at=NULL WHERE shard=s AND owner=me AND fencing_token=held``.

The token only grows, and it grows on every acquisition, so a node that paused past its
lease carries a token the row no longer has: writers check it inside their own transaction
(:func:`check`, or the materializer's equivalent) and a stale node's write is rejected. The
check locks the lease row until the writer commits, so a takeover (which skips locked rows
on PostgreSQL) can never slip between the check and the write.

Nodes heartbeat into BeatNode; the live nodes' names fix every node's fair share
(:mod:`celery_scheduler.core.balance`). A node releases its surplus at once and acquires up to
its share on each refresh, so a joining node gets its shards within about two refresh rounds,
and a dead node's shards move once its leases and heartbeat expire (about one lease period).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import reduce
from operator import or_

from django.db import DatabaseError, connection, transaction
from django.db.models import F, Q

from celery_scheduler.core import balance
from celery_scheduler.core.clock import Clock
from celery_scheduler.errors import DatabaseUnavailable, LeaseLost, SchedulerError
from django_app import conf
from django_app.db import queries
from django_app.models import BeatNode, ShardLease

logger = logging.getLogger(__name__)

#: Heartbeat rows older than this many lease periods are deleted (the table stays small).
_PRUNE_AFTER_LEASES = 10


def check(shard: int, token: int, *, node: str | None = None, now: datetime | None = None) -> None:
    """Fencing check for a writer, to call INSIDE its write transaction.

    Passes only if the lease row of ``shard`` still carries ``token`` (and, when given, is
    owned by ``node`` and unexpired at ``now``); raises :class:`LeaseLost` otherwise. The row
    stays locked (``SELECT ... FOR UPDATE``) until the caller's transaction ends, so no new
    owner can bump the token between this check and the caller's commit.
    """
    if not connection.in_atomic_block:
        raise SchedulerError(
            f"shard {shard}: the fencing check must run inside the writer's transaction "
            "(wrap the write in transaction.atomic())"
        )
    rows = ShardLease.objects.select_for_update().filter(shard=shard, fencing_token=token)
    if node is not None:
        rows = rows.filter(owner=node)
    if now is not None:
        rows = rows.filter(expires_at__gt=now)
    if not rows.exists():
        current = ShardLease.objects.filter(shard=shard).values("owner", "fencing_token").first()
        raise LeaseLost(
            f"shard {shard}: lease with fencing token {token}"
            f"{f' owned by {node!r}' if node else ''} is no longer current "
            f"(now: {current or 'no lease row'})"
        )


def _free(now: datetime, node: str) -> Q:
    return Q(owner="") | Q(expires_at__isnull=True) | Q(expires_at__lte=now) | Q(owner=node)


class ShardLeaser:
    """Holds this node's shard leases; call :meth:`refresh` every ``lease_seconds / 3``.

    One leaser per beat loop; :meth:`refresh` (the loop) and :meth:`renew` (a
    :class:`LeaseKeeper` thread) take turns. ``node`` must be unique per process (e.g.
    ``f"{hostname}:{pid}"``): two processes with one name would renew each other's leases.
    """

    def __init__(
        self,
        node: str,
        *,
        clock: Clock,
        shard_count: int | None = None,
        lease_seconds: float | None = None,
    ) -> None:
        if not node:
            raise ValueError("ShardLeaser needs a non-empty node name")
        if not shard_count or not lease_seconds:  # a direct construction (tests)
            cfg = conf.get()
            shard_count = shard_count or cfg.shard_count
            lease_seconds = lease_seconds or cfg.lease_seconds
        self.node = node
        self.clock = clock
        self.shard_count = shard_count
        self.lease = timedelta(seconds=lease_seconds)
        self._held: dict[int, int] = {}
        self._valid_until: datetime | None = None
        self._rows_ready = False
        # refresh() (the loop) and renew() (the LeaseKeeper thread) take turns.
        self._turn = threading.Lock()
        self.last_renewed = clock.monotonic()

    @property
    def refresh_interval(self) -> float:
        """Seconds between refreshes that leave two retries before a lease lapses."""
        return self.lease.total_seconds() / 3

    @property
    def held(self) -> dict[int, int]:
        """Shard -> fencing token held as of the last refresh, empty once that lease lapsed."""
        if self._valid_until is None or self.clock.now() >= self._valid_until:
            return {}
        return dict(self._held)

    def refresh(self) -> dict[int, int]:
        """Heartbeat, renew, release surplus, acquire up to the fair share; return the holdings.

        Raises :class:`DatabaseUnavailable` (a CoordinationUnavailable) if the database
        cannot be reached; the node then holds nothing (it must wait, not run without
        ownership) and the next successful refresh reacquires its shards with new tokens.
        """
        with self._turn:
            try:
                return self._refresh()
            except DatabaseError as exc:
                raise self._unavailable(exc) from exc

    def renew(self) -> dict[int, int] | None:
        """Heartbeat and renew the shards held, nothing else (the LeaseKeeper's call).

        Runs on the calling thread's own database connection. Returns the holdings, or None
        when a :meth:`refresh` is in progress (it renews them anyway).
        """
        if not self._turn.acquire(blocking=False):
            return None
        try:
            now = self.clock.now()
            expires = now + self.lease
            self._heartbeat(now)
            renewed = self._renew(now, expires)
            lost = sorted(set(self._held) - set(renewed))
            if lost:
                logger.warning("node %s lost shard leases %s", self.node, lost)
            self._held = renewed
            self._valid_until = expires
            self.last_renewed = self.clock.monotonic()
            return dict(renewed)
        except DatabaseError as exc:
            raise self._unavailable(exc) from exc
        finally:
            self._turn.release()

    def _unavailable(self, exc: DatabaseError) -> DatabaseUnavailable:
        self._held.clear()
        self._valid_until = None
        if not connection.in_atomic_block:
            # A broken connection would fail every later refresh; reconnect next time.
            connection.close_if_unusable_or_obsolete()
        return DatabaseUnavailable(
            f"node {self.node!r}: cannot reach the database to lease shards ({exc}); "
            "holding no shards until it answers"
        )

    def check(self, shard: int) -> None:
        """:func:`check` with this node's token for ``shard`` (LeaseLost if it holds none)."""
        token = self.held.get(shard)
        if token is None:
            raise LeaseLost(f"node {self.node!r} holds no lease on shard {shard}")
        check(shard, token, node=self.node, now=self.clock.now())

    def release_all(self, *, timeout: float | None = None) -> int:
        """Give every held shard back (token-checked) and drop the heartbeat; returns the count.

        Called on a clean shutdown so other nodes take the shards on their next refresh
        instead of waiting for the leases to expire. ``timeout`` (seconds) bounds every
        lock wait and statement of the release on PostgreSQL.
        """
        held, self._held = self._held, {}
        self._valid_until = None
        try:
            with transaction.atomic():
                if timeout is not None:
                    _bound_statements(timeout)
                released = sum(self._release_one(s, t) for s, t in sorted(held.items()))
                BeatNode.objects.filter(name=self.node).delete()
        except DatabaseError as exc:
            raise DatabaseUnavailable(
                f"node {self.node!r}: could not release shards ({exc}); they expire on their own"
            ) from exc
        return released

    # -- one refresh round -------------------------------------------------------------

    def _refresh(self) -> dict[int, int]:
        now = self.clock.now()
        expires = now + self.lease
        if not self._rows_ready:
            self._ensure_rows()
        live = self._heartbeat(now)
        renewed = self._renew(now, expires)
        lost = sorted(set(self._held) - set(renewed))
        if lost:
            logger.warning("node %s lost shard leases %s", self.node, lost)
        self._held = renewed
        snapshot = list(
            ShardLease.objects.filter(shard__lt=self.shard_count)
            .filter(_free(now, self.node))
            .values_list("shard", "owner")
        )
        step = balance.plan(
            self.node,
            shard_count=self.shard_count,
            live_nodes=live,
            held=self._held,
            free=[shard for shard, _ in snapshot],
            preferred=[shard for shard, owner in snapshot if owner == self.node],
        )
        for shard in step.release:
            self._release_one(shard, self._held.pop(shard))
        if step.acquire:
            self._held.update(self._acquire(step.acquire, now, expires))
        self._valid_until = expires
        self.last_renewed = self.clock.monotonic()
        return dict(self._held)

    def _ensure_rows(self) -> None:
        # Insert only the missing rows: on MySQL/MariaDB an INSERT IGNORE that meets an
        # existing key waits for that row's lock, i.e. for a writer's fencing check to commit.
        existing = set(ShardLease.objects.values_list("shard", flat=True))
        missing = [s for s in range(self.shard_count) if s not in existing]
        if missing:
            ShardLease.objects.bulk_create(
                [ShardLease(shard=s) for s in missing], ignore_conflicts=True
            )
        self._rows_ready = True

    def _heartbeat(self, now: datetime) -> set[str]:
        BeatNode.objects.bulk_create(
            [BeatNode(name=self.node, last_seen=now)],
            update_conflicts=True,
            # MySQL/MariaDB upsert on any unique key (ON DUPLICATE KEY) and take no target.
            unique_fields=(
                ["name"] if connection.features.supports_update_conflicts_with_target else None
            ),
            update_fields=["last_seen"],
        )
        BeatNode.objects.filter(last_seen__lt=now - _PRUNE_AFTER_LEASES * self.lease).delete()
        alive_since = now - self.lease
        return set(
            BeatNode.objects.filter(last_seen__gt=alive_since).values_list("name", flat=True)
        )

    def _renew(self, now: datetime, expires: datetime) -> dict[int, int]:
        if not self._held:
            return {}
        # One statement for every held shard (not one per shard: 64 round trips a poll),
        # each row matched on its own fencing token.
        ours = reduce(or_, (Q(shard=s, fencing_token=t) for s, t in self._held.items()))
        with transaction.atomic():
            self._bound_lock_wait()
            ShardLease.objects.filter(ours, owner=self.node, expires_at__gt=now).update(
                expires_at=expires
            )
            renewed = ShardLease.objects.filter(ours, owner=self.node, expires_at=expires)
            return dict(renewed.values_list("shard", "fencing_token"))

    def _acquire(self, shards: tuple[int, ...], now: datetime, expires: datetime) -> dict[int, int]:
        with transaction.atomic():
            self._bound_lock_wait()
            candidates = ShardLease.objects.filter(shard__in=shards).filter(_free(now, self.node))
            if connection.features.has_select_for_update_skip_locked:
                # A row locked by another node's takeover or by a writer's fencing check is
                # skipped, not waited on: a paused writer must not stall the whole cluster.
                locked = list(
                    candidates.select_for_update(skip_locked=True).values_list("shard", flat=True)
                )
                candidates = ShardLease.objects.filter(shard__in=locked).filter(
                    _free(now, self.node)
                )
            candidates.update(
                owner=self.node, expires_at=expires, fencing_token=F("fencing_token") + 1
            )
            # Inside the same transaction the rows we just wrote are still locked/ours.
            got = dict(
                ShardLease.objects.filter(
                    shard__in=shards, owner=self.node, expires_at=expires
                ).values_list("shard", "fencing_token")
            )
        return {s: t for s, t in got.items() if s not in self._held}

    def _release_one(self, shard: int, token: int) -> int:
        return ShardLease.objects.filter(shard=shard, owner=self.node, fencing_token=token).update(
            owner="", expires_at=None
        )

    def _bound_lock_wait(self) -> None:
        # A lease transaction waits for a row lock at most a third of a lease; past that the
        # refresh fails (CoordinationUnavailable) rather than let our own leases lapse.
        if connection.vendor == "postgresql":
            ms = max(1, int(self.refresh_interval * 1000))
            with connection.cursor() as cur:
                cur.execute(queries.lock_timeout(ms))


class LeaseKeeper:
    """Renews a :class:`ShardLeaser`'s leases from a thread (and connection) of its own.

    The beat loop refreshes its leases between steps, but one step can last longer than a
    lease: a burst wave holds its transaction from before its instant until the broker
    accepted it. Whenever the loop, inside a step (``in_step``), has not renewed for half a
    refresh interval, this thread renews (heartbeat + renew only: acquiring and releasing
    stay with the loop), so a long step never costs the node its shards. Between steps it
    leaves them to the loop: a loop whose every step fails before its lease refresh (a
    broker this node cannot reach) lets them lapse, and other beats take them over.
    """

    def __init__(self, leaser: ShardLeaser, in_step: Callable[[], bool]) -> None:
        self.leaser = leaser
        self.in_step = in_step
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"{leaser.node} lease keeper", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        leaser = self.leaser
        every = leaser.refresh_interval / 2
        while not self._stop.wait(every / 2):
            if not self.in_step() or leaser.clock.monotonic() - leaser.last_renewed < every:
                continue
            try:
                leaser.renew()
            except DatabaseUnavailable as exc:
                logger.warning("node %s: lease keeper: %s", leaser.node, exc)
            finally:
                # Renewing here is the exception (the loop is stuck in a long step): no
                # idle connection is kept for it.
                connection.close()


def _bound_statements(seconds: float) -> None:
    """Inside a transaction on PostgreSQL: no lock wait or statement lasts over ``seconds``."""
    if connection.vendor == "postgresql":
        ms = max(1, int(seconds * 1000))
        with connection.cursor() as cur:
            cur.execute(queries.lock_timeout(ms))
            cur.execute(queries.statement_timeout(ms))
