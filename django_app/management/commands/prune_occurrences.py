"""``manage.py prune_occurrences --older-than DAYS [--batch N] [--include-dead]
[--idempotency-older-than DAYS] [--dry-run] [--json]``.

Deletes old finished occurrences with their attempts and sent outbox rows, in short batches
(see ``django_app.operations.retention`` for exactly what may go). Meant to run daily from
cron or as a scheduled task; safe to run while beat, relays and workers are running.
"""

from __future__ import annotations

import argparse
import json
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from celery_scheduler import errors
from celery_scheduler.core.clock import SYSTEM_CLOCK
from django_app.operations.retention import MAX_BATCH, PruneReport, prune

#: The oldest age an option accepts: a century is more history than any table keeps, and
#: "now - DAYS" must stay inside datetime's range (99999999999 days raised OverflowError).
MAX_DAYS = 36_500


def _days(text: str) -> int:
    # ArgumentTypeError: argparse prefixes the message with the option it came from.
    text = text.strip()
    if not (text.isascii() and text.isdigit()):
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number of days")
    if len(text) > 6 or int(text) > MAX_DAYS:
        raise argparse.ArgumentTypeError(f"{text[:40]} days: the age must be at most {MAX_DAYS}")
    if int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text} days: the age must be at least 1 day")
    return int(text)


class Command(BaseCommand):
    help = (
        "Delete occurrences in a terminal state (SUCCEEDED, MISSED, CANCELED, SKIPPED_OVERLAP; "
        "DEAD only with --include-dead) due and finished more than --older-than days ago, with "
        "their attempts and sent outbox rows, in short batches. Never deletes a non-terminal "
        "occurrence, an unsent outbox row or a schedule version. The reconciler reports "
        "deleted occurrences as ABSENT: reconcile only windows newer than the cutoff."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than", dest="days", type=_days, required=True, metavar="DAYS",
            help="delete what was due and finished (if it did) over DAYS days ago",
        )  # fmt: skip
        parser.add_argument(
            "--batch", type=int, default=1000, metavar="N",
            help=f"occurrences per transaction (1..{MAX_BATCH}, default 1000); smaller "
            "batches hold row locks for less time",
        )  # fmt: skip
        parser.add_argument(
            "--include-dead", action="store_true",
            help="also delete old DEAD occurrences (they are the dead-letter queue: an "
            "operator can no longer inspect or replay what is deleted)",
        )  # fmt: skip
        parser.add_argument(
            "--idempotency-older-than", dest="idem_days", type=_days, metavar="DAYS",
            help="also delete @idempotent_task records older than DAYS days (default: keep "
            "them all). Deleting a key reopens the door to a duplicate effect when a late "
            "redelivery or replay of that task arrives, so choose DAYS well beyond any "
            "possible redelivery delay. Records of occurrences that can still run (not "
            "terminal, or DEAD) are always kept",
        )  # fmt: skip
        parser.add_argument("--dry-run", action="store_true", help="count only, write nothing")
        parser.add_argument("--json", action="store_true", help="machine-readable output")

    def handle(self, *args: Any, **options: Any) -> None:
        started = SYSTEM_CLOCK.monotonic()
        idem_days = options["idem_days"]
        if not 1 <= options["batch"] <= MAX_BATCH:  # prune() would name its own parameter
            raise CommandError(f"--batch must be from 1 to {MAX_BATCH}, got {options['batch']}")
        try:
            report = prune(
                now=SYSTEM_CLOCK.now(),
                older_than=timedelta(days=options["days"]),
                batch_size=options["batch"],
                include_dead=options["include_dead"],
                idempotency_older_than=None if idem_days is None else timedelta(days=idem_days),
                dry_run=options["dry_run"],
            )
        except errors.ValidationError as exc:
            raise CommandError(str(exc)) from exc
        seconds = round(SYSTEM_CLOCK.monotonic() - started, 3)
        if options["json"]:
            self.stdout.write(json.dumps({**report.as_json(), "seconds": seconds}, indent=2))
        else:
            self._summary(report, seconds)

    def _summary(self, report: PruneReport, seconds: float) -> None:
        verb = "would delete" if report.dry_run else "deleted"
        out = self.stdout
        out.write(f"cutoff {report.cutoff.isoformat()}{' (dry run)' if report.dry_run else ''}")
        for state in report.states:
            out.write(f"  {state:<16} {report.occurrences.get(state, 0):>10}")
        out.write(
            f"{verb} {report.total_occurrences} occurrence(s), {report.attempts} attempt(s), "
            f"{report.outbox} outbox row(s) in {report.batches} batch(es), {seconds}s"
        )
        if report.idempotency_records is not None:
            out.write(f"{verb} {report.idempotency_records} idempotency record(s)")
        if report.kept_unsent_outbox:
            out.write(
                self.style.WARNING(
                    f"kept {report.kept_unsent_outbox} old finished occurrence(s) whose outbox "
                    "row is still unsent (is a relay running?)"
                )
            )
