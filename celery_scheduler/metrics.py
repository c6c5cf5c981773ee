"""Prometheus metrics (SPEC "Observability"), on a registry of our own.

Nothing is registered at import time: the first call creates a dedicated
``CollectorRegistry`` (never prometheus_client's global one), so importing this module twice,
or in many test processes, cannot raise "Duplicated timeseries". ``reset()`` swaps in a fresh
registry for tests; ``set_enabled(False)`` turns every helper into a no-op for deployments that
do not want Prometheus. Exposing the registry is opt-in: ``start_http_server(port)``.

Call sites use the short names below, e.g. ``metrics.inc("published_total")`` or
``metrics.observe_lag(tenant, seconds)``; the ``Literal`` name types let mypy catch typos, and
an unknown name or wrong labels raise :class:`MetricError` at runtime.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, TypeVar
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import start_http_server as _prometheus_http_server

from celery_scheduler.errors import SchedulerError

PREFIX = "celery_scheduler_"

# From 10 ms (a strict occurrence on time) to 10 min (a relay that was down).
LAG_BUCKETS: tuple[float, ...] = (
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
)

CounterName = Literal[
    "materialized_total",
    "uniqueness_conflicts_total",
    "published_total",
    "publish_failures_total",
    "duplicate_claims_total",
    "retries_total",
    "dead_total",
    "missed_total",
    "overlap_skips_total",
    "tenant_throttled_total",
    "claims_rejected_stale_total",
    "schedules_parked_total",
    "redelivered_total",
]
GaugeName = Literal[
    "outbox_backlog", "materialization_lag_seconds", "shards_held", "shards_unowned"
]
HistogramName = Literal["schedule_lag_seconds", "queue_age_seconds", "state_seconds"]


class MetricError(SchedulerError, ValueError):
    """An unknown metric name or a label set that does not match the metric's labels."""


@dataclass(frozen=True, slots=True)
class _Spec:
    help: str
    labels: tuple[str, ...] = ()


_COUNTERS: dict[str, _Spec] = {
    "materialized_total": _Spec("Occurrences inserted by the materializer."),
    "uniqueness_conflicts_total": _Spec(
        "Occurrence inserts that hit the unique key: another node materialized it first."
    ),
    "published_total": _Spec("Occurrences accepted by the broker."),
    "publish_failures_total": _Spec("Broker publishes that failed and will be retried."),
    "duplicate_claims_total": _Spec(
        "Worker claims refused because the occurrence was already claimed or finished."
    ),
    "retries_total": _Spec("Attempts that failed and were scheduled for a retry."),
    "dead_total": _Spec("Occurrences moved to DEAD after exhausting their retries."),
    "missed_total": _Spec("Occurrences recorded as MISSED by the misfire policy."),
    "overlap_skips_total": _Spec("Occurrences skipped because a previous run still held."),
    "tenant_throttled_total": _Spec(
        "Occurrences delayed by a tenant rate or concurrency cap.", ("tenant",)
    ),
    "claims_rejected_stale_total": _Spec(
        "Writes refused because the fencing token, lease or version no longer matched."
    ),
    "schedules_parked_total": _Spec(
        "Schedules parked because their stored timing cannot be planned.", ("tenant",)
    ),
    "redelivered_total": _Spec(
        "Occurrences published again because their message was never claimed in time.",
        ("tenant",),
    ),
}
_GAUGES: dict[str, _Spec] = {
    "outbox_backlog": _Spec("Outbox rows due but not yet sent."),
    "materialization_lag_seconds": _Spec(
        "How far the oldest due schedule cursor (next_run_at) is behind now."
    ),
    # No node label: Prometheus's ``instance`` label tells the beats apart, and a beat's
    # name (host:pid) would be a new series at every restart.
    "shards_held": _Spec("Shard leases this beat node holds."),
    "shards_unowned": _Spec("Shards no live lease covers, as this beat node last saw them."),
}
_HISTOGRAMS: dict[str, _Spec] = {
    "schedule_lag_seconds": _Spec(
        "enqueued_at - scheduled_for for each published occurrence.", ("tenant",)
    ),
    "queue_age_seconds": _Spec(
        "Time from the publish of an occurrence's message to a worker's claim.", ("tenant",)
    ),
    "state_seconds": _Spec(
        "Time an occurrence spent in a state before leaving it.", ("tenant", "state")
    ),
}

_SPECS = {**_COUNTERS, **_GAUGES, **_HISTOGRAMS}
#: Label names a metric may have: never a per-schedule one (20 million schedules would be
#: 20 million series).
ALLOWED_LABELS = frozenset({"tenant", "state"})


def exposed_names() -> dict[str, tuple[str, ...]]:
    """Every metric's full name (``celery_scheduler_...``) -> its label names."""
    return {PREFIX + name: spec.labels for name, spec in _SPECS.items()}


