"""``manage.py reshard [--all] [--dry-run]``: move schedules into shards below ``shard_count``.

Run it after lowering ``CELERY_SCHEDULER["shard_count"]`` (beat refuses to start until it
has run), with the new setting in effect. ``--all`` also re-spreads every schedule over the
current count (useful after raising it). Safe while beats, relays and workers run.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_app import conf
from django_app.cluster.reshard import reshard


class Command(BaseCommand):
    help = (
        "Move schedules stored in shards >= shard_count (left behind when shard_count was "
        "lowered) and their unsent outbox rows into range, so every schedule fires again. "
        "--all re-spreads every schedule over the current shard_count."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--all", action="store_true", help="re-spread every schedule, not only stranded"
        )
        parser.add_argument("--dry-run", action="store_true", help="count only, write nothing")

    def handle(self, *args: Any, **options: Any) -> None:
        count = conf.get().shard_count
        report = reshard(shard_count=count, rebalance=options["all"], dry_run=options["dry_run"])
        verb = "would move" if options["dry_run"] else "moved"
        self.stdout.write(
            f"shard_count={count}: {verb} {report.schedules} schedule(s) and "
            f"{report.outbox_rows} unsent outbox row(s) into shards 0..{count - 1}"
            + ("" if options["dry_run"] else f"; dropped {report.leases_dropped} lease row(s)")
        )
