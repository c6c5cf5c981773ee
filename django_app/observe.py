"""Record what the relays and workers did in the Prometheus metrics (``celery_scheduler.metrics``).

The schedule-lag histogram is the SLO signal: ``enqueued_at - scheduled_for`` per tenant,
observed when the broker has accepted the message, not when the API call returned.
``state_seconds{tenant, state}`` is observed when an occurrence leaves a state on the
default path: SCHEDULED (materialized -> published), ENQUEUED (published -> claimed, which
is also ``queue_age_seconds{tenant}``) and RUNNING (claimed -> finished).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from celery_scheduler import metrics


def published(scheduled: Iterable[tuple[str, datetime]], accepted_at: datetime) -> None:
    """Count published occurrences and observe their lag; ``scheduled``: (tenant, time)."""
    lags = _per_tenant(scheduled, accepted_at)
    for tenant, seconds in lags.items():
        metrics.observe_many("schedule_lag_seconds", seconds, tenant=tenant)
    count = sum(len(seconds) for seconds in lags.values())
    if count:
        metrics.inc("published_total", count)


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
    from django_app.models import OutboxEntry

    backlog = OutboxEntry.objects.filter(sent_at__isnull=True, available_at__lte=now).count()
    metrics.set_gauge("outbox_backlog", backlog)
    return backlog
