"""``manage.py scheduler_status``: the scheduler's state, and Kubernetes probe exit codes.

Exit codes: 0 healthy (or the plain status report printed), 1 the probe failed.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_app.operations import health


class Command(BaseCommand):
    help = (
        "Show beat nodes and their shards, the outbox backlog, lag p99, parked schedules and "
        "unclaimed occurrences; --liveness / --readiness exit 1 when the probe fails."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="Print JSON.")
        probe = parser.add_mutually_exclusive_group()
        probe.add_argument(
            "--liveness", action="store_true", help="Exit 1 unless the beat loop made progress."
        )
        probe.add_argument(
            "--readiness",
            action="store_true",
            help="Exit 1 unless the node holds shards and reaches the database and broker.",
        )
        parser.add_argument(
            "--node", help="Beat node name (default: every beat node of this host)."
        )
        parser.add_argument(
            "--max-age",
            type=float,
            default=health.DEFAULT_LIVENESS_MAX_AGE,
            help="Liveness: seconds since the loop's last step (default %(default)s).",
        )
        parser.add_argument(
            "--timeout",
            type=float,
            default=health.DEFAULT_PROBE_TIMEOUT,
            help="Readiness: seconds each of the database and the broker may take.",
        )
        parser.add_argument(
            "--lag-minutes",
            type=float,
            default=5.0,
            help="Window of the lag p99: occurrences scheduled in the last MINUTES and sent "
            "(default %(default)s).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["liveness"] or options["readiness"]:
            if options["liveness"]:
                result = health.liveness(options["node"], max_age=options["max_age"])
            else:
                result = health.readiness(options["node"], timeout=options["timeout"])
            if options["json"]:
                self.stdout.write(json.dumps({"ok": result.ok, "checks": result.checks}))
            else:
                for name, detail in result.checks.items():
                    self.stdout.write(f"{name}: {detail}")
                self.stdout.write("OK" if result.ok else "FAIL")
            if not result.ok:
                raise SystemExit(result.exit_code)
            return
        report = health.status(lag_minutes=options["lag_minutes"])
        if options["json"]:
            self.stdout.write(json.dumps(report.as_dict(), indent=2))
            return
        self.stdout.write(render(report))


def render(report: health.Status) -> str:
    lines = [f"now {report.now}  shards {report.shard_count}", "beat nodes:"]
    for node in report.nodes:
        lines.append(
            f"  {node.name}  {'alive' if node.alive else 'DEAD '}  "
            f"shards={len(node.shards)} {_ranges(node.shards)}  "
            f"last_seen={node.last_seen}  progress_at={node.progress_at}"
        )
    if not report.nodes:
        lines.append("  (none)")
    lines += [
        f"unowned shards: {len(report.unowned_shards)} {_ranges(report.unowned_shards)}",
        f"outbox backlog (due, unsent): {report.outbox_backlog}"
        + (
            f"  oldest {report.oldest_due_unsent} ({report.oldest_due_unsent_age_seconds:.1f} s)"
            if report.oldest_due_unsent_age_seconds is not None
            else ""
        ),
        f"lag p99 of the last {report.lag_window_minutes:g} min's sent occurrences: "
        + (
            f"{report.lag_p99_seconds:.3f} s ({report.lag_samples} occurrences)"
            if report.lag_p99_seconds is not None
            else "no occurrences"
        ),
        f"parked schedules: {report.parked_schedules}",
        f"enqueued, unclaimed > {report.redelivery_timeout_seconds:g} s: "
        f"{report.unclaimed_past_redelivery}",
    ]
    return "\n".join(lines)


def _ranges(shards: list[int]) -> str:
    """``[0-3,7]`` for 0,1,2,3,7."""
    if not shards:
        return "[]"
    parts: list[str] = []
    start = prev = shards[0]
    for shard in [*shards[1:], None]:
        if shard is not None and shard == prev + 1:
            prev = shard
            continue
        parts.append(f"{start}-{prev}" if prev != start else str(start))
        if shard is not None:
            start = prev = shard
    return "[" + ",".join(parts) + "]"