def exposed_series() -> set[str]:
    """Every series name a scrape can show: histograms add _bucket/_sum/_count."""
    series: set[str] = set()
    for name in _COUNTERS:
        series.add(PREFIX + name)
    for name in _GAUGES:
        series.add(PREFIX + name)
    for name in _HISTOGRAMS:
        series |= {PREFIX + name + suffix for suffix in ("_bucket", "_sum", "_count")}
    return series


class Metrics:
    """Every scheduler metric, registered on one registry (a new one unless given)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self._counters = {
            name: Counter(PREFIX + name, spec.help, spec.labels, registry=self.registry)
            for name, spec in _COUNTERS.items()
        }
        self._gauges = {
            # Multiprocess mode (prefork workers): the latest value of a live process.
            name: Gauge(
                PREFIX + name,
                spec.help,
                spec.labels,
                registry=self.registry,
                multiprocess_mode="livemostrecent",
            )
            for name, spec in _GAUGES.items()
        }
        self._histograms = {
            name: Histogram(
                PREFIX + name, spec.help, spec.labels, registry=self.registry, buckets=LAG_BUCKETS
            )
            for name, spec in _HISTOGRAMS.items()
        }

    def inc(self, name: CounterName, amount: float = 1.0, **labels: str) -> None:
        if amount < 0:
            raise MetricError(f"counter {name} can only go up (got amount={amount})")
        _child(self._counters, "counter", name, labels).inc(amount)

    def set_gauge(self, name: GaugeName, value: float, **labels: str) -> None:
        _child(self._gauges, "gauge", name, labels).set(value)

    def observe(self, name: HistogramName, value: float, **labels: str) -> None:
        _child(self._histograms, "histogram", name, labels).observe(value)

    def observe_many(self, name: HistogramName, values: Iterable[float], **labels: str) -> None:
        """Observe each of ``values`` under one label set (the labels are resolved once)."""
        child = _child(self._histograms, "histogram", name, labels)
        for value in values:
            child.observe(value)

    def value(self, sample: str, **labels: str) -> float | None:
        """A sample's current value by its full exposed name (for tests and health checks)."""
        return self.registry.get_sample_value(sample, labels)


_M = TypeVar("_M", Counter, Gauge, Histogram)


def _child(table: dict[str, _M], kind: str, name: str, labels: dict[str, str]) -> _M:
    metric = table.get(name)
    if metric is None:
        raise MetricError(f"unknown {kind} {name!r}; known: {', '.join(sorted(table))}")
    expected = _SPECS[name].labels
    if sorted(labels) != sorted(expected):
        raise MetricError(f"{kind} {name} takes labels {list(expected)}, got {sorted(labels)}")
    return metric.labels(**labels) if expected else metric


_lock = threading.Lock()
_metrics: Metrics | None = None
_enabled = True


def get_metrics() -> Metrics:
    """The process-wide :class:`Metrics`, created on first use."""
    global _metrics
    with _lock:
        if _metrics is None:
            _metrics = Metrics()
        return _metrics


def registry() -> CollectorRegistry:
    return get_metrics().registry


def reset() -> Metrics:
    """Replace the process-wide metrics with fresh zeroed ones (tests)."""
    global _metrics
    with _lock:
        _metrics = Metrics()
        return _metrics


def set_enabled(enabled: bool) -> None:
    """``False`` makes the module-level helpers no-ops (no Prometheus wanted)."""
    global _enabled
    _enabled = enabled


def is_enabled() -> bool:
    return _enabled


def inc(name: CounterName, amount: float = 1.0, **labels: str) -> None:
    if _enabled:
        get_metrics().inc(name, amount, **labels)


def set_gauge(name: GaugeName, value: float, **labels: str) -> None:
    if _enabled:
        get_metrics().set_gauge(name, value, **labels)


def observe(name: HistogramName, value: float, **labels: str) -> None:
    if _enabled:
        get_metrics().observe(name, value, **labels)


def observe_many(name: HistogramName, values: Iterable[float], **labels: str) -> None:
    """:func:`observe` for many values of one label set (a relay's batch).

    The labels are resolved once, not per value (bench/README.md, "Figures that were in
    code comments").
    """
    if _enabled:
        get_metrics().observe_many(name, values, **labels)


def observe_lag(tenant: str, seconds: float) -> None:
    """Record ``enqueued_at - scheduled_for``; early publishes (clock skew) count as 0."""
    observe("schedule_lag_seconds", max(0.0, seconds), tenant=tenant)


def start_http_server(port: int, addr: str = "127.0.0.1") -> tuple[WSGIServer, threading.Thread]:
    """Serve the registry at ``http://addr:port/metrics`` on a daemon thread.

    Binds to loopback unless told otherwise; ``port=0`` picks a free port
    (``server.server_port``). Stop it with ``server.shutdown(); server.server_close()``.
    """
    return _prometheus_http_server(port, addr, registry=registry())
