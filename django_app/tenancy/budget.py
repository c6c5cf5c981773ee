"""Per-tenant rate budgets in the database, shared by every shard, beat and relay process.

A tenant's quota is the tenant's, not one process's: ``max_trigger_rate`` (messages a
second) and ``catchup_rate`` (late occurrences released a minute) each have one
:class:`~django_app.models.TenantBudget` row per tenant. Every relay batch and every
materializer transaction that needs a budget locks the rows of the tenants it touches, in
tenant-id order (so two batches never deadlock on them), reads them, computes in Python
with the injected clock, and writes them back in one ``UPDATE`` for all of them: one
round trip per batch, not per row, and only for tenants that have the quota (the rest never
touch the table).

The lock is ``SELECT ... FOR UPDATE`` where the database has it (PostgreSQL, MySQL);
elsewhere (SQLite) a no-op ``UPDATE`` of the same rows first takes the database's write
lock, so the read that follows cannot be stale. Either way the lock lasts until the
caller's transaction ends, and a rolled-back batch gives its budget back with it.

Time comes from the caller (the injected clock). Processes with skewed clocks cannot
inflate a budget: a bucket never refills for a time before its stored ``at``, a taker
dated before that ``at`` (a burst wave took its tokens as of its instant, still ahead, or
that node's clock is ahead) is not offered the refill up to it, and a catch-up slot is
never earlier than the stored next slot.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.db.models import F

from celery_scheduler.core.fairness import Bucket
from django_app.models import Tenant, TenantBudget


def trigger_rates(tenant_ids: Collection[int]) -> dict[int, int]:
    """``max_trigger_rate`` of those of ``tenant_ids`` that have one."""
    if not tenant_ids:
        return {}
    rows = Tenant.objects.filter(id__in=list(tenant_ids), max_trigger_rate__gt=0)
    return {tid: int(rate or 0) for tid, rate in rows.values_list("id", "max_trigger_rate")}


def rate_limited_tenants() -> set[int]:
    """Ids of the tenants with a trigger rate (few: a per-poll read is cheap)."""
    return set(Tenant.objects.filter(max_trigger_rate__gt=0).values_list("id", flat=True))


def take_trigger(
    wanted: Mapping[int, int], rates: Mapping[int, int], now: datetime
) -> dict[int, int]:
    """Take up to ``wanted[tenant]`` trigger tokens per tenant at ``now``; returns the grants.

    Tenants without a rate in ``rates`` are granted everything without touching the table.
    Must run inside the transaction that publishes (or gives back) the rows.
    """
    granted = {t: n for t, n in wanted.items() if t not in rates}
    limited = {t: n for t, n in wanted.items() if t in rates and n > 0}
    if not limited:
        return granted
    rows = _locked(TenantBudget.TRIGGER, limited, now, initial=rates)
    for tenant_id, n in limited.items():
        row = rows[tenant_id]
        got, bucket = Bucket(row.tokens, row.at).take(rates[tenant_id], n, now)
        row.tokens, row.at = bucket.tokens, bucket.at
        granted[tenant_id] = got
    TenantBudget.objects.bulk_update(list(rows.values()), ["tokens", "at"])
    return granted


def give_back_trigger(unused: Mapping[int, int], rates: Mapping[int, int], now: datetime) -> None:
    """Return tokens taken for rows that were not published after all (capped at one second)."""
    unused = {t: n for t, n in unused.items() if n > 0 and t in rates}
    if not unused:
        return
    with transaction.atomic():
        rows = _locked(TenantBudget.TRIGGER, unused, now, initial=rates)
        for tenant_id, n in unused.items():
            row = rows[tenant_id]
            bucket = Bucket(row.tokens, row.at).give_back(rates[tenant_id], n)
            row.tokens = bucket.tokens
        TenantBudget.objects.bulk_update(list(rows.values()), ["tokens"])


def exhausted_trigger(now: datetime) -> set[int]:
    """Tenants whose trigger bucket holds less than one token at ``now`` (no lock: a hint
    for leaving them out of the next selection; :func:`take_trigger` is what decides)."""
    rows = TenantBudget.objects.filter(
        kind=TenantBudget.TRIGGER, tenant__max_trigger_rate__gt=0
    ).values_list("tenant_id", "tokens", "at", "tenant__max_trigger_rate")
    return {
        tenant_id
        for tenant_id, tokens, at, rate in rows
        if Bucket(tokens, at).available(int(rate or 0), now) < 1
    }


def reserve_catchup(wanted: Mapping[int, tuple[int, int]], now: datetime) -> dict[int, datetime]:
    """Reserve ``k`` consecutive catch-up release slots per tenant; returns each first slot.

    ``wanted`` maps tenant -> (``catchup_rate`` per minute, ``k``). The slots are
    ``first, first + 60/rate s, ...``; ``first`` is the tenant's stored next free slot, or
    ``now`` if that has passed. Must run inside the transaction that writes the rows.
    """
    wanted = {t: (rate, k) for t, (rate, k) in wanted.items() if rate > 0 and k > 0}
    if not wanted:
        return {}
    rows = _locked(TenantBudget.CATCHUP, wanted, now, initial={})
    first: dict[int, datetime] = {}
    for tenant_id, (rate, k) in wanted.items():
        row = rows[tenant_id]
        first[tenant_id] = start = max(row.at, now)
        row.at = start + k * catchup_interval(rate)
    TenantBudget.objects.bulk_update(list(rows.values()), ["at"])
    return first


def catchup_interval(rate: int) -> timedelta:
    """The spacing of a tenant's late releases (``rate`` per minute)."""
    return timedelta(seconds=60 / rate)


def _locked(
    kind: str, tenant_ids: Collection[int], now: datetime, *, initial: Mapping[int, int]
) -> dict[int, TenantBudget]:
    """The budget rows of ``tenant_ids``, locked until the transaction ends (created first
    if missing: a trigger bucket full, ``initial[tenant]`` tokens; a catch-up slot free now)."""
    ids = sorted(tenant_ids)
    rows = _lock(kind, ids)
    missing = [t for t in ids if t not in rows]
    if missing:
        # A racing batch may create the same rows: the loser's insert is a no-op (and on
        # PostgreSQL waits for the winner's commit), then both lock the one row.
        TenantBudget.objects.bulk_create(
            [
                TenantBudget(tenant_id=t, kind=kind, tokens=float(initial.get(t, 0)), at=now)
                for t in missing
            ],
            ignore_conflicts=True,
        )
        rows.update(_lock(kind, missing))
    return rows


def _lock(kind: str, ids: list[int]) -> dict[int, TenantBudget]:
    rows = TenantBudget.objects.filter(kind=kind, tenant_id__in=ids).order_by("tenant_id")
    if connection.features.has_select_for_update:
        rows = rows.select_for_update()
    else:
        rows.update(tokens=F("tokens"))  # takes SQLite's write lock before the read
    return {row.tenant_id: row for row in rows}
