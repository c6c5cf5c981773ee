"""Metrics: names, labels, buckets, the no-op switch and the opt-in HTTP endpoint."""

from __future__ import annotations

import importlib
import urllib.request
from collections.abc import Iterator
from typing import get_args

import pytest
from prometheus_client import REGISTRY

from celery_scheduler import metrics


@pytest.fixture(autouse=True)
def fresh_metrics() -> Iterator[metrics.Metrics]:
    metrics.set_enabled(True)
    yield metrics.reset()
    metrics.set_enabled(True)


def sample(name: str, **labels: str) -> float | None:
    return metrics.get_metrics().value(name, **labels)


def test_literal_names_match_the_registered_metrics() -> None:
    assert set(get_args(metrics.CounterName)) == set(metrics._COUNTERS)
    assert set(get_args(metrics.GaugeName)) == set(metrics._GAUGES)
    assert set(get_args(metrics.HistogramName)) == set(metrics._HISTOGRAMS)


def test_every_spec_metric_is_exposed_with_the_prefix() -> None:
    exposed = {m.name for m in metrics.registry().collect()}
    for name in [
        "schedule_lag_seconds",
        "materialized",  # counters are collected without their _total suffix
        "uniqueness_conflicts",
        "outbox_backlog",
        "published",
        "publish_failures",
        "duplicate_claims",
        "retries",
        "dead",
        "missed",
        "overlap_skips",
        "tenant_throttled",
        "claims_rejected_stale",
        "materialization_lag_seconds",
    ]:
        assert f"celery_scheduler_{name}" in exposed


def test_counters_count() -> None:
    metrics.inc("published_total")
    metrics.inc("published_total", 2)
    metrics.inc("tenant_throttled_total", tenant="acme")
    assert sample("celery_scheduler_published_total") == 3
    assert sample("celery_scheduler_tenant_throttled_total", tenant="acme") == 1
    assert sample("celery_scheduler_tenant_throttled_total", tenant="other") is None


def test_gauges_set() -> None:
    metrics.set_gauge("outbox_backlog", 42)
    metrics.set_gauge("outbox_backlog", 7)
    metrics.set_gauge("materialization_lag_seconds", 1.5)
    assert sample("celery_scheduler_outbox_backlog") == 7
    assert sample("celery_scheduler_materialization_lag_seconds") == 1.5


def test_lag_histogram_buckets_cover_10ms_to_10min_per_tenant() -> None:
    for seconds in (0.005, 0.3, 4.0, 700.0):
        metrics.observe_lag("acme", seconds)
    metrics.observe_lag("acme", -0.2)  # published early by skew: counted as on time
    metrics.observe_lag("globex", 1.0)

    def bucket(le: str, tenant: str = "acme") -> float | None:
        return sample("celery_scheduler_schedule_lag_seconds_bucket", tenant=tenant, le=le)

    assert bucket("0.01") == 2
    assert bucket("0.5") == 3
    assert bucket("5.0") == 4
    assert bucket("600.0") == 4
    assert bucket("+Inf") == 5
    assert sample("celery_scheduler_schedule_lag_seconds_count", tenant="globex") == 1
    assert sample("celery_scheduler_schedule_lag_seconds_sum", tenant="acme") == pytest.approx(
        704.305
    )


def test_state_time_histogram_takes_tenant_and_state_labels() -> None:
    metrics.observe("state_seconds", 2.0, tenant="acme", state="ENQUEUED")
    assert sample("celery_scheduler_state_seconds_count", tenant="acme", state="ENQUEUED") == 1
    with pytest.raises(metrics.MetricError, match="takes labels"):
        metrics.observe("state_seconds", 2.0, state="ENQUEUED")


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: metrics.inc("nope_total"), "unknown counter 'nope_total'"),  # type: ignore[arg-type]
        (lambda: metrics.inc("published_total", tenant="x"), "takes labels \\[\\]"),
        (lambda: metrics.inc("tenant_throttled_total"), "takes labels \\['tenant'\\]"),
        (lambda: metrics.inc("published_total", -1), "can only go up"),
        (lambda: metrics.observe("schedule_lag_seconds", 1.0), "takes labels"),
    ],
)
def test_mistakes_raise_metric_error(call: object, message: str) -> None:
    with pytest.raises(metrics.MetricError, match=message):
        call()  # type: ignore[operator]


def test_disabled_helpers_are_no_ops() -> None:
    metrics.set_enabled(False)
    metrics.inc("published_total")
    metrics.observe_lag("acme", 1.0)
    metrics.set_gauge("outbox_backlog", 3)
    metrics.set_enabled(True)
    assert sample("celery_scheduler_published_total") == 0
    assert sample("celery_scheduler_schedule_lag_seconds_count", tenant="acme") is None
    assert sample("celery_scheduler_outbox_backlog") == 0


def test_nothing_touches_the_global_registry_and_reimport_is_safe() -> None:
    metrics.inc("published_total")
    importlib.reload(metrics)
    metrics.inc("published_total")
    assert REGISTRY.get_sample_value("celery_scheduler_published_total") is None
    assert metrics.get_metrics().value("celery_scheduler_published_total") == 1


def test_reset_gives_zeroed_metrics() -> None:
    metrics.inc("dead_total")
    metrics.reset()
    assert sample("celery_scheduler_dead_total") == 0


def test_http_endpoint_serves_the_registry_on_loopback() -> None:
    metrics.inc("missed_total", 5)
    server, thread = metrics.start_http_server(0)
    try:
        host, port = server.server_address[:2]
        assert host == "127.0.0.1"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            body = resp.read().decode()
        assert "celery_scheduler_missed_total 5.0" in body
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
