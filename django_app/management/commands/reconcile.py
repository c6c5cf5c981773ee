"""``manage.py reconcile --from ISO --to ISO [--json] [--schedule ID]``.

Recomputes the occurrences that should exist in the window from schedule versions and the
time rules alone, and compares them with the occurrence table (see
``django_app.operations.reconcile``).
Streams: items are written as each chunk of schedules is judged, so memory stays bounded
whatever the window.

Exit status: 0 when nothing is ABSENT (missed, skipped, skipped_by_policy, upcoming and
unexpected do not fail the run), 1 when any expected occurrence is ABSENT, 2 for bad
arguments, 3 when the database failed before the run could decide.

Bounded: both ends must lie in [1970, 2200) and the window may span at most ``--max-days``
(default 31); a longer one is refused with the commands that split it. Progress, with an
estimate of the time left, goes to stderr every ``--progress-every`` seconds.
"""

from __future__ import annotations

import json
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from celery_scheduler.core.clock import SYSTEM_CLOCK
from django_app.operations.reconcile import (
    ABSENT,
    UNEXPECTED,
    Item,
    Progress,
    count_schedules,
    iter_reconcile,
    schedules_without_history,
)

#: Exit status for bad arguments (1 is reserved for "something is ABSENT").
USAGE_ERROR = 2
#: Exit status when the database failed during the run: nothing was decided.
UNFINISHED = 3
#: Instants a window may touch: far enough for any real history and plan, and far from
#: datetime's year 1 / 9999 edges, where time arithmetic overflows.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(2200, 1, 1, tzinfo=UTC)
DEFAULT_MAX_DAYS = 31
#: Split suggestions listed in the "window too long" error.
_SPLIT_SHOWN = 3


def _usage(message: str) -> CommandError:
    return CommandError(message, returncode=USAGE_ERROR)


def _instant(text: str, flag: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError as exc:
        raise _usage(f"{flag} {text!r} is not an ISO 8601 time, e.g. 2026-03-01T12:00Z") from exc
    if value.tzinfo is None:
        raise _usage(f"{flag} {text!r} has no UTC offset; write it as {text}Z or {text}+00:00")
    try:
        value = value.astimezone(UTC)
    except OverflowError:  # year 1 with a positive offset: before datetime.min in UTC
        value = datetime.min.replace(tzinfo=UTC)
    if not EARLIEST <= value <= LATEST:
        raise _usage(
            f"{flag} {text} is out of range: a window lies between {EARLIEST.date()} and "
            f"{LATEST.date()} (UTC)"
        )
    return value


def _window_too_long(start: datetime, end: datetime, max_days: int) -> CommandError:
    """The refusal, with the first commands of the split and how many runs it takes."""
    step = timedelta(days=max_days)
    runs = -(-(end - start) // step)  # ceiling division of timedeltas
    lines = []
    at = start
    for _ in range(min(runs, _SPLIT_SHOWN)):
        upto = min(at + step, end)
        lines.append(f"  manage.py reconcile --from {at.isoformat()} --to {upto.isoformat()}")
        at = upto
    if runs > _SPLIT_SHOWN:
        lines.append(f"  ... {runs} runs in all, the last ending at --to {end.isoformat()}")
    days = (end - start).total_seconds() / 86400
    return _usage(
        f"the window [{start.isoformat()}, {end.isoformat()}) is {days:.10g} days; reconcile "
        f"checks at most {max_days} days per run (--max-days N raises the bound: the run "
        "streams in bounded memory, but its time grows with the window). Split it:\n"
        + "\n".join(lines)
    )


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
        parser.add_argument(
            "--max-days", type=int, default=DEFAULT_MAX_DAYS,
            help=f"longest window accepted, in days (default {DEFAULT_MAX_DAYS})",
        )  # fmt: skip
        parser.add_argument(
            "--progress-every", type=float, default=10.0, metavar="SECONDS",
            help="progress and time-left estimate on stderr this often (default 10 s)",
        )  # fmt: skip

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            self._reconcile(options)
        except DatabaseError as exc:
            # Not exit 1, which says "something is ABSENT" to the job that runs this.
            raise CommandError(
                f"the database failed during the reconcile; nothing was decided: {exc}",
                returncode=UNFINISHED,
            ) from exc

    def _reconcile(self, options: dict[str, Any]) -> None:
        start = _instant(options["start"], "--from")
        end = _instant(options["end"], "--to")
        if end <= start:
            raise _usage(f"--to ({end.isoformat()}) must be after --from ({start.isoformat()})")
        max_days = options["max_days"]
        if not 1 <= max_days <= timedelta.max.days:
            raise _usage(f"--max-days must be from 1 to {timedelta.max.days}, got {max_days}")
        if end - start > timedelta(days=max_days):
            raise _window_too_long(start, end, max_days)
        schedule_ids = (
            None if options["schedule"] is None else [_schedule_id(s) for s in options["schedule"]]
        )
        total = count_schedules(schedule_ids)
        days = (end - start).total_seconds() / 86400
        self.stderr.write(
            f"reconcile: {total} schedule(s) over {days:.1f} day(s) "
            f"[{start.isoformat()}, {end.isoformat()})"
        )
        items = iter_reconcile(
            start=start,
            end=end,
            now=SYSTEM_CLOCK.now(),
            schedule_ids=schedule_ids,
            on_progress=self._reporter(options["progress_every"]),
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

    def _reporter(self, every: float) -> Any:
        """A progress callback: a line on stderr at most every ``every`` seconds."""
        started = last = time.monotonic()

        def report(p: Progress) -> None:
            nonlocal last
            now = time.monotonic()
            if now - last < every and p.schedules_done < p.schedules_total:
                return
            last = now
            elapsed = now - started
            share = p.schedules_done / p.schedules_total if p.schedules_total else 1.0
            left = elapsed / share - elapsed if share else float("nan")
            self.stderr.write(
                f"reconcile: {p.schedules_done}/{p.schedules_total} schedules ({share:.0%}), "
                f"{p.items:,} judged, {p.rows_read:,} rows read, {elapsed:.0f} s elapsed, "
                f"about {left:.0f} s left"
            )

        return report

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
