"""``manage.py reconcile --from ISO --to ISO [--json] [--schedule ID]``.

Recomputes the occurrences that should exist in the window from schedule versions and the
time rules alone, and compares them with the occurrence table (see ``django_app.reconcile``).
Exits with status 1 when any expected occurrence is ABSENT.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from celery_scheduler.core.clock import SYSTEM_CLOCK
from django_app.reconcile import ABSENT, ReconcileReport, reconcile, schedules_without_history


def _instant(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError as exc:
        raise CommandError(f"{text!r} is not an ISO 8601 time, e.g. 2026-03-01T12:00Z") from exc
    if value.tzinfo is None:
        raise CommandError(f"{text!r} has no UTC offset; write it as {text}Z or {text}+00:00")
    return value.astimezone(UTC)


def _schedule_id(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError as exc:
        raise CommandError(f"--schedule {text!r} is not a schedule id (a UUID)") from exc


class Command(BaseCommand):
    help = (
        "Recompute the occurrences expected in [--from, --to) from schedule versions and time "
        "rules, and report each as succeeded, failed, canceled, missed, skipped, pending or "
        "ABSENT. Exits 1 if anything is ABSENT."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--from", dest="start", required=True, help="window start (ISO)")
        parser.add_argument("--to", dest="end", required=True, help="window end, exclusive")
        parser.add_argument("--json", action="store_true", help="machine-readable output")
        parser.add_argument(
            "--schedule", action="append", default=None, help="limit to this id (repeatable)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        start, end = _instant(options["start"]), _instant(options["end"])
        if end <= start:
            raise CommandError(f"--to ({end.isoformat()}) must be after --from")
        schedule_ids = (
            None if options["schedule"] is None else [_schedule_id(s) for s in options["schedule"]]
        )
        report = reconcile(start=start, end=end, now=SYSTEM_CLOCK.now(), schedule_ids=schedule_ids)
        no_history = schedules_without_history(schedule_ids)
        if options["json"]:
            payload = report.as_json()
            payload["schedules_without_history"] = [str(s) for s in no_history]
            self.stdout.write(json.dumps(payload, indent=2))
        else:
            self._table(report, no_history)
        if not report.ok:
            raise CommandError(
                f"{len(report.absent)} expected occurrence(s) ABSENT in "
                f"[{start.isoformat()}, {end.isoformat()})",
                returncode=1,
            )

    def _table(self, report: ReconcileReport, no_history: list[uuid.UUID]) -> None:
        out = self.stdout
        out.write(f"{'scheduled_for':<27} {'schedule':<36} {'ver':>4}  {'status':<10} state")
        for item in [*report.expected, *report.unexpected]:
            line = (
                f"{item.scheduled_for.isoformat():<27} {item.schedule_id!s:<36} "
                f"{item.version:>4}  {item.status:<10} {item.state}"
            )
            out.write(self.style.ERROR(line) if item.status == ABSENT else line)
        summary = ", ".join(f"{k}={v}" for k, v in sorted(report.counts.items()))
        out.write(f"expected={len(report.expected)} {summary}")
        if no_history:
            out.write(
                self.style.WARNING(
                    f"{len(no_history)} schedule(s) have no version history and were not "
                    "checked: " + ", ".join(str(s) for s in no_history[:5])
                )
            )
