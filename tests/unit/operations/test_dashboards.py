"""Issue 14, item 2: the Grafana dashboard and the alert rules use only metrics that exist."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from celery_scheduler import metrics

DOCS = Path(__file__).resolve().parents[3] / "docs"
NAME = re.compile(r"\bcelery_scheduler_[a-z_]+\b")


def expressions_of_dashboard() -> list[str]:
    dashboard = json.loads((DOCS / "grafana-dashboard.json").read_text())
    return [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]


def rules() -> list[dict[str, Any]]:
    loaded = yaml.safe_load((DOCS / "alerts.yml").read_text())
    return [rule for group in loaded["groups"] for rule in group["rules"]]


def test_every_metric_the_dashboard_uses_exists() -> None:
    used = {name for expr in expressions_of_dashboard() for name in NAME.findall(expr)}
    assert used, "the dashboard queries no metric"
    assert used <= metrics.exposed_series(), used - metrics.exposed_series()


def test_the_dashboard_has_the_slo_and_operations_panels() -> None:
    exprs = "\n".join(expressions_of_dashboard())
    for name in [
        "celery_scheduler_schedule_lag_seconds_bucket",
        "celery_scheduler_outbox_backlog",
        "celery_scheduler_missed_total",
        "celery_scheduler_dead_total",
        "celery_scheduler_duplicate_claims_total",
        "celery_scheduler_shards_held",
    ]:
        assert name in exprs, name
    assert "histogram_quantile(0.99" in exprs


def test_every_metric_the_alerts_use_exists() -> None:
    used = {name for rule in rules() for name in NAME.findall(rule["expr"])}
    assert used <= metrics.exposed_series(), used - metrics.exposed_series()
    names = {rule["alert"] for rule in rules()}
    assert {
        "CelerySchedulerLagSLO",
        "CelerySchedulerBacklogGrowing",
        "CelerySchedulerUnownedShards",
        "CelerySchedulerMissed",
    } <= names


def test_no_metric_has_a_per_schedule_label() -> None:
    for name, labels in metrics.exposed_names().items():
        assert set(labels) <= metrics.ALLOWED_LABELS, (name, labels)
