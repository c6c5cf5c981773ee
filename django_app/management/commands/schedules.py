"""``manage.py schedules list|describe|backfill``: the management API's reads for shells.

Thin over ``celery_scheduler.api`` (``list_schedules``, ``describe_schedule``, ``backfill``,
whose audit entry names ``manage.py schedules`` and ``--reason``);
``--json`` prints the API's typed result as JSON (``api_types.as_json``) for scripts.
Exit codes: 0 done, 1 not found or refused by the schedule's state, 2 bad arguments (the
message names the option).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from celery_scheduler import api, errors
from celery_scheduler.api_types import SCHEDULE_FILTERS, ScheduleDescription, SchedulePage, as_json
from django_app.schedules import reads

#: API argument -> the option that carries it, so an error names what to fix.
_OPTIONS = {
    **{name: "--" + name.replace("_", "-") for name in SCHEDULE_FILTERS},
    "after": "--cursor", "next_count": "--next", "last_count": "--last",
    "overlap_policy": "--overlap-policy", "start": "--start", "end": "--end",
    "reason": "--reason",
}  # fmt: skip
#: Who a backfill's audit entry names.
ACTOR = "manage.py schedules"


def _instant(option: str) -> Any:
    def parse(text: str) -> datetime:
        try:
            value = datetime.fromisoformat(text)
        except ValueError:
            raise CommandError(
                f"{option}: {text[:40]!r} is not an ISO 8601 instant "
                "(e.g. 2026-01-31T02:00:00+00:00)",
                returncode=2,
            ) from None
        if value.tzinfo is None:
            raise CommandError(f"{option}: needs a UTC offset (e.g. +00:00)", returncode=2)
        return value

    return parse


class Command(BaseCommand):
    help = "List, describe or backfill schedules (the management API for shells and scripts)."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        listing = sub.add_parser("list", help="one page of schedules matching the filters")
        listing.add_argument("--tenant")
        listing.add_argument("--state")
        listing.add_argument("--task")
        listing.add_argument("--tag", help="'key=value' or 'key'")
        listing.add_argument("--name-contains")
        listing.add_argument("--next-run-before", type=_instant("--next-run-before"))
        listing.add_argument("--next-run-after", type=_instant("--next-run-after"))
        listing.add_argument("--limit", type=int, default=50, help="1-1000 (default 50)")
        listing.add_argument("--cursor", help="next_cursor printed by the previous page")
        listing.add_argument("--json", action="store_true")
        describe = sub.add_parser("describe", help="everything about one schedule")
        describe.add_argument("schedule_id")
        describe.add_argument("--tenant", help="refuse a schedule of another tenant")
        describe.add_argument("--next", type=int, default=5, dest="next_count")
        describe.add_argument("--last", type=int, default=10, dest="last_count")
        describe.add_argument("--json", action="store_true")
        backfill = sub.add_parser("backfill", help="run a past range's fire times")
        backfill.add_argument("schedule_id")
        backfill.add_argument("--start", required=True, type=_instant("--start"))
        backfill.add_argument("--end", required=True, type=_instant("--end"))
        backfill.add_argument("--overlap-policy")
        backfill.add_argument("--tenant")
        backfill.add_argument("--reason", help="why, for the audit trail")
        backfill.add_argument("--json", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            getattr(self, f"_{options['action']}")(options)
        except errors.ValidationError as exc:
            option = _OPTIONS.get(exc.field or "", f"--{exc.field or 'arguments'}")
            raise CommandError(f"{option}: {exc}", returncode=2) from exc
        except (errors.ScheduleNotFound, errors.InvalidStateTransition) as exc:
            raise CommandError(str(exc), returncode=1) from exc

    def _out(self, options: dict[str, Any], value: Any, text: str) -> None:
        self.stdout.write(json.dumps(as_json(value), indent=2) if options["json"] else text)

    def _list(self, o: dict[str, Any]) -> None:
        filters = {name: o[name] for name in SCHEDULE_FILTERS}
        try:
            page = api.list_schedules(limit=o["limit"], after=o["cursor"], **filters)
        except errors.ValidationError as exc:  # the API calls the cursor `after`
            raise reads.renamed_cursor_error(exc, "cursor") from None
        self._out(o, page, _list_text(page))

    def _describe(self, o: dict[str, Any]) -> None:
        described = api.describe_schedule(
            o["schedule_id"], tenant=o["tenant"],
            next_count=o["next_count"], last_count=o["last_count"],
        )  # fmt: skip
        self._out(o, described, _describe_text(described))

    def _backfill(self, o: dict[str, Any]) -> None:
        report = api.backfill(
            o["schedule_id"], o["start"], o["end"],
            overlap_policy=o["overlap_policy"], tenant=o["tenant"],
            actor=ACTOR, reason=o["reason"],
        )  # fmt: skip
        text = (
            f"{report.fire_times} fire times in [{report.start.isoformat()}, "
            f"{report.end.isoformat()}): {len(report.created)} created, "
            f"{report.already_backfilled} already backfilled, {report.already_ran} already ran"
        )
        if report.releases_from is not None and report.releases_until is not None:
            text += (
                f"; released from {report.releases_from.isoformat()} "
                f"until {report.releases_until.isoformat()}"
            )
        self._out(o, report, text)


def _utc(value: datetime | None) -> str:
    """One width for every instant: to the millisecond, no offset (the header says UTC).

    ``isoformat()`` drops the fraction when it is zero and adds ``+00:00``, so rows with and
    without microseconds had different widths and the columns after them went out of line.
    """
    if value is None:
        return "-"
    return f"{value.astimezone(UTC):%Y-%m-%d %H:%M:%S.%f}"[:-3]


def _list_text(page: SchedulePage) -> str:
    rows = [("ID", "TENANT", "STATE", "NEXT RUN (UTC)")] + [
        (str(s.id), s.tenant, s.state, _utc(s.next_run_at)) for s in page.items
    ]
    names = ["NAME"] + [s.name for s in page.items]
    # Each column as wide as its widest cell (a long tenant slug no longer shifts the rest).
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) + "  " + name
        for row, name in zip(rows, names, strict=True)
    ]
    if page.next_cursor:
        lines.append(f"more: --cursor {page.next_cursor}")
    return "\n".join(lines)


def _describe_text(d: ScheduleDescription) -> str:
    s = d.schedule
    timing = s.cron or (f"every {s.interval_seconds}s" if s.interval_seconds else str(s.run_at))
    state = f"{s.state} ({s.state_reason})" if s.state_reason else s.state
    c = d.counters
    lines = [
        f"{s.name}  [{s.id}]",
        f"  tenant {s.tenant}, task {s.task}, {timing} ({s.timezone}), version {s.version}",
        *([f"  DST: gap {s.dst_gap}, fold {s.dst_fold}"] if s.kind == "CRON" else []),
        f"  state {state}",
        f"  runs {c.runs}, succeeded {c.succeeded}, failures {c.failures}, dead {c.dead}, "
        f"missed {c.missed}, skipped by overlap {c.skipped_overlap}, skipped {c.skipped}",
    ]
    if s.remaining_runs is not None:
        lines.append(f"  remaining runs {s.remaining_runs} of {s.max_runs}")
    if s.tags:
        lines.append("  tags " + ", ".join(f"{k}={v}" for k, v in sorted(s.tags.items())))
    lines.append("  next:")
    lines += [
        f"    {f.utc.isoformat()}  ({f.local.isoformat()}) {f.note}" for f in d.next_fire_times
    ]
    lines.append("  recent:")
    for o in d.recent:
        lag = f"lag {o.lag_seconds:.1f}s" if o.lag_seconds is not None else "not published"
        lines.append(
            f"    {o.scheduled_for.isoformat()}  {o.state:<15} attempts {o.attempts}, {lag}"
        )
    return "\n".join(lines)
