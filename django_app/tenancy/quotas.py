"""Tenant quotas on the data path: fair relay batches, trigger rate, running concurrency.

**Fair batches** (:func:`take_fair_batch`): the relay picks due outbox rows in the weighted
fair order of :mod:`celery_scheduler.core.fairness`, computed by a window function
(``row_number() OVER (PARTITION BY tenant ORDER BY available_at, priority DESC, id)``
divided by the tenant's ``relay_weight`` as a double) on PostgreSQL and SQLite alike.
PostgreSQL does not allow ``FOR UPDATE`` in a query with a window function, so the ranked
query is a sub-select of the ``POOL_FACTOR * size`` first fair rows, and the outer query
locks ``size`` of them in fair order with ``FOR UPDATE OF o SKIP LOCKED`` (re-checking
``sent_at`` and the claim under the lock). Concurrent relays therefore still get disjoint
batches, as long as fewer than ``POOL_FACTOR`` of them race for the same rows. The window
sorts every due row once per batch: O(due rows) per batch, fine for a backlog of some
tens of thousands (its cost by backlog: bench/README.md, "Fair batches"). The burst relay
(``burst_relay=1``) claims with its own query in time/priority order, then puts each wave's
rows in the same weighted fair order wherever tenants compete (``BurstRelay._in_fair_order``).

**Trigger rate** (:func:`throttle`): ``Tenant.max_trigger_rate`` messages a second for the
tenant as a whole, whatever the number of relay processes and shards: a token bucket in the
database (:mod:`django_app.tenancy.budget`, one second of burst) taken for the batch's
tenants in one locked read-and-update inside the batch's transaction (a rolled-back batch takes
nothing).
Rows beyond it are left unpublished for a later pass (their claim is given back,
``available_at`` is unchanged so the tenant's own order holds), counted in
``tenant_throttled_total{tenant}`` once per pass that leaves them, and a tenant with an
empty bucket is left out of the next selections so it takes no batch space. The burst relay
takes its wave's tokens the same way (:mod:`django_app.relay.burst`).

**Running concurrency** (:func:`running_quota_full`): ``Tenant.max_running``, checked in the
worker's claim transaction under a row lock on the tenant; a claim beyond it is deferred
like a full concurrency cap (back to the outbox, no Attempt) and counted in
``tenant_throttled_total{tenant}``. For both quotas an empty value or 0 means no limit.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from datetime import datetime

from django.db import connection
from django.db.models import F, FloatField, QuerySet, Value, Window
from django.db.models.expressions import CombinedExpression
from django.db.models.functions import Cast, Greatest, RowNumber

from django_app import observe
from django_app.models import Occurrence, OutboxEntry, Tenant
from django_app.tenancy import budget, queries

#: The ranked sub-select holds this many batches, so that many racing relays (PostgreSQL)
#: can each lock a full batch while skipping the rows the others hold.
POOL_FACTOR = 4


def fair_rank() -> CombinedExpression:
    """The fair key's first part: ``row_number() / relay_weight`` as a double."""
    rank = Window(
        RowNumber(),
        partition_by=[F("tenant_id")],
        order_by=[F("available_at").asc(), F("priority").desc(), F("id").asc()],
    )
    weight = Greatest(F("tenant__relay_weight"), Value(1))
    return Cast(rank, FloatField()) / Cast(weight, FloatField())


def take_fair_batch(
    candidates: QuerySet[OutboxEntry],
    size: int,
    *,
    lock: bool,
    now: datetime,
    until: datetime,
    token: str,
) -> list[int]:
    """Ids of the next ``size`` candidates in fair order.

    ``lock`` (PostgreSQL): the rows are locked ``FOR UPDATE SKIP LOCKED`` in the caller's
    transaction, and ``now``/``until``/``token`` repeat the candidates' due and claim
    conditions so they are re-checked on the locked row versions.
    """
    ranked = candidates.values("id", "available_at", "priority", fair=fair_rank()).order_by(
        "fair", "available_at", "-priority", "id"
    )
    if not lock:
        return [row["id"] for row in ranked[:size]]
    pool = ranked[: size * POOL_FACTOR]
    sql, params = pool.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(queries.fair_lock(sql), (*params, until, token, now, size))
        return [row[0] for row in cursor.fetchall()]


def without_exhausted(rows: QuerySet[OutboxEntry], now: datetime) -> QuerySet[OutboxEntry]:
    """Leave out tenants whose trigger-rate bucket is empty at ``now``."""
    exhausted = budget.exhausted_trigger(now)
    return rows.exclude(tenant_id__in=sorted(exhausted)) if exhausted else rows


def throttle(rows: Iterable[OutboxEntry], now: datetime) -> set[int]:
    """Take trigger-rate tokens for ``rows`` in order; returns the ids that must wait.

    Must run inside the batch's transaction: the throttled rows' claims are given back
    (``claimed_by = ''``) so any relay may take them once the tenant has tokens again.
    """
    by_tenant: dict[int, list[OutboxEntry]] = {}
    for row in rows:
        by_tenant.setdefault(row.tenant_id, []).append(row)
    limits = budget.trigger_rates(by_tenant)
    if not limits:
        return set()
    granted = budget.take_trigger({t: len(by_tenant[t]) for t in limits}, limits, now)
    waiting: set[int] = set()
    counts: dict[int, int] = {}
    for tenant_id in limits:
        own = by_tenant[tenant_id]
        if granted[tenant_id] < len(own):
            waiting.update(row.id for row in own[granted[tenant_id] :])
            counts[tenant_id] = len(own) - granted[tenant_id]
    if waiting:
        OutboxEntry.objects.unsent().filter(id__in=waiting).update(
            claimed_by="", claim_expires_at=None
        )
        count_throttled(counts)
    return waiting


def count_throttled(counts: dict[int, int]) -> None:
    """``tenant_throttled_total{tenant}`` for rows left by the trigger rate, by tenant id."""
    names = dict(Tenant.objects.filter(id__in=list(counts)).values_list("id", "slug"))
    observe.throttled({names.get(t, str(t)): n for t, n in counts.items()})


def running_quota_full(
    tenant_id: int,
    occurrence_id: uuid.UUID,
    now: datetime,
    *,
    behind: Callable[[], bool] | None = None,
) -> str:
    """Why the tenant cannot start another occurrence now ("" when it can).

    Must run inside the claim transaction: the tenant row is locked ``FOR UPDATE`` (only
    when it has a ``max_running``), so concurrent claims of one tenant count one after
    another and never start more than ``max_running``. RUNNING occurrences whose lease
    expired are not counted (their worker is gone), nor the one being claimed. ``behind``
    (asked under the lock, only for a tenant with a ``max_running``) says an older
    occurrence already waits for the tenant: this one waits too, room or not, so waiters
    start oldest first (:mod:`django_app.tenancy.waiting`). Every reason starts with
    ``"tenant <slug>: "``.
    """
    limit = (
        Tenant.objects.select_for_update()
        .filter(pk=tenant_id, max_running__gt=0)
        .values_list("max_running", "slug")
        .first()
    )
    if limit is None:
        return ""
    max_running, slug = limit
    if behind is not None and behind():
        observe.throttled({slug: 1})
        return f"tenant {slug}: behind an older waiter, max_running {max_running}"
    running = (
        Occurrence.objects.running_leased(now)
        .filter(tenant_id=tenant_id)
        .exclude(pk=occurrence_id)
        .count()
    )
    if running < (max_running or 0):
        return ""
    observe.throttled({slug: 1})
    return f"tenant {slug}: {running} running, max_running {max_running}"
