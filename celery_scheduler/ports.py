"""The seams between the Celery side (beat, the task decorator) and the storage that backs it.

The Celery side (:mod:`celery_scheduler.beat`, :mod:`celery_scheduler.tasks`) is written
against these protocols only; the implementations live in ``django_app`` and are chosen in
one place, the composition root :mod:`django_app.wiring`, which the app config's
``ready()`` installs here (:func:`install`). So adding ``django_app`` to
``INSTALLED_APPS`` is what wires the scheduler, and a test may install another backend.

Each protocol's docstring is its contract: which rows are eligible, what changes in what
order, and what a crash at each step leaves behind. The behaviour suites in
``tests/integration/relay`` and ``tests/integration/materialize`` run the same tests over
every implementation.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Protocol

from celery_scheduler import errors
from celery_scheduler.core.clock import Clock
from celery_scheduler.core.reports import MaterializeReport, RelayReport

if TYPE_CHECKING:
    from http.server import ThreadingHTTPServer

    from celery import Celery

    from celery_scheduler.publishers import Publisher


class Relay(Protocol):
    """Moves due outbox rows to the broker: publish, then mark sent; never the other way.

    Eligible: outbox rows with ``sent_at IS NULL`` whose ``available_at`` has come, in this
    relay's shards, not claimed by another live relay, whose occurrence is SCHEDULED,
    ENQUEUED or RETRY_WAIT and of the schedule's current version.

    Order, inside one transaction per batch (or per wave): lock the occurrence rows (SKIP
    LOCKED: a row a worker or lifecycle call holds is left for later); re-read the schedule
    versions and drop what must not go out (an old version -> CANCELED, closed without a
    publish); publish; mark the outbox rows sent and the occurrences ENQUEUED; commit.

    Crash: before the publish, nothing happened (claims lapse after
    ``claim_grace_seconds``); between publish and commit, the marks roll back and the same
    occurrence ids are published again (at least once; the claim makes the duplicate a
    no-op); after the commit, the row is done. Never published before ``available_at``.
    Every implementation orders contended rows by the tenants' relay weights
    (:func:`celery_scheduler.core.fairness.fair_positions`), spends their trigger rate from
    the shared budget (``django_app.tenancy.budget``) and reports what it published through
    the same observers (``django_app.observe``: published, lag, state time).
    """

    def poll(self) -> RelayReport:
        """Relay what is due and claim what is due soon (into memory, held durably)."""
        ...

    def publish_held(self) -> RelayReport:
        """Publish the held rows whose time has come."""
        ...

    def next_due_at(self) -> datetime | None:
        """When the earliest held row is due (None: nothing held)."""
        ...

    def close(self) -> int:
        """Give back every held claim (a clean stop); returns how many."""
        ...


class Materializer(Protocol):
    """Turns due schedules into occurrences + outbox rows, idempotently, from any node.

    Eligible: ACTIVE schedules with ``next_run_at <= now + horizon`` in the given shards.
    Order, one transaction per schedule (or per batch on the set-based path): the fencing
    check of the shard lease (when tokens are given); insert the occurrences with
    deterministic ids ``ON CONFLICT DO NOTHING`` and their outbox rows; advance the cursor
    by a conditional UPDATE on the version and cursor that were read; commit.

    Crash or race: an uncommitted transaction leaves nothing; a conflict means another node
    made the row; a cursor or version that moved (an update, another node) rolls this
    schedule back and it is read again. A time any older version claimed or finished is
    never planned again (``django_app.schedules.replan``).
    """

    def materialize(
        self,
        *,
        clock: Clock,
        shards: Collection[int],
        shard_fencing: Mapping[int, int] | None,
        horizon: timedelta,
        node: str,
    ) -> MaterializeReport:
        """Materialize the due schedules of ``shards`` (see the contract above)."""
        ...

    def due_shards(self, until: datetime) -> set[int]:
        """The shards holding an ACTIVE schedule due by ``until`` (an index range)."""
        ...

    def count_due(self, *, until: datetime, shards: Collection[int] | None, limit: int) -> int:
        """ACTIVE schedules due by ``until`` in ``shards``, counted up to ``limit``."""
        ...


class ShardLeases(Protocol):
    """Which beat node may materialize which shards, with fencing tokens.

    ``refresh`` renews this node's leases and acquires up to its fair share of the
    shards (conditional UPDATEs, checked by row count); a token grows on every
    acquisition, so a node that paused past its lease carries a token the row no longer
    has and its writes are rejected (the writers check it inside their transaction).
    Crash: the leases expire after ``lease_seconds`` and other nodes take the shards.
    """

    @property
    def shard_count(self) -> int:
        """The number of logical shards the leases are taken over (fixed for the object)."""
        ...

    @property
    def held(self) -> dict[int, int]:
        """Shard -> fencing token, as of the last refresh."""
        ...

    @property
    def refresh_interval(self) -> float:
        """Seconds between two refreshes that keep the leases from lapsing."""
        ...

    def refresh(self) -> dict[int, int]:
        """Renew and rebalance; returns what this node holds now."""
        ...

    def release_all(self, *, timeout: float | None = None) -> int:
        """Give every held lease back (a clean stop); returns how many."""
        ...


class Stoppable(Protocol):
    """A helper thread the caller owns (the lease keeper)."""

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the thread to end and wait for it at most ``timeout`` seconds."""
        ...


