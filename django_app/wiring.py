"""The composition root: which implementation backs each port of :mod:`celery_scheduler.ports`.

Installed by the app config's ``ready()``, so ``django_app`` in ``INSTALLED_APPS`` is all the
wiring a project does. The choices made here and nowhere else:

- the relay: the burst relay (:mod:`django_app.relay.burst`) on PostgreSQL with a Redis or
  AMQP broker unless ``CELERY_SCHEDULER["burst_relay"]`` says otherwise, else the lookahead
  relay (:mod:`django_app.relay.batch`);
- the publisher: the given one, else the broker's fast path or kombu
  (:func:`celery_scheduler.publishers.default.celery_publisher`);
- the materializer: per schedule, or set-based where the database allows
  (:mod:`django_app.materialize`);
- shard leases (:mod:`django_app.cluster.shards`) and the idempotency store
  (:mod:`django_app.worker.idempotency`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from datetime import datetime, timedelta
from http.server import ThreadingHTTPServer

from celery import Celery
from django.db import DatabaseError, connection

from celery_scheduler.core.clock import Clock
from celery_scheduler.core.reports import MaterializeReport
from celery_scheduler.ports import IdempotencyStore, Relay, ShardLeases, Stoppable
from celery_scheduler.publishers import Publisher
from celery_scheduler.publishers.default import celery_publisher
from django_app import conf, observe
from django_app.cluster import reshard
from django_app.cluster.shards import LeaseKeeper, ShardLeaser
from django_app.db import checks, partitions
from django_app.materialize import per_schedule, set_based
from django_app.models import BeatNode, Schedule, ShardLease
from django_app.operations import metrics_server, retention
from django_app.relay import redelivery
from django_app.relay.batch import LookaheadRelay
from django_app.relay.burst import BurstRelay
from django_app.schedules import beat_schedule
from django_app.worker import finish, idempotency

logger = logging.getLogger(__name__)


def materialize_due(
    *,
    clock: Clock,
    shards: Collection[int] | None = None,
    shard_fencing: Mapping[int, int] | None = None,
    horizon: timedelta | None = None,
    batch_size: int | None = None,
    node: str = "",
    settings: conf.SchedulerSettings | None = None,
) -> MaterializeReport:
    """Materialize the due schedules with the materializer this database gets: the
    set-based one on PostgreSQL (``bulk_materialize``, on by default), else the portable
    one. Arguments and report as :func:`django_app.materialize.per_schedule.materialize_due`;
    ``settings`` is read here when not given, once, and passed down.
    """
    cfg = settings or conf.get()
    choose = (
        set_based.materialize_due_bulk
        if conf.bulk_materialize_enabled(connection.vendor, cfg)
        else per_schedule.materialize_due
    )
    return choose(
        clock=clock, shards=shards, shard_fencing=shard_fencing, horizon=horizon,
        batch_size=batch_size, node=node, settings=cfg,
    )  # fmt: skip


class DatabaseMaterializer:
    """The :class:`celery_scheduler.ports.Materializer` over the Django models."""

    def materialize(
        self,
        *,
        clock: Clock,
        shards: Collection[int],
        shard_fencing: Mapping[int, int] | None,
        horizon: timedelta,
        node: str,
    ) -> MaterializeReport:
        return materialize_due(
            clock=clock, shards=shards, shard_fencing=shard_fencing, horizon=horizon, node=node
        )

    def due_shards(self, until: datetime) -> set[int]:
        # No ordering: the model's ordering ("name") would join the DISTINCT and sort every
        # due row by name.
        return set(
            Schedule.objects.due(until).order_by().values_list("shard", flat=True).distinct()
        )

    def count_due(self, *, until: datetime, shards: Collection[int] | None, limit: int) -> int:
        return per_schedule.count_due_schedules(until=until, shards=shards, limit=limit)


class DjangoBackend:
    """The :class:`celery_scheduler.ports.Backend` of a Django project."""

    def __init__(self) -> None:
        self.materializer = DatabaseMaterializer()
        # The module is the store: its run_once is the IdempotencyStore contract.
        self.idempotency: IdempotencyStore = idempotency

    def settings(self) -> conf.SchedulerSettings:
        """Read anew on each call: the one place the beat side's settings come from."""
        return conf.get()

    def require_safe_database(self) -> None:
        checks.require_safe_database()

    def start_metrics_server(self, node: str) -> ThreadingHTTPServer | None:
        return metrics_server.start_for_beat(node)

    def new_relay(
        self,
        *,
        app: Celery,
        clock: Clock,
        publisher: Publisher | None,
        node: str,
        lookahead: timedelta,
    ) -> Relay:
        cfg = self.settings()
        if publisher is None:
            publisher = celery_publisher(app, timeout=cfg.publish_timeout_seconds)
        relay: Relay
        url = app.conf.broker_write_url or app.conf.broker_url
        if conf.burst_relay_enabled(connection.vendor, url, cfg):
            relay = BurstRelay(clock=clock, publisher=publisher, node=node, settings=cfg)
        else:
            relay = LookaheadRelay(
                clock=clock, publisher=publisher, node=node, lookahead=lookahead, settings=cfg
            )
        logger.info("beat %s: relay %s, publisher %s", node, type(relay).__name__,
                    type(publisher).__name__)  # fmt: skip
        return relay

    def new_shard_leases(
        self, node: str, clock: Clock, *, keeper: Callable[[], bool] | None
    ) -> tuple[ShardLeases, Stoppable | None]:
        cfg = self.settings()
        leaser = ShardLeaser(
            node, clock=clock, shard_count=cfg.shard_count, lease_seconds=cfg.lease_seconds
        )
        reshard.check(leaser.shard_count)  # refuses to start (ShardCountMismatch)
        if keeper is None:
            return leaser, None
        renewer = LeaseKeeper(leaser, in_step=keeper)
        renewer.start()
        return leaser, renewer

    def check_shard_count(self, shard_count: int) -> None:
        reshard.check(shard_count)

    def count_owned_shards(self, shard_count: int, now: datetime) -> int:
        return (
            ShardLease.objects.filter(shard__lt=shard_count, expires_at__gt=now)
            .exclude(owner="")
            .count()
        )

    def stamp_progress(self, node: str, now: datetime) -> None:
        BeatNode.objects.filter(name=node).update(progress_at=now)

    def sync_beat_schedule(self, app: Celery, clock: Clock) -> beat_schedule.SyncReport:
        return beat_schedule.sync_app(app, clock=clock)

    def reap_expired(self, clock: Clock, limit: int) -> int:
        return finish.reap_expired(clock=clock, limit=limit)

    def redeliver_lost(self, clock: Clock, limit: int, timeout: timedelta) -> int:
        return redelivery.redeliver_lost(clock=clock, limit=limit, timeout=timeout)

    def export_outbox_backlog(self, now: datetime) -> int:
        return observe.export_outbox_backlog(now)

    def refresh_statistics(self) -> list[str]:
        """PostgreSQL with partitioned history: ANALYZE the slots filling up fast."""
        if connection.vendor != "postgresql" or not partitions.is_partitioned():
            return []
        return partitions.analyze_grown()

    def maintain_partitions(self, now: datetime) -> list[str]:
        """PostgreSQL with partitioned history: create the slots ahead and (when
        ``partition_retention_days`` is set) drop the expired ones; a no-op elsewhere."""
        if connection.vendor != "postgresql" or not partitions.is_partitioned():
            return []
        cfg = self.settings()
        width = timedelta(hours=cfg.partition_width_hours)
        urgent = partitions.urgent_only(now)  # the rest waits for a quiet minute
        ahead = min(cfg.partitions_ahead, 1) if urgent else cfg.partitions_ahead
        try:
            done = partitions.ensure(now, width=width, ahead=ahead).created
            if cfg.partition_retention_days is not None and not urgent:
                dropped = partitions.drop_old(
                    now,
                    timedelta(days=cfg.partition_retention_days),
                    on_prune=retention.record_pruned,
                )
                done += dropped.dropped
                for name, why in dropped.refused.items():
                    logger.warning("partition %s kept: rows that may still run %s", name, why)
        except DatabaseError as exc:  # a lock not granted in time: the next round retries
            logger.warning("partition maintenance skipped this round: %s", exc)
            return []
        return done
