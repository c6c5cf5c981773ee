"""Settings are read at the entry points and passed in (docs/ARCHITECTURE.md, "Settings").

``django_app.conf.get()`` builds the frozen ``SchedulerSettings`` value from Django's
settings. It may be called only in the modules of ALLOWED, at most as often as listed
there; everything below them takes the value (or the one field it needs) as a parameter.
A new call elsewhere fails this test: pass the value down from the entry point instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from django_app.conf import SchedulerSettings

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("celery_scheduler", "django_app")

#: module -> calls of ``conf.get()`` it may make, and why it may.
ALLOWED: dict[str, tuple[int, str]] = {
    # Entry points: each reads once per call (per request, per task, per beat step).
    "django_app.wiring": (2, "the composition root: Backend.settings() and the materializer"),
    "django_app.api": (2, "the API facade: bulk create and sync read once per call"),
    "django_app.tasks": (2, "worker task start (execute); policy_for called directly"),
    "django_app.http.throttling": (1, "an HTTP request's rate"),
    "django_app.admin.tenancy": (1, "an admin request"),
    "django_app.management.commands.partitions": (1, "a command"),
    "django_app.management.commands.reshard": (1, "a command"),
    "django_app.migrations.0020_partitioned_history": (1, "a migration, run once"),
    "django_app.operations.metrics_server": (2, "beat/worker start: the port and address"),
    "django_app.operations.health": (2, "a probe (scheduler_status, /status, /readyz)"),
    # Defaults for direct calls (tests, a shell): the product path passes the value, and the
    # read happens only when the argument is left out.
    "django_app.relay.batch": (2, "relay_due and LookaheadRelay built without settings"),
    "django_app.relay.burst": (1, "BurstRelay built without settings"),
    "django_app.relay.redelivery": (1, "redeliver_lost called without timeout/limit"),
    "django_app.materialize.per_schedule": (1, "materialize_due called without settings"),
    "django_app.materialize.set_based": (1, "materialize_due_bulk called without settings"),
    "django_app.worker.finish": (1, "claim/renew without a lease"),
    "django_app.cluster.shards": (1, "ShardLeaser built without shard_count/lease_seconds"),
    "django_app.schedules.validation": (1, "validate called without settings (single create)"),
    # Not reached yet: the schedule lifecycle reads the default tenant where a call names
    # none (tenant resolution has ~20 callers: facade, HTTP, admin, commands), the shard
    # count of a single create, and replan the per-pass MISSED cap.
    "django_app.schedules.lifecycle": (4, "default tenant (3), a single create's shard count"),
    "django_app.schedules.replan": (1, "max_missed_per_pass when an update replans"),
}


def conf_get_calls() -> dict[str, int]:
    found: dict[str, int] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            calls = sum(
                1
                for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "conf"
                and not node.args
                and not node.keywords
            )
            if calls:
                found[".".join(parts)] = calls
    return found


def test_settings_are_read_only_at_the_entry_points() -> None:
    found = conf_get_calls()
    over = {
        module: count for module, count in found.items() if count > ALLOWED.get(module, (0, ""))[0]
    }
    assert not over, (
        f"conf.get() called outside the entry points (module: calls): {over}; "
        "read the settings at the entry point and pass the value in"
    )


def test_the_allowed_list_is_not_stale() -> None:
    found = conf_get_calls()
    stale = {module: n for module, (n, _) in ALLOWED.items() if found.get(module, 0) < n}
    assert not stale, f"ALLOWED lists more calls than these modules make: {stale}"


def test_partition_settings_the_beats_act_on_are_refused_out_of_range() -> None:
    """A retention of 0 days made every beat drop yesterday's partitions each round (and a
    negative one today's); a width of 0 divided by zero in the beat's maintenance."""
    bad: tuple[tuple[str, object], ...] = (
        ("partition_retention_days", 0),
        ("partition_retention_days", -3),
        ("partition_width_hours", 0),
        ("partitions_ahead", -1),
        ("partition_width_hours", "24"),
    )
    for name, value in bad:
        with pytest.raises(ValueError, match=rf"CELERY_SCHEDULER\['{name}'\] must be"):
            SchedulerSettings(**{name: value})  # type: ignore[arg-type]
    kept = SchedulerSettings(partition_retention_days=None, partitions_ahead=0)
    assert (kept.partition_retention_days, kept.partitions_ahead) == (None, 0)
