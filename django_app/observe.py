"""Record what the relays and workers did in the Prometheus metrics (``celery_scheduler.metrics``).

The schedule-lag histogram is the SLO signal: ``enqueued_at - scheduled_for`` per tenant,
observed when the broker has accepted the message, not when the API call returned.
``state_seconds{tenant, state}`` is observed when an occurrence leaves a state on the
default path: SCHEDULED (materialized -> published), ENQUEUED (published -> claimed, which
is also ``queue_age_seconds{tenant}``) and RUNNING (claimed -> finished).

Every metric the scheduler emits is emitted here: the relays, the materializers, the worker
and the tenancy checks call these small hooks, never the metrics registry directly
(``tests/unit/test_layers.py`` checks it), so one metric has one place that says what it
means. The beat loop's own gauges (shards held, unowned) live with the loop.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING

from celery_scheduler import metrics
from django_app.models import OutboxEntry

if TYPE_CHECKING:
    from celery_scheduler.core.reports import MaterializeReport


def published(first: Iterable[tuple[str, datetime]], accepted_at: datetime, *, count: int) -> None:
    """Count ``count`` published messages, and observe the lag of the occurrences among
    them that went out for the first time (``first``: (tenant, scheduled time)).

    A message published again (a retry after its backoff, a deferred waiter, a redelivery)
    keeps its first publish's ``enqueued_at``: its lag was observed then, and its later
    publish is no lateness of the schedule's. Nor is a backfill's, which runs a past time
    on purpose: callers leave those out of ``first``.
    """
    for tenant, seconds in _per_tenant(first, accepted_at).items():
        metrics.observe_many("schedule_lag_seconds", seconds, tenant=tenant)
    if count:
        metrics.inc("published_total", count)


def first_publish(state: str, manual: bool, version: int) -> bool:
    """Whether a row in ``state`` goes out for the first time as the schedule's own run (not
    a re-publish, not a backfill: version 0, manual)."""
    return state == "SCHEDULED" and not (manual and version == 0)


def _per_tenant(rows: Iterable[tuple[str, datetime]], until: datetime) -> dict[str, list[float]]:
    """tenant -> seconds from each row's time to ``until`` (clock skew counts as 0)."""
    out: dict[str, list[float]] = {}
    for tenant, since in rows:
        out.setdefault(tenant, []).append(max(0.0, (until - since).total_seconds()))
    return out


def publish_failed(count: int) -> None:
    metrics.inc("publish_failures_total", count)


def left_state(tenant: str, state: str, seconds: float) -> None:
    """An occurrence of ``tenant`` left ``state`` after ``seconds`` (clock skew counts as 0)."""
    metrics.observe("state_seconds", max(0.0, seconds), tenant=tenant, state=state)


def left_scheduled(sent: Iterable[tuple[str, datetime]], sent_at: datetime) -> None:
    """Occurrences published from SCHEDULED; ``sent``: (tenant, when it was materialized)."""
    for tenant, seconds in _per_tenant(sent, sent_at).items():
        metrics.observe_many("state_seconds", seconds, tenant=tenant, state="SCHEDULED")


def claimed(tenant: str, queued_seconds: float) -> None:
    """A worker claimed an ENQUEUED occurrence whose message waited ``queued_seconds``."""
    queued_seconds = max(0.0, queued_seconds)
    metrics.observe("queue_age_seconds", queued_seconds, tenant=tenant)
    left_state(tenant, "ENQUEUED", queued_seconds)


def export_outbox_backlog(now: datetime) -> int:
    """Set ``outbox_backlog``: outbox rows due by ``now`` and not sent (every shard's)."""
    backlog = OutboxEntry.objects.due(now).count()
    metrics.set_gauge("outbox_backlog", backlog)
    return backlog


#: Process-local counts of worker events (duplicate claims, stale writes, ...) for logs
#: and tests.
worker_events: collections.Counter[str] = collections.Counter()

_WORKER_METRICS: dict[str, metrics.CounterName] = {
    "duplicate_claims": "duplicate_claims_total",
    # Refused by fencing token, by lease (a renewal after the lease lapsed) or by version
    # (a claim of an occurrence its schedule's update superseded).
    "stale_writes": "claims_rejected_stale_total",
    "lease_lost": "claims_rejected_stale_total",
    "stale_occurrences": "claims_rejected_stale_total",
    "retries": "retries_total",
    "dead": "dead_total",
    "overlap_skips": "overlap_skips_total",
}


def worker_event(event: str) -> None:
    """Count ``event`` locally (tests, logs) and in Prometheus where a metric exists."""
    worker_events[event] += 1
    metric = _WORKER_METRICS.get(event)
    if metric is not None:
        metrics.inc(metric)


def materialized(
    report: MaterializeReport, *, oldest_cursor: datetime | None, now: datetime
) -> None:
    """One materializer pass: rows made, conflicts, misses, stale or fenced rollbacks, and
    how far the oldest due cursor is behind ``now``."""
    metrics.inc("materialized_total", report.occurrences_created)
    metrics.inc("uniqueness_conflicts_total", report.conflicts)
    metrics.inc("missed_total", report.missed)
    metrics.inc("claims_rejected_stale_total", report.stale_cursor + report.fenced)
    # Only on-time work is "lag"; a cursor inside the horizon is ahead, not behind.
    lag = 0.0 if oldest_cursor is None else max((now - oldest_cursor).total_seconds(), 0.0)
    metrics.set_gauge("materialization_lag_seconds", lag)


def parked(tenant: str) -> None:
    """A schedule of ``tenant`` whose stored timing no longer validates was parked."""
    metrics.inc("schedules_parked_total", tenant=tenant)


def redelivered(per_tenant: Mapping[str, int]) -> None:
    """Occurrences re-opened for publishing because the broker lost their message."""
    for tenant, n in per_tenant.items():
        metrics.inc("redelivered_total", n, tenant=tenant)


def throttled(per_tenant: Mapping[str, int]) -> None:
    """Rows or claims a tenant's trigger rate or ``max_running`` held back."""
    for tenant, n in per_tenant.items():
        metrics.inc("tenant_throttled_total", n, tenant=tenant)
