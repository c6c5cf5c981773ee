"""``manage.py partitions {status,ensure,drop,convert}``: PostgreSQL's partitioned history.

- ``status``: each partitioned table's partitions with their ranges and row estimates.
- ``ensure [--ahead N] [--behind N]``: create the slots the beats create (they do it on
  their own every few minutes; this is for a deploy or a cron without beats).
- ``drop --older-than DAYS [--include-dead] [--move | --force] [--dry-run]``: drop whole
  slots older than DAYS on the three tables at once. A slot holding rows retention must keep
  is refused and reported, unless ``--move`` (those rows go to the default partition, in the
  same transaction) or ``--force`` (they are dropped with it).
- ``convert [--lock-timeout MS] [--batch N]``: partition a populated install's plain tables
  (django_app.db.convert; docs/howto/retention-and-scale.md says what it locks and for how long).
  Interrupted, it can be run again; a second run while one is going is refused.

See django_app.db.partitions. On SQLite and MariaDB there is nothing to partition: the
command says so; ``prune_occurrences`` is the retention there.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection

from celery_scheduler.core.clock import SYSTEM_CLOCK
from django_app import conf
from django_app.db import convert, partitions
from django_app.operations import retention


class Command(BaseCommand):
    help = "PostgreSQL: create, list, drop and convert the partitions of the history tables."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("status", help="list the partitions")
        ensure = sub.add_parser("ensure", help="create the slots ahead now")
        ensure.add_argument("--ahead", type=int, default=None, help="slots after the current")
        ensure.add_argument("--behind", type=int, default=0, help="slots before the current")
        drop = sub.add_parser("drop", help="drop whole slots older than --older-than days")
        drop.add_argument("--older-than", dest="days", type=int, required=True, metavar="DAYS")
        drop.add_argument("--include-dead", action="store_true", help="DEAD rows do not block")
        how = drop.add_mutually_exclusive_group()
        how.add_argument(
            "--move", action="store_true",
            help="move the rows that block a slot to the default partition, then drop it",
        )  # fmt: skip
        how.add_argument(
            "--force", action="store_true",
            help="drop a slot even with unfinished, DEAD or unsent rows in it (they are lost)",
        )  # fmt: skip
        drop.add_argument("--dry-run", action="store_true")
        conv = sub.add_parser("convert", help="partition a populated install's plain tables")
        conv.add_argument("--lock-timeout", type=int, default=5000, metavar="MS")
        conv.add_argument("--batch", type=int, default=50_000, metavar="N")
        conv.add_argument("--margin-days", type=int, default=2, metavar="DAYS")
        for p in (ensure, drop, conv, sub.choices["status"]):
            p.add_argument("--json", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        if connection.vendor != "postgresql":
            raise CommandError(
                "partitioned history is for PostgreSQL; on this database prune with "
                "`manage.py prune_occurrences`"
            )
        cfg = conf.get()
        width = timedelta(hours=cfg.partition_width_hours)
        now = SYSTEM_CLOCK.now()
        action = options["action"]
        if action == "drop" and options["days"] < 1:
            raise CommandError("--older-than must be at least 1 day")
        if action == "convert":
            try:
                out: dict[str, Any] = convert.convert(
                    now,
                    width=width,
                    ahead=cfg.partitions_ahead,
                    lock_timeout_ms=options["lock_timeout"],
                    batch=options["batch"],
                    margin=timedelta(days=options["margin_days"]),
                    log=self.stderr.write if options["json"] else self.stdout.write,
                ).as_json()
            except convert.ConversionRunning as exc:
                raise CommandError(str(exc)) from exc
        elif not partitions.is_partitioned():
            raise CommandError(
                "the history tables are not partitioned: run `manage.py partitions convert`"
            )
        elif action == "status":
            out = {
                t: sorted(
                    (
                        {
                            "name": p.name,
                            "from": None if p.start is None else p.start.isoformat(),
                            "to": None if p.end is None else p.end.isoformat(),
                            "default": p.default,
                        }
                        for p in partitions.partitions(t)
                    ),
                    key=lambda d: (d["default"], d["from"] or ""),
                )
                for t in partitions.tables()
            }
        elif action == "ensure":
            ahead = cfg.partitions_ahead if options["ahead"] is None else options["ahead"]
            r = partitions.ensure(
                now, width=width, ahead=ahead, behind=options["behind"], wait=True
            )
            out = {"created": r.created, "moved_from_default": r.moved}
        else:
            out = partitions.drop_old(
                now,
                timedelta(days=options["days"]),
                include_dead=options["include_dead"],
                move=options["move"],
                force=options["force"],
                dry_run=options["dry_run"],
                on_prune=retention.record_pruned,
                wait=True,
            ).as_json()
        if options["json"] or action == "status":
            self.stdout.write(json.dumps(out, indent=2))
        else:
            for key, value in out.items():
                self.stdout.write(f"{key}: {value}")
        if action == "drop" and out.get("refused"):
            self.stderr.write(
                self.style.WARNING(
                    "some slots were kept: rows in them may still run or be replayed "
                    "(--move or --force to drop them anyway)"
                )
            )
