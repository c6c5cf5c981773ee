"""Keep every schedule inside ``shard_count``: the check beat runs, and ``manage.py reshard``.

A schedule stores its shard (``hash(id) mod shard_count`` at create time) and so does each
outbox row. Raising ``shard_count`` strands nothing (old rows stay in the low shards, which
are still leased); lowering it leaves rows in shards no beat leases, which would never fire.
Beat therefore refuses to start while such rows exist (:func:`check`), and :func:`reshard`
moves them: each stranded schedule to ``hash(id) mod shard_count``, each outbox row to its
schedule's shard. It is safe while beats run: an occurrence's unique key
(schedule, scheduled_for) stops a schedule being materialized twice while it moves, and a
moved outbox row is published by whichever relay takes it (relays are not shard-bound).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from django.db import transaction
from django.db.models import OuterRef, Q, QuerySet, Subquery
from django.utils import timezone

from celery_scheduler.core import ids
from celery_scheduler.errors import ShardCountMismatch
from django_app.models import Occurrence, OutboxEntry, Schedule, ShardLease

#: Schedules per update transaction (short transactions: beats keep running meanwhile).
BATCH = 1000


@dataclass(frozen=True)
class Stranded:
    """Rows stored in a shard >= ``shard_count``."""

    shard_count: int
    schedules: int
    outbox_rows: int

    def __bool__(self) -> bool:
        return bool(self.schedules or self.outbox_rows)


def stranded(shard_count: int) -> Stranded:
    """The rows stored in shards at or beyond ``shard_count`` (the caller's setting)."""
    count = shard_count
    return Stranded(
        shard_count=count,
        schedules=Schedule.objects.filter(shard__gte=count).count(),
        outbox_rows=OutboxEntry.objects.unsent().filter(shard__gte=count).count(),
    )


def check(shard_count: int) -> None:
    """Raise :class:`ShardCountMismatch` (naming the fix) if any row would never be leased."""
    found = stranded(shard_count)
    if found:
        raise ShardCountMismatch(
            f"{found.schedules} schedule(s) and {found.outbox_rows} unsent outbox row(s) are "
            f"stored in shards >= shard_count={found.shard_count} (was shard_count lowered?): "
            "no beat leases those shards, so they would never fire. Beat refuses to start. "
            "Run `python manage.py reshard` (with this shard_count) to move them into range, "
            "or restore the previous shard_count."
        )


@dataclass(frozen=True)
class ReshardReport:
    shard_count: int
    schedules: int
    outbox_rows: int
    leases_dropped: int


def reshard(*, shard_count: int, rebalance: bool = False, dry_run: bool = False) -> ReshardReport:
    """Move schedules (and their unsent outbox rows) into shards below ``shard_count``.

    Only stranded rows move unless ``rebalance``: then every schedule goes to
    ``hash(id) mod shard_count`` (spreads load evenly after ``shard_count`` was raised).
    Lease rows of shards past the count are dropped once nobody holds them.
    """
    count = shard_count  # the command's setting
    if count < 1:
        raise ValueError(f"shard_count must be >= 1, got {count}")
    moved = 0
    last = None
    while True:
        page = Schedule.objects.order_by("id")
        if last is not None:
            page = page.filter(id__gt=last)
        rows = list(page.values_list("id", "shard")[:BATCH])
        if not rows:
            break
        last = rows[-1][0]
        targets: dict[int, list[uuid.UUID]] = {}
        for schedule_id, shard in rows:
            if shard >= count or rebalance:
                target = ids.shard_for(schedule_id, count)
                if target != shard:
                    targets.setdefault(target, []).append(schedule_id)
        moved += sum(len(group) for group in targets.values())
        if not dry_run and targets:
            with transaction.atomic():
                for target, group in targets.items():
                    Schedule.objects.filter(id__in=group).update(shard=target)
    outbox = _outbox_to_move(count, rebalance)
    outbox_rows = outbox.count()
    dropped = 0
    if not dry_run:
        schedule_shard = Subquery(
            Occurrence.objects.filter(id=OuterRef("occurrence_id")).values("schedule__shard")[:1]
        )
        outbox_rows = _outbox_to_move(count, rebalance).update(shard=schedule_shard)
        free = Q(owner="") | Q(expires_at__isnull=True) | Q(expires_at__lte=timezone.now())
        dropped, _ = ShardLease.objects.filter(free, shard__gte=count).delete()
    return ReshardReport(count, moved, outbox_rows, dropped)


def _outbox_to_move(count: int, rebalance: bool) -> QuerySet[OutboxEntry]:
    rows = OutboxEntry.objects.unsent()
    if rebalance:
        schedule_shard = Subquery(
            Occurrence.objects.filter(id=OuterRef("occurrence_id")).values("schedule__shard")[:1]
        )
        return rows.exclude(shard=schedule_shard)
    return rows.filter(shard__gte=count)
