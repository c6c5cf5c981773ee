"""Record what the relays did in the Prometheus metrics (``celery_scheduler.metrics``).

The schedule-lag histogram is the SLO signal: ``enqueued_at - scheduled_for`` per tenant,
observed when the broker has accepted the message, not when the API call returned.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from celery_scheduler import metrics


def published(scheduled: Iterable[tuple[str, datetime]], accepted_at: datetime) -> None:
    """Count published occurrences and observe their lag; ``scheduled``: (tenant, time)."""
    count = 0
    for tenant, scheduled_for in scheduled:
        metrics.observe_lag(tenant, (accepted_at - scheduled_for).total_seconds())
        count += 1
    if count:
        metrics.inc("published_total", count)


def publish_failed(count: int) -> None:
    metrics.inc("publish_failures_total", count)