class IdempotencyStore(Protocol):
    """The record behind ``@idempotent_task``: one business effect per key.

    ``run_once`` runs ``body`` and stores its JSON result under (tenant, task name, key) in
    the same transaction as the effect's own writes; a later run with the same key returns
    the stored result without running the body. Concurrent runs: the store's unique index
    decides, the loser waits for the winner's commit and returns its result. Crash before
    the commit: nothing was recorded, the next delivery runs the body.
    """

    def run_once(
        self,
        key: str,
        *,
        task_name: str,
        occurrence_id: str | None,
        body: Callable[[], object],
        tenant_id: int | None = None,
    ) -> object:
        """``body``'s result, or the result stored by the run that first used the key (as
        it reads back from JSON: a caller expecting a type checks or trusts it)."""
        ...


class BeatSchedule(Protocol):
    """What a ``beat_schedule`` sync reports."""

    created: list[str]
    updated: list[str]
    unchanged: list[str]
    failed: dict[str, str]


class BeatSettings(Protocol):
    """The settings the beat loop reads, as one frozen value (``django_app.conf``'s
    ``SchedulerSettings`` is one): read once per beat step and passed down, never cached
    across steps, so a changed ``CELERY_SCHEDULER`` takes effect at the next step."""

    @property
    def batch_size(self) -> int:
        """Rows per materializer/relay batch: the limit of one reap or redelivery pass."""
        ...

    @property
    def horizon_seconds(self) -> int:
        """How far ahead beat materializes under a light load (the horizon's floor)."""
        ...

    @property
    def max_horizon_seconds(self) -> int:
        """How far ahead beat may materialize when much is due (the horizon's ceiling)."""
        ...

    @property
    def redelivery_timeout_seconds(self) -> int:
        """An ENQUEUED occurrence never claimed this long after its publish is published
        again; 0 turns redelivery off."""
        ...


