"""``manage.py reconcile --from ISO --to ISO [--json] [--schedule ID]``.

Recomputes the occurrences that should exist in the window from schedule versions and the
time rules alone, and compares them with the occurrence table (see ``django_app.reconcile``).
Streams: items are written as each chunk of schedules is judged, so memory stays bounded
whatever the window.

Exit status: 0 when nothing is ABSENT (missed, skipped, skipped_by_policy, upcoming and
unexpected do not fail the run), 1 when any expected occurrence is ABSENT, 2 for bad
arguments.
"""

from __future__ import annotations

import json
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from celery_scheduler.core.clock import SYSTEM_CLOCK
from django_app.reconcile import (
    ABSENT,
    UNEXPECTED,
    Item,
    iter_reconcile,
    schedules_without_history,
)

#: Exit status for bad arguments (1 is reserved for "something is ABSENT").
USAGE_ERROR = 2


def _usage(message: str) -> CommandError:
    return CommandError(message, returncode=USAGE_ERROR)


def _instant(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError as exc:
        raise _usage(f"{text!r} is not an ISO 8601 time, e.g. 2026-03-01T12:00Z") from exc
    if value.tzinfo is None:
        raise _usage(f"{text!r} has no UTC offset; write it as {text}Z or {text}+00:00")
    return value.astimezone(UTC)


def _schedule_id(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError as exc:
        raise _usage(f"--schedule {text!r} is not a schedule id (a UUID)") from exc


class Command(BaseCommand):
    help = (
        "Recompute the occurrences expected in [--from, --to) from schedule versions and time "
        "rules, and report each as succeeded, failed, canceled, missed, skipped, "
        "skipped_by_policy, pending, upcoming or ABSENT (plus unexpected rows). "
        "Exits 1 if anything is ABSENT, 2 on bad arguments."
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
            raise _usage(f"--to ({end.isoformat()}) must be after --from ({start.isoformat()})")
        schedule_ids = (
            None if options["schedule"] is None else [_schedule_id(s) for s in options["schedule"]]
        )
        items = iter_reconcile(
            start=start, end=end, now=SYSTEM_CLOCK.now(), schedule_ids=schedule_ids
        )
        no_history = schedules_without_history(schedule_ids)
        if options["json"]:
            counts = self._json(items, start, end, no_history)
        else:
            counts = self._table(items, no_history)
        if counts[ABSENT]:
            raise CommandError(
                f"{counts[ABSENT]} expected occurrence(s) ABSENT in "
                f"[{start.isoformat()}, {end.isoformat()})",
                returncode=1,
            )

    def _json(
        self, items: Iterable[Item], start: datetime, end: datetime, no_history: list[uuid.UUID]
    ) -> Counter[str]:
        """One JSON document, written as it streams; unexpected rows wait in a spool file
        (on disk past 1 MB) so the document keeps its two lists without holding them."""
        out = self.stdout
        counts: Counter[str] = Counter()
        out.write(f'{{"from": "{start.isoformat()}", "to": "{end.isoformat()}",', ending="\n")
        out.write(' "expected": [', ending="")
        with tempfile.SpooledTemporaryFile(max_size=1 << 20, mode="w+") as spool:
            first = {"expected": True, UNEXPECTED: True}
            for item in items:
                counts[item.status] += 1
                kind = UNEXPECTED if item.status == UNEXPECTED else "expected"
                text = ("\n  " if first[kind] else ",\n  ") + json.dumps(item.as_json())
                first[kind] = False
                if kind == UNEXPECTED:
                    spool.write(text)
                else:
                    out.write(text, ending="")
            out.write("\n ],", ending="\n")
            out.write(' "unexpected": [', ending="")
            spool.seek(0)
            while chunk := spool.read(1 << 16):
                out.write(chunk, ending="")
        counts[UNEXPECTED] += 0
        tail = {
            "ok": not counts[ABSENT],
            "counts": {k: v for k, v in sorted(counts.items()) if v or k == UNEXPECTED},
            "schedules_without_history": [str(s) for s in no_history],
        }
        out.write("\n ],", ending="\n")
        out.write(" " + json.dumps(tail)[1:])
        return counts

    def _table(self, items: Iterable[Item], no_history: list[uuid.UUID]) -> Counter[str]:
        out = self.stdout
        counts: Counter[str] = Counter()
        out.write(f"{'scheduled_for':<27} {'schedule':<36} {'ver':>4}  {'status':<17} state")
        for item in items:
            counts[item.status] += 1
            out.write(self._line(item))
        counts[UNEXPECTED] += 0
        expected = sum(v for k, v in counts.items() if k != UNEXPECTED)
        summary = ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))
        out.write(f"expected={expected} {summary}")
        if no_history:
            out.write(
                self.style.WARNING(
                    f"{len(no_history)} schedule(s) have no version history and were not "
                    "checked: " + ", ".join(str(s) for s in no_history[:5])
                )
            )
        return counts

    def _line(self, item: Item) -> str:
        line = (
            f"{item.scheduled_for.isoformat():<27} {item.schedule_id!s:<36} "
            f"{item.version:>4}  {item.status:<17} {item.state}"
        )
        return str(self.style.ERROR(line)) if item.status == ABSENT else line
