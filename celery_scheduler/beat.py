"""``celery beat`` scheduler backed by the database: many beat processes may run at once.

Use it with ``CELERY_BEAT_SCHEDULER = "celery_scheduler.beat:DatabaseScheduler"`` or
``celery -A proj beat -S celery_scheduler.beat:DatabaseScheduler``.

The beat loop contract (:meth:`DatabaseScheduler.tick`, called by Celery's beat service,
which sleeps for the returned number of seconds):

1. every ``poll_interval`` seconds: materialize due schedules (``materialize_due``), relay
   rows already due, and claim rows due within ``lookahead`` into the in-memory dispatcher;
2. on every tick: publish the held rows whose ``available_at`` has come;
3. return the seconds until the earlier of the next held row and the next poll, bounded by
   ``max_interval``, so a strict occurrence is published at its time, not at the next poll.

No locks are taken between beat processes: the occurrence unique key, the conditional cursor
update, ``SKIP LOCKED``/claims on the outbox and the conditional "mark sent" make concurrent
beats safe. A database or broker error is logged and the loop backs off exponentially (up to
``max_interval``) and tries again; nothing is published without the database, and nothing is
marked sent that the broker did not accept.

Storage is reached only through :mod:`celery_scheduler.ports` (the backend the composition
root :mod:`django_app.wiring` installs when Django sets up ``django_app``). Django is set up
lazily (``django.setup()`` is called if the app registry is not ready), so importing this
module costs nothing in processes that never start beat.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
from datetime import timedelta
from http.server import ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from celery import beat

from celery_scheduler import errors, metrics, ports
from celery_scheduler.core.clock import SYSTEM_CLOCK, Clock
from celery_scheduler.core.lead import RateMeter, lead_seconds, pending_cap

if TYPE_CHECKING:
    from collections.abc import Callable

    from celery_scheduler.core.reports import RelayReport
    from celery_scheduler.ports import Relay, ShardLeases, Stoppable

logger = logging.getLogger(__name__)

#: Seconds between database polls (materialize + claim ahead).
DEFAULT_POLL_INTERVAL = 1.0
#: How far ahead the relay claims rows into its dispatcher.
DEFAULT_LOOKAHEAD = timedelta(seconds=3)
#: Seconds a clean stop may spend handing shards and claims back (then they just expire).
DEFAULT_STOP_TIMEOUT = 5.0
#: First back-off after an error; doubles up to max_interval.
BACKOFF_START = 0.5
#: Seconds between checks for rows stored in shards >= shard_count while running.
STRAND_CHECK_INTERVAL = 60.0


#: Exit status when beat refuses its configuration (sysexits.h EX_CONFIG): a supervisor can
#: tell it from a crash and stop restarting it.
EXIT_CONFIGURATION = 78

#: Seconds between two progress stamps of the loop (BeatNode.progress_at).
PROGRESS_STAMP_INTERVAL = 1.0
#: Materializing rate assumed before one was measured (rows/s): low on purpose, so the
#: first large burst after a start is planned early rather than late: an assumed rate above
#: the one two beats sharing two cores achieve started a 500,000-row instant too late
#: (bench/README.md, "How 500,000 with two beats got there").
ASSUMED_MATERIALIZE_ROWS_PER_SECOND = 500
#: Relaying rate assumed before one was measured (rows published per second of relay work:
#: claim, prepare, lock, publish, mark), as low as the burst relay's assumed claim rate.
ASSUMED_RELAY_ROWS_PER_SECOND = 2_000
#: Rows published between two readings of the relay's rate (smaller samples are mostly
#: the fixed cost of polls).
RELAY_MEASURE_ROWS = 10_000
#: Materializing passes at least this large log their rate at INFO (docs: "Retention and scale").
STAGE_LOG_ROWS = 10_000
#: Seconds between two readings of the schedules due within ``max_horizon_seconds``...
HORIZON_REFRESH_SECONDS = 5.0
#: ...or this many times what the last reading took, if longer.
SIZING_COST_FACTOR = 20.0
#: Share of the redelivery timeout between two redelivery passes (at least every poll, at
#: most 30 s): well inside the timeout, without rescanning a large backlog on every poll.
REDELIVERY_PASS_SHARE = 0.1
#: Seconds between two counts of the outbox backlog (the ``outbox_backlog`` gauge): one
#: indexed count, not one per poll; Prometheus scrapes every 15 s or so anyway.
BACKLOG_EXPORT_INTERVAL = 5.0
#: Between two partition maintenance rounds (seconds): slots are days wide and created
#: several ahead, so a round every few minutes is plenty, and it is one catalog read when
#: nothing is due.
PARTITION_MAINTENANCE_INTERVAL = 300.0
#: Rows a beat creates between two checks for history partitions to analyze.
STATISTICS_CHECK_ROWS = 20_000


def ensure_django() -> None:
    """Set Django up if the process has not (``celery beat`` does not)."""
    # deferred (app registry): beat sets Django up itself; celery_scheduler is Django-free
    from django.apps import apps

    if not apps.ready:
        import django  # deferred (app registry): see above

        django.setup()


def node_name() -> str:
    return f"beat@{socket.gethostname()}:{os.getpid()}"


class DatabaseScheduler(beat.Scheduler):
    """A :class:`celery.beat.Scheduler` whose schedule lives in the database.

    Keyword arguments beyond Celery's: ``clock``, ``publisher`` (default: the Celery
    publisher of ``app``), ``poll_interval`` (seconds), ``lookahead`` (timedelta),
    ``stop_timeout`` (seconds a stop may spend releasing), ``lease_keeper`` (renew the
    shard leases from a thread while a step runs long; default: with the system clock).
    """

    #: Celery's default (300 s) is far too long for a loop that must wake for strict work.
    max_interval = 5

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        self.clock: Clock = kwargs.pop("clock", None) or SYSTEM_CLOCK
        self._backend: ports.Backend | None = kwargs.pop("backend", None)
        self._publisher = kwargs.pop("publisher", None)
        self.poll_interval = float(kwargs.pop("poll_interval", DEFAULT_POLL_INTERVAL))
        self.lookahead: timedelta = kwargs.pop("lookahead", DEFAULT_LOOKAHEAD)
        self.use_shard_leases = bool(kwargs.pop("use_shard_leases", True))
        self.stop_timeout = float(kwargs.pop("stop_timeout", DEFAULT_STOP_TIMEOUT))
        # The keeper thread measures real time: with an injected clock (tests) it runs only
        # when asked for.
        keeper = kwargs.pop("lease_keeper", None)
        self.lease_keeper = self.clock is SYSTEM_CLOCK if keeper is None else bool(keeper)
        self._keeper: Stoppable | None = None
        self._busy = False
        kwargs.pop("schedule_filename", None)  # Celery passes it; we keep no file
        self.node = node_name()
        self._relay: Relay | None = None
        self._leaser: ShardLeases | None = None
        self._next_lease_refresh = 0.0
        self._next_strand_check = 0.0
        self._next_progress_stamp = 0.0
        self._metrics_server: ThreadingHTTPServer | None = None
        self._synced = False
        self._next_poll = 0.0
        self._next_redelivery = 0.0
        self._next_backlog_export = 0.0
        self._next_partition_round = 0.0
        self._created_since_statistics = 0
        self._last_relay_poll = 0.0
        self.materialize_rate = RateMeter(assumed=ASSUMED_MATERIALIZE_ROWS_PER_SECOND)
        self.relay_rate = RateMeter(assumed=ASSUMED_RELAY_ROWS_PER_SECOND)
        self._relay_sample = (0, 0.0)  # rows published, seconds, since the last reading
        self._horizon: timedelta | None = None
        self._next_horizon_sizing = 0.0
        self._horizon_bounds = (0.0, 0.0)
        self._random = random.Random()
        self._backoff = 0.0
        super().__init__(app, *args, **kwargs)

    @property
    def backend(self) -> ports.Backend:
        """The storage behind this scheduler (the installed one unless one was given)."""
        if self._backend is None:
            ensure_django()
            self._backend = ports.backend()
        return self._backend

    # -- celery.beat.Scheduler API ----------------------------------------------------------

    def setup_schedule(self) -> None:
        """Sync the static ``beat_schedule`` (retried from ``tick`` if the DB is down).

        Refuses to start on a database that cannot carry the guarantees: one CRITICAL line
        naming the fix, then exit status 78 (``EX_CONFIG``). Not an exception: Celery would
        log its traceback, then print it again through its stderr redirect, one WARNING line
        per token (~700 lines burying the one that says what to set).
        """
        try:
            self.backend.require_safe_database()
        except errors.UnsafeDatabase as exc:
            logger.critical("beat %s: %s", self.node, exc, extra={"event": "unsafe_database"})
            raise SystemExit(EXIT_CONFIGURATION) from None
        if self._metrics_server is None:
            self._metrics_server = self.backend.start_metrics_server(self.node)
        self._busy = True
        try:
            self._sync_static()
        finally:
            self._busy = False

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """One step of the loop (module docstring); returns seconds to sleep."""
        self._busy = True
        try:
            self._step()
        except errors.ConfigurationError:
            raise  # refuse to run rather than strand schedules or break a guarantee
        except Exception as exc:
            return self._failed(exc)
        finally:
            self._busy = False
        self._backoff = 0.0
        self._stamp_progress()
        return self._sleep_time()

    def _in_step(self) -> bool:
        """Whether the loop is inside a step that may run long and must keep its shards
        (read by the lease keeper's thread): not one that retries a failure (the back-off
        is set until a step succeeds). A node whose steps keep failing, fast or slowly
        (a broker only it cannot reach), lets its leases lapse to the other beats."""
        return self._busy and not self._backoff

    def _stamp_progress(self) -> None:
        """Record that the loop finished a step (``scheduler_status --liveness`` reads it).

        At most once per second: one small UPDATE, not one per tick. A failure is not the
        loop's failure: the probe then sees no progress, which is the truth it reports.
        """
        if self.clock.monotonic() < self._next_progress_stamp:
            return
        self._next_progress_stamp = self.clock.monotonic() + PROGRESS_STAMP_INTERVAL
        try:
            self.backend.stamp_progress(self.node, self.clock.now())
        except Exception:  # reported by the probe, never fatal to the loop
            logger.debug("beat %s: progress stamp failed", self.node, exc_info=True)

    def sync(self) -> None:
        """Nothing to persist: every state change was committed when it happened."""

    def close(self) -> None:
        """Release the shard leases and held claims, within ``stop_timeout`` seconds.

        Celery's SIGTERM handler calls this from inside whatever the loop was doing. If that
        was our own database work, the interrupted query still holds the connection (and its
        lock): nothing is done here then; the handler's SystemExit unwinds the loop (rolling
        its transaction back) and Celery calls ``close`` again from its ``finally``. The
        release itself runs on a fresh connection in a helper thread that is waited for at
        most ``stop_timeout`` seconds, so a stop never hangs on the database.
        """
        if self._busy:
            logger.info("beat %s: stop requested; releasing after the current step", self.node)
            return
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.stop(min(1.0, self.stop_timeout))
        server, self._metrics_server = self._metrics_server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        leaser, self._leaser = self._leaser, None
        relay, self._relay = self._relay, None
        if leaser is None and relay is None:
            return
        from django.db import connection  # deferred (import-light): no Django at import

        if connection.in_atomic_block:  # a caller's transaction (tests): release in it
            self._release(leaser, relay)
            return
        self._close_db()  # an interrupted query may have left it mid-command
        done = threading.Thread(
            target=self._release_on_own_connection,
            args=(leaser, relay),
            name=f"{self.node} release",
            daemon=True,
        )
        done.start()
        done.join(self.stop_timeout)
        if done.is_alive():
            logger.warning(
                "beat %s: releasing shards and claims took over %.1fs; giving up (they "
                "expire on their own)", self.node, self.stop_timeout,
            )  # fmt: skip

    def _release_on_own_connection(self, leaser: ShardLeases | None, relay: Relay | None) -> None:
        """The helper thread of :meth:`close` (Django gives it a connection of its own)."""
        from django.db import connection  # deferred (import-light): no Django at import

        try:
            self._release(leaser, relay)
        finally:
            connection.close()

    def _release(self, leaser: ShardLeases | None, relay: Relay | None) -> None:
        if leaser is not None:
            try:
                released = leaser.release_all(timeout=self.stop_timeout)
                logger.info("beat %s: released %d shard lease(s)", self.node, released)
            except Exception:  # the leases expire on their own
                logger.warning("beat %s: could not release shard leases", self.node)
        if relay is not None:
            try:
                released = relay.close()
                logger.info("beat %s: released %d held claim(s)", self.node, released)
            except Exception:  # the claims expire on their own
                logger.warning("beat %s: could not release held claims", self.node)

    @property
    def info(self) -> str:
        return (
            f"    . db scheduler -> node {self.node}, poll {self.poll_interval:g}s, "
            f"lookahead {self.lookahead.total_seconds():g}s"
        )

    # -- internals --------------------------------------------------------------------------

    def _sync_static(self) -> None:
        try:
            report = self.backend.sync_beat_schedule(self.app, self.clock)
        except Exception:
            logger.warning("beat %s: beat_schedule sync failed; will retry", self.node,
                           exc_info=True)  # fmt: skip
            self._close_db()
            return
        self._synced = True
        if report.created or report.updated or report.failed:
            logger.info(
                "beat_schedule synced: created %s, updated %s, unchanged %d, failed %s",
                report.created, report.updated, len(report.unchanged), report.failed,
            )  # fmt: skip

    def _relay_or_create(self) -> Relay:
        if self._relay is None:
            self._relay = self.backend.new_relay(
                app=self.app,
                clock=self.clock,
                publisher=self._publisher,
                node=self.node,
                lookahead=self.lookahead,
            )
        return self._relay

    def _step(self) -> None:
        if not self._synced:
            self._sync_static()
        relay = self._relay_or_create()
        self._relay_work(relay.publish_held)
        if self.clock.monotonic() >= self._next_poll:
            self._next_poll = self.clock.monotonic() + self.poll_interval
            cfg = self.backend.settings()  # once per step, passed down
            self._relay_poll(relay)
            self._materialize(relay, cfg)
            self._reap_expired_leases(cfg)
            self._redeliver_lost(cfg)
            self._relay_poll(relay)
            self._export_backlog()
            self._maintain_partitions()

    def _export_backlog(self) -> None:
        """Set the ``outbox_backlog`` gauge, every ``BACKLOG_EXPORT_INTERVAL`` seconds."""
        if not metrics.is_enabled() or self.clock.monotonic() < self._next_backlog_export:
            return
        self._next_backlog_export = self.clock.monotonic() + BACKLOG_EXPORT_INTERVAL
        self.backend.export_outbox_backlog(self.clock.now())

    def _maintain_partitions(self) -> None:
        """Keep the history partitions ahead of the clock, from the beat loop itself (no
        extra process); every beat may run it: one advisory lock serialises the rounds."""
        if self.clock.monotonic() < self._next_partition_round:
            return
        self._next_partition_round = self.clock.monotonic() + PARTITION_MAINTENANCE_INTERVAL
        done = self.backend.maintain_partitions(self.clock.now())
        if done:
            logger.info("beat %s: partitions created/dropped: %s", self.node, ", ".join(done))

    def _refresh_statistics(self, created: int) -> None:
        """After every ``STATISTICS_CHECK_ROWS`` rows this beat created, let the backend
        refresh the statistics of the history partitions that grew fast (a burst or a
        catch-up fills a new slot faster than autovacuum analyzes it)."""
        self._created_since_statistics += created
        if self._created_since_statistics < STATISTICS_CHECK_ROWS:
            return
        self._created_since_statistics = 0
        analyzed = self.backend.refresh_statistics()
        if analyzed:
            logger.info("beat %s: analyzed %s", self.node, ", ".join(analyzed))

    def _reap_expired_leases(self, cfg: ports.BeatSettings) -> None:
        """Occurrences whose worker lease expired go back through the outbox (same id).

        Every beat may do this: the reaper's updates are conditional on the expired lease,
        so two beats reaping at once cannot both re-queue one occurrence.
        """
        reaped = self.backend.reap_expired(self.clock, cfg.batch_size)
        if reaped:
            logger.info("beat %s: re-queued %d expired occurrence lease(s)", self.node, reaped)

    def _redeliver_lost(self, cfg: ports.BeatSettings) -> None:
        """Occurrences whose message the broker lost go back through the outbox (same id).

        Every beat may do this too: each re-open is conditional on the ``sent_at`` it read,
        so two beats cannot both re-publish one occurrence (django_app.relay.redelivery).
        """
        seconds = cfg.redelivery_timeout_seconds
        if seconds <= 0 or self.clock.monotonic() < self._next_redelivery:
            return  # 0: redelivery is off
        timeout = timedelta(seconds=seconds)
        share = seconds * REDELIVERY_PASS_SHARE
        self._next_redelivery = self.clock.monotonic() + min(max(share, self.poll_interval), 30.0)
        limit = cfg.batch_size
        redelivered = self.backend.redeliver_lost(self.clock, limit, timeout)
        if redelivered >= limit:  # a mass loss (a flushed queue): go on at the next poll
            self._next_redelivery = 0.0
        if redelivered:
            logger.info("beat %s: re-queued %d lost message(s)", self.node, redelivered)

    def _relay_poll(self, relay: Relay) -> None:
        self._relay_work(relay.poll)
        self._relay_work(relay.publish_held)  # rows claimed just now may be due already
        self._last_relay_poll = self.clock.monotonic()

    def _relay_work(self, call: Callable[[], RelayReport]) -> None:
        """One relay call, timed when it did work: the relay and the materializer share
        this thread, so the horizon is sized from both rates (:meth:`_plan_horizon`)."""
        started = time.perf_counter()
        report = call()
        if not (report.published or report.held or report.claimed):
            return  # an empty poll measures the loop's fixed cost, not a row's
        rows, seconds = self._relay_sample
        rows, seconds = rows + report.published, seconds + time.perf_counter() - started
        if rows >= RELAY_MEASURE_ROWS:
            self.relay_rate.observe(rows, seconds)
            rows, seconds = 0, 0.0
        self._relay_sample = (rows, seconds)

    def _materialize(self, relay: Relay, cfg: ports.BeatSettings) -> None:
        """Materialize shard by shard, starting at a random shard, relaying in between.

        Beats that start together then work on different shards instead of queueing on the
        same rows' unique-index locks, and a long pass (a burst of due schedules) does not
        delay held rows: they are published between shards.

        Two stages when the horizon is above its floor: every shard's schedules up to
        ``horizon_seconds`` first, then the look-ahead, shard by shard, until the fire
        times planned first start coming due (half the floor). Planning each schedule
        minutes ahead in one stage would leave the shards visited last (a long pass after
        an outage) with due work waiting behind other shards' future.
        """
        fencing = self._shard_leases()
        if fencing is not None and not fencing:
            return  # holds no shard (yet): materializing is another node's job meanwhile
        horizon = self._plan_horizon(cfg, None if fencing is None else list(fencing))
        floor = timedelta(seconds=cfg.horizon_seconds)
        started = self.clock.monotonic()
        rows, spent = self._materialize_shards(relay, min(horizon, floor), deadline=None)
        if horizon > floor:
            deadline = started + floor.total_seconds() / 2
            more, took = self._materialize_shards(relay, horizon, deadline=deadline)
            rows, spent = rows + more, spent + took
        self.materialize_rate.observe(rows, spent)
        if rows >= STAGE_LOG_ROWS:
            logger.info("beat %s: materialized %d row(s) in %.1fs (%.0f rows/s)", self.node,
                        rows, spent, rows / spent if spent else 0.0)  # fmt: skip

    def _materialize_shards(
        self, relay: Relay, horizon: timedelta, *, deadline: float | None
    ) -> tuple[int, float]:
        """One pass over the held shards with schedules due within ``horizon``; stops
        after the first shard past ``deadline`` (monotonic). Returns (rows, seconds)."""
        materializer = self.backend.materializer
        fencing = self._shard_leases()
        due = materializer.due_shards(self.clock.now() + horizon)
        if fencing is not None:
            due &= set(fencing)
        ordered = sorted(due)
        start = self._random.randrange(len(ordered)) if ordered else 0
        rows, spent = 0, 0.0
        for shard in ordered[start:] + ordered[:start]:
            # Renew during a long pass too, or the leases lapse halfway through it.
            fencing = self._shard_leases()
            if fencing is not None and shard not in fencing:
                continue
            began = time.perf_counter()
            report = materializer.materialize(
                clock=self.clock,
                shards=[shard],
                shard_fencing={shard: fencing[shard]} if fencing is not None else None,
                horizon=horizon,
                node=self.node,
            )
            rows += report.occurrences_created + report.missed
            spent += time.perf_counter() - began
            self._refresh_statistics(report.occurrences_created + report.missed)
            self._relay_work(relay.publish_held)
            if self.clock.monotonic() - self._last_relay_poll >= self.poll_interval:
                self._relay_poll(relay)
            if deadline is not None and self.clock.monotonic() >= deadline:
                break  # the next tick plans what came due meanwhile first
        return rows, spent

    def _plan_horizon(self, cfg: ports.BeatSettings, shards: list[int] | None) -> timedelta:
        """How far ahead to materialize: ``horizon_seconds`` for a light load, up to
        ``max_horizon_seconds`` when the schedules due before that bound would take this node
        long to materialize at its measured rate (:mod:`celery_scheduler.core.lead`): the
        top of the hour is planned minutes ahead, an everyday load keeps few future rows.
        Re-read every few seconds (a capped index count over the node's shards)."""
        floor = float(cfg.horizon_seconds)
        ceiling = max(floor, float(cfg.max_horizon_seconds))
        bounds = (floor, ceiling)
        if (
            self._horizon is not None
            and self.clock.monotonic() < self._next_horizon_sizing
            and bounds == self._horizon_bounds
        ):
            return self._horizon
        self._horizon_bounds = bounds
        # Each row planned is then claimed, prepared, published and marked by this same
        # thread: size the lead from the whole path, not from materializing alone (at the
        # rate materializing alone allows, a peak was planned too late to be relayed).
        rate = 1 / (1 / self.materialize_rate.rate + 1 / self.relay_rate.rate)
        started = time.perf_counter()
        pending = self.backend.materializer.count_due(
            until=self.clock.now() + timedelta(seconds=ceiling),
            shards=shards,
            limit=pending_cap(rate, floor=floor, ceiling=ceiling),
        )
        seconds = lead_seconds(pending, rate, floor=floor, ceiling=ceiling)
        if self._horizon is None or abs(seconds - self._horizon.total_seconds()) >= 1:
            logger.debug("beat %s: horizon %.0fs (%d due, %.0f rows/s)", self.node, seconds,
                         pending, rate)  # fmt: skip
        self._horizon = timedelta(seconds=seconds)
        # A count over a large pending set is not free: keep it under ~5 % of the loop.
        spent = time.perf_counter() - started
        every = max(HORIZON_REFRESH_SECONDS, SIZING_COST_FACTOR * spent)
        self._next_horizon_sizing = self.clock.monotonic() + every
        return self._horizon

    def _shard_leases(self) -> dict[int, int] | None:
        """Shard -> fencing token this node holds (refreshed each poll); None: no leasing.

        Refreshing every poll (not only every lease/3) lets beats that start together
        settle on their fair shares within a couple of seconds.
        """
        if not self.use_shard_leases:
            return None
        if self._leaser is None:
            self._leaser, self._keeper = self.backend.new_shard_leases(
                self.node, self.clock, keeper=self._in_step if self.lease_keeper else None
            )
            self._next_strand_check = self.clock.monotonic() + STRAND_CHECK_INTERVAL
        elif self.clock.monotonic() >= self._next_strand_check:
            self._warn_stranded(self._leaser.shard_count)
        if self.clock.monotonic() >= self._next_lease_refresh:
            before = set(self._leaser.held)
            after = set(self._leaser.refresh())
            if after != before:
                logger.info("beat %s: holds %d shard(s)", self.node, len(after))
            self._export_shard_gauges(len(after), self._leaser.shard_count)
            interval = min(self.poll_interval, self._leaser.refresh_interval)
            self._next_lease_refresh = self.clock.monotonic() + interval
        return self._leaser.held

    def _export_shard_gauges(self, held: int, shard_count: int) -> None:
        """Shards this node holds and shards no live lease covers (the alert's signal)."""
        owned = self.backend.count_owned_shards(shard_count, self.clock.now())
        metrics.set_gauge("shards_held", held)
        metrics.set_gauge("shards_unowned", max(0, shard_count - owned))

    def _warn_stranded(self, shard_count: int) -> None:
        """Rows stranded while running (another process with a larger ``shard_count`` created
        them): say so loudly, but keep serving the shards in range."""
        self._next_strand_check = self.clock.monotonic() + STRAND_CHECK_INTERVAL
        try:
            self.backend.check_shard_count(shard_count)
        except errors.ShardCountMismatch as exc:
            logger.error("beat %s: %s", self.node, exc)

    def _sleep_time(self) -> float:
        wait = max(self._next_poll - self.clock.monotonic(), 0.0)
        relay = self._relay
        due_at = relay.next_due_at() if relay is not None else None
        if due_at is not None:
            wait = min(wait, max((due_at - self.clock.now()).total_seconds(), 0.0))
        return min(wait, float(self.max_interval))

    def _failed(self, exc: Exception) -> float:
        self._next_poll = 0.0  # the interrupted poll is retried after the back-off
        self._backoff = min(max(self._backoff * 2, BACKOFF_START), float(self.max_interval))
        broker = isinstance(exc, errors.CoordinationUnavailable) and not isinstance(
            exc, errors.DatabaseUnavailable
        )
        logger.error(
            "beat %s: %s unavailable (%s: %s); retrying in %.1fs",
            self.node, "broker" if broker else "database", type(exc).__name__, exc,
            self._backoff, exc_info=not _is_coordination_error(exc),
        )  # fmt: skip
        if not broker:
            self._close_db()
        return self._backoff

    def _close_db(self) -> None:
        # A broken connection stays broken inside Django until closed; the next query
        # reconnects.
        try:
            from django.db import connection  # deferred (import-light): no Django at import

            if not connection.in_atomic_block:  # (tests run inside one)
                connection.close()
        except Exception:  # closing a dead connection may raise too
            logger.debug("closing the database connection failed", exc_info=True)


def _is_coordination_error(exc: Exception) -> bool:
    """Expected outages (logged without a traceback) vs. bugs (logged with one)."""
    if isinstance(exc, errors.CoordinationUnavailable):
        return True
    try:
        # deferred (import-light): celery_scheduler imports no Django at module level
        from django.db import DatabaseError, InterfaceError
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, DatabaseError | InterfaceError)
