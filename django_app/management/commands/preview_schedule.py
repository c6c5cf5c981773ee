"""``manage.py preview_schedule "<cron>" --tz ZONE [--start ISO] [--count N] [--json]``.

Prints the next fire times of a cron expression in UTC and in the schedule's zone, marking
runs next to a DST change, so an unintended expression is caught before it is saved. It reads
no database: it is a thin shell around :func:`celery_scheduler.core.timemath.preview`.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from celery_scheduler import errors
from celery_scheduler.core import clock, timemath


def parse_start(text: str | None, zone_name: str) -> tuple[datetime, bool]:
    """An ISO 8601 instant; a naive one is read as wall time in the schedule's zone. And
    whether it was a wall time the clocks skipped (it then names the gap's end)."""
    if text is None:
        return clock.SYSTEM_CLOCK.now(), False
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise CommandError(
            f"Invalid --start {text[:40]!r}: expected an ISO 8601 date/time such as "
            "'2026-03-29T00:00:00+01:00' or '2026-03-29T00:00' (read in --tz)."
        ) from None
    skipped = False
    if value.tzinfo is None:
        value, skipped = timemath.wall_instant(value, timemath.parse_timezone(zone_name))
    try:
        timemath.check_instant(value, "--start")
    except errors.ValidationError as exc:
        raise CommandError(str(exc)) from None
    return value, skipped


#: The option each validation field comes from, so the message names what to fix.
_OPTIONS = {
    "timezone": "--tz", "count": "--count", "cron": "expression", "dst_gap": "--dst-gap",
    "dst_fold": "--dst-fold",
}  # fmt: skip


class Command(BaseCommand):
    help = (
        "Show the next fire times of a five-field cron expression (or @daily-style macro) in "
        "UTC and local time, marking runs next to a DST change."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("expression", help='cron expression, e.g. "30 2 * * *" or @daily')
        parser.add_argument("--tz", default="UTC", help="IANA time zone (default: UTC)")
        parser.add_argument(
            "--dst-gap",
            default="SKIP",
            help="a wall time the spring-forward gap removes: SKIP (default) or SHIFT",
        )
        parser.add_argument(
            "--dst-fold",
            default="FIRST",
            help="a wall time the fall-back repeats: FIRST (default), SECOND or BOTH",
        )
        parser.add_argument(
            "--start",
            help=(
                "list runs strictly after this ISO 8601 instant (default: now; naive = wall "
                "time in --tz, and one the clocks skip names the end of the gap)"
            ),
        )
        parser.add_argument(
            "--count",
            type=int,
            default=10,
            help=f"number of runs, 1-{timemath.MAX_PREVIEW} (default: 10)",
        )
        parser.add_argument("--json", action="store_true", help="print JSON instead of a table")

    def handle(self, *args: Any, **options: Any) -> None:
        expression: str = options["expression"]
        zone_name: str = options["tz"]
        try:
            trigger = timemath.CronTrigger(
                expression=expression, timezone=zone_name, dst_gap=options["dst_gap"],
                dst_fold=options["dst_fold"],
            )  # fmt: skip
            start, skipped = parse_start(options["start"], zone_name)
            # A skipped wall time names the gap's end; the runs from there on come after it.
            # (In UTC: arithmetic on a zoned datetime is wall-time arithmetic, back into the gap.)
            after = start.astimezone(UTC) - timedelta(microseconds=1) if skipped else start
            rows = timemath.preview(trigger, start=after, count=options["count"])
            description = timemath.describe_cron(expression) + timemath.describe_dst(trigger)
        except errors.ValidationError as exc:
            option = _OPTIONS.get(exc.field or "", exc.field or "expression")
            raise CommandError(f"{option}: {exc}") from exc
        except errors.SchedulerError as exc:
            raise CommandError(str(exc)) from exc
        if options["json"]:
            self.stdout.write(self._as_json(trigger, description, start, rows))
        else:
            self._table(expression, zone_name, description, start, rows)

    @staticmethod
    def _as_json(
        trigger: timemath.CronTrigger,
        description: str,
        start: datetime,
        rows: list[timemath.PreviewRow],
    ) -> str:
        payload = {
            "expression": trigger.expression,
            "timezone": trigger.timezone,
            "dst_gap": trigger.dst_gap.value,
            "dst_fold": trigger.dst_fold.value,
            "description": description,
            "start": start.isoformat(),
            "runs": [
                {"utc": row.utc.isoformat(), "local": row.local.isoformat(), "note": row.note}
                for row in rows
            ],
        }
        return json.dumps(payload, indent=2)

    def _table(
        self,
        expression: str,
        zone_name: str,
        description: str,
        start: datetime,
        rows: list[timemath.PreviewRow],
    ) -> None:
        self.stdout.write(f"{expression}  ({description})  in {zone_name}")
        self.stdout.write(f"next {len(rows)} run(s) after {start.isoformat()}:")
        self.stdout.write(f"{'#':>4}  {'UTC':<20}  {'local (' + zone_name + ')':<32}  note")
        for number, row in enumerate(rows, start=1):
            local = f"{row.local:%Y-%m-%d %H:%M %Z (UTC%z)}"
            mark = f"* {row.note}" if row.note else ""
            line = f"{number:>4}  {row.utc:%Y-%m-%d %H:%MZ}     {local:<32}  {mark}"
            self.stdout.write(line.rstrip())
        if any(row.note for row in rows):
            self.stdout.write("* runs next to a DST change")