class Backend(Protocol):
    """Everything the Celery side asks of its storage: built by the composition root.

    Every member may be called from the beat loop's thread only (``new_shard_leases`` may
    start a thread of its own); a database error propagates unless a member says otherwise,
    and beat then backs off and retries the whole step. Nothing here caches settings: the
    values a member needs are passed in or read through :meth:`settings` by the caller.
    """

    @property
    def idempotency(self) -> IdempotencyStore:
        """The store behind ``@idempotent_task`` (contract: :class:`IdempotencyStore`)."""
        ...

    @property
    def materializer(self) -> Materializer:
        """The materializer this database gets (contract: :class:`Materializer`); the same
        object for the backend's life."""
        ...

    def settings(self) -> BeatSettings:
        """The current ``CELERY_SCHEDULER`` settings, read anew on each call (a frozen
        value: callers may keep it for the rest of one step, and pass it down)."""
        ...

    def require_safe_database(self) -> None:
        """Raise :class:`errors.UnsafeDatabase` for a database the scheduler must not use;
        return None (no side effect) for one it may."""
        ...

    def start_metrics_server(self, node: str) -> ThreadingHTTPServer | None:
        """Start serving /metrics, /healthz, /readyz and /status for beat ``node`` in a
        daemon thread when a metrics port is configured; returns the server (the caller
        shuts it down at stop) or None when none is configured."""
        ...

    def new_relay(
        self,
        *,
        app: Celery,
        clock: Clock,
        publisher: Publisher | None,
        node: str,
        lookahead: timedelta,
    ) -> Relay:
        """A new relay for this database and broker (the burst relay where it applies),
        publishing through ``publisher`` (None: the app's default publisher); it holds
        nothing until its first poll. Contract of the result: :class:`Relay`."""
        ...

    def new_shard_leases(
        self, node: str, clock: Clock, *, keeper: Callable[[], bool] | None
    ) -> tuple[ShardLeases, Stoppable | None]:
        """This node's leases (holding none yet), and (``keeper``: whether the loop is
        inside a step now) a started thread renewing them while a step runs long, which
        the caller stops; raises :class:`errors.ShardCountMismatch` when rows are stored
        beyond the shard count."""
        ...

    def check_shard_count(self, shard_count: int) -> None:
        """Raise :class:`errors.ShardCountMismatch` when a schedule or an unsent outbox row
        is stored in a shard at or beyond ``shard_count`` (the setting was lowered without
        a reshard); return None otherwise. Read only."""
        ...

    def count_owned_shards(self, shard_count: int, now: datetime) -> int:
        """How many of the shards below ``shard_count`` some node holds a lease on that has
        not expired at ``now`` (read only; a snapshot, another node may change it)."""
        ...

    def stamp_progress(self, node: str, now: datetime) -> None:
        """Record that beat ``node``'s loop finished a step at ``now`` (what the liveness
        probe reads); one small write, committed on return."""
        ...

    def sync_beat_schedule(self, app: Celery, clock: Clock) -> BeatSchedule:
        """Create or update one schedule per entry of the app's static ``beat_schedule``
        (idempotent: unchanged entries are left alone, so many beats may run it); an entry
        that fails validation is reported in ``failed``, not raised."""
        ...

    def reap_expired(self, clock: Clock, limit: int) -> int:
        """Up to ``limit`` RUNNING occurrences whose worker lease has expired go back
        through the outbox under the same id; returns how many. Each re-queue is
        conditional on the expired lease, so concurrent reapers never double one."""
        ...

    def redeliver_lost(self, clock: Clock, limit: int, timeout: timedelta) -> int:
        """Up to ``limit`` ENQUEUED occurrences never claimed within ``timeout`` (doubled
        per earlier publish) after their publish are published again under the same id;
        returns how many. Each re-open is conditional on the row as read, so concurrent
        passes never double one."""
        ...

    def export_outbox_backlog(self, now: datetime) -> int:
        """Set the ``outbox_backlog`` gauge from the unsent outbox rows due by ``now``;
        returns that count (read only in the database)."""
        ...

    def maintain_partitions(self, now: datetime) -> list[str]:
        """Create the history partitions ahead and drop expired ones where the database
        is partitioned (a no-op elsewhere); many beats may call it at once. Returns the
        names created or dropped; a lock not granted in time skips the round (empty)."""
        ...

    def refresh_statistics(self) -> list[str]:
        """Refresh the planner's statistics of the history partitions that grew fast since
        they were last analyzed (a no-op where the database is not partitioned); many
        beats may call it at once (one does the work). Returns the partitions analyzed."""
        ...


_installed: Backend | None = None


def install(backend: Backend) -> None:
    """Make ``backend`` the one the Celery side uses (the composition root calls this)."""
    global _installed
    _installed = backend


def backend() -> Backend:
    """The installed backend; a clear error when ``django_app`` is not set up."""
    if _installed is None:
        raise errors.ConfigurationError(
            "the scheduler has no storage backend: add 'django_app' to INSTALLED_APPS and "
            "set Django up (django.setup()) before starting beat or running its tasks"
        )
    return _installed
