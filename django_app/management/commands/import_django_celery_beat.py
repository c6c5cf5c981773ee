"""Import django-celery-beat's periodic tasks as schedules (``--dry-run`` writes nothing).

Each line names the task and the timing its schedule gets (cron and zone, interval, or
one-off time) with its first run, so a dry run shows when things will fire after the switch.

Reads django-celery-beat's tables with plain SQL, so it works whether or not
``django_celery_beat`` is still in ``INSTALLED_APPS`` (the tables stay after removing it).
Each PeriodicTask becomes a schedule created through the lifecycle API with the
idempotency key ``dcb:<periodic task id>``: running the import twice creates nothing new.

Mapping: crontab (+ its time zone) -> cron; interval (every + period) -> interval;
clocked -> one-off at ``clocked_time``; ``enabled = false`` -> created, then paused;
args/kwargs (JSON text), queue, priority, start_time -> start_at, expires -> end_at,
expire_seconds -> deadline. An interval keeps its cadence: it is anchored at
``last_run_at + every`` (django-celery-beat's own next run), so an hourly task that ran ten
minutes before the switch runs fifty minutes after it, and a daily one keeps its time of day.
Fields with no equivalent (exchange, routing_key, headers, description) are named in the
report when set.
Skipped with a reason: solar schedules, ``one_off`` tasks on an interval or crontab, one-offs
that already ran, and anything validation or the database rejects (an unknown task name, a
past run_at, a malformed cron, a value that does not fit...).

Bad rows never stop the import. Each row is created in its own transaction (the schedule,
its version and, for a disabled task, the pause together), so a row that fails leaves
nothing behind and the rows before and after it are imported. ``--dry-run`` runs the very
same per-row transactions and rolls each back, so it reports the same skips a real run
would. A summary ends the output; the exit status is 1 if any row was skipped, else 0.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from celery.schedules import crontab
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connection, transaction
from django.utils.dateparse import parse_datetime

from celery_scheduler import errors
from celery_scheduler.core.clock import SYSTEM_CLOCK
from django_app.management import queries
from django_app.models import Schedule
from django_app.schedules import audited, beat_schedule, lifecycle, validation

PERIOD_SECONDS = {"days": 86400, "hours": 3600, "minutes": 60, "seconds": 1}

_COLUMNS = (
    "id name task args kwargs queue priority one_off enabled start_time expires expire_seconds "
    "last_run_at total_run_count exchange routing_key headers description "
    "every period minute hour day_of_month month_of_year day_of_week "
    "timezone clocked_time solar_id"
).split()


#: Who the audit trail names for what the import writes.
ACTOR = "manage.py import_django_celery_beat"


class Skip(Exception):
    """The row is not imported; the message says why."""


@dataclass(kw_only=True)
class Plan:
    dcb_id: int
    name: str
    values: dict[str, Any] = field(default_factory=dict)
    enabled: bool = True
    skip: str = ""
    #: Fields set in django-celery-beat that have no equivalent here (reported, not imported).
    lost: str = ""
    #: The created schedule's first fire time (also in a dry run, read before the rollback).
    first_run: datetime | None = None


def _json(text: str | None, default: Any, what: str) -> Any:
    if not text:
        return default
    try:
        return json.loads(text)
    except ValueError:
        raise Skip(f"{what} is not valid JSON: {text[:60]!r}") from None


def _aware(value: Any) -> datetime | None:
    """A stored timestamp as aware UTC (SQLite hands raw SQL naive values or text)."""
    if isinstance(value, str):
        value = parse_datetime(value)
    if isinstance(value, datetime) and value.tzinfo is None:
        value = value.replace(tzinfo=UTC)  # USE_TZ stores UTC
    return value


def _next_on_cadence(last_run: datetime, every: int, now: datetime) -> datetime:
    """The first ``last_run + k * every`` (k >= 1) not before ``now``."""
    step = timedelta(seconds=every)
    periods = max(1, math.ceil((now - last_run) / step))
    return last_run + periods * step


#: PeriodicTask fields with no equivalent here: the dry run names them when they are set.
NOT_CARRIED = ("exchange", "routing_key", "headers", "description")


def _not_carried(row: dict[str, Any]) -> str:
    found = []
    for name in NOT_CARRIED:
        value = row.get(name)
        if value and value != "{}":
            found.append(f"{name}={str(value)[:60]!r}")
    return ", ".join(found)


def _timing(row: dict[str, Any]) -> dict[str, Any]:
    if row["solar_id"] is not None:
        raise Skip("solar schedules are not supported; use a crontab in the local zone")
    if row["clocked_time"] is not None:
        if row["last_run_at"] is not None or (row["total_run_count"] or 0) > 0:
            raise Skip("clocked one-off already ran")
        return {"run_at": _aware(row["clocked_time"])}
    if row["one_off"]:
        raise Skip("one_off on an interval/crontab is not imported; use a clocked schedule")
    if row["every"] is not None:
        unit = PERIOD_SECONDS.get(row["period"])
        if unit is None:
            raise Skip(f"interval period {row['period']!r} is not supported")
        every = int(row["every"]) * unit
        timing: dict[str, Any] = {"interval": every}
        last_run = _aware(row["last_run_at"])
        if last_run is not None:
            # django-celery-beat runs an interval at last_run_at + every: anchor there, so
            # the cadence (and a daily job's time of day) survives the switch.
            timing["start_at"] = _next_on_cadence(last_run, every, SYSTEM_CLOCK.now())
        return timing
    if row["minute"] is not None:
        fields = ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")
        written = {f: str(row[f]).replace(" ", "") for f in fields}
        try:
            # django-celery-beat runs the row as Celery's crontab: converted as beat's are
            # (both day fields restricted: Celery's AND, which cron cannot say, is refused).
            label = f"periodic task {row['name']!r}"
            cron = beat_schedule.crontab_expression(label, crontab(**written))
        except errors.UnsupportedSchedule as exc:
            raise Skip(str(exc)) from None
        except ValueError:  # Celery cannot read it either: validation says what is wrong
            cron = " ".join(written[f] for f in fields)
        return {"cron": cron, "timezone": str(row["timezone"] or "UTC")}
    raise Skip("no schedule attached")


def _utc(value: datetime) -> str:
    return f"{value.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"


def timing_text(plan: Plan) -> str:
    """The timing an import gets, as the report shows it: what runs when, and the first run.

    The line a user checks before switching: an interval keeps its cadence from
    ``last_run_at``, a crontab keeps its zone; both are visible here, not only after the run.
    """
    values = plan.values
    if "cron" in values:
        text = f"cron {values['cron']!r} in {values['timezone']}"
    elif "interval" in values:
        text = f"every {values['interval']} s"
    else:
        text = f"once at {_utc(values['run_at'])}"
    if plan.first_run is not None and "run_at" not in values:
        text += f", first run {_utc(plan.first_run)}"
    return text


def plan_row(row: dict[str, Any]) -> Plan:
    plan = Plan(dcb_id=row["id"], name=row["name"], enabled=bool(row["enabled"]))
    try:
        plan.values = {
            "name": row["name"][:200],
            "task": row["task"],
            "args": _json(row["args"], [], "args"),
            "kwargs": _json(row["kwargs"], {}, "kwargs"),
            "queue": row["queue"] or "",
            "priority": int(row["priority"] or 0),
            "start_at": _aware(row["start_time"]),
            "end_at": _aware(row["expires"]),
            **_timing(row),
        }
        start_time = _aware(row["start_time"])
        current = plan.values.get("start_at")
        if start_time is not None and current is not None and current < start_time:
            plan.values["start_at"] = start_time  # never before django-celery-beat would
        if row["expire_seconds"]:
            plan.values["deadline"] = int(row["expire_seconds"])
        plan.lost = _not_carried(row)
        validation.validate(now=SYSTEM_CLOCK.now(), **plan.values)
    except Skip as skip:
        plan.skip = str(skip)
    except errors.ValidationError as exc:
        plan.skip = str(exc)
    except (ArithmeticError, LookupError, TypeError, ValueError) as exc:
        # A malformed row (written behind django-celery-beat's forms) must cost only itself.
        plan.skip = f"unreadable row ({type(exc).__name__}: {exc})"
    return plan


def _reason(exc: Exception) -> str:
    """Why a row's transaction failed, in one line (a database error without its SQL echo)."""
    if isinstance(exc, errors.ValidationError):
        return str(exc)
    lines = str(exc).splitlines() or [""]
    kept = [lines[0], *(x for x in lines[1:] if x.startswith("DETAIL:"))]
    return f"rejected ({type(exc).__name__}: {'; '.join(x.strip() for x in kept)[:300]})"


class _DryRun(Exception):
    """Roll back a dry run's row transaction after it succeeded."""


class Command(BaseCommand):
    help = "Import django-celery-beat periodic tasks as schedules (idempotent; --dry-run)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="report only; write nothing")
        parser.add_argument("--tenant", default=None, help="tenant slug (default tenant)")

    def handle(self, *args: Any, **options: Any) -> None:
        tables = connection.introspection.table_names()
        if Schedule._meta.db_table not in tables:
            raise CommandError(
                "this scheduler's tables are missing: add 'django_app' to INSTALLED_APPS and "
                "run `python manage.py migrate` first, then import"
            )
        if options["tenant"] is not None:
            try:  # a bad slug is the caller's mistake: say so before anything else
                lifecycle.resolve_tenant(options["tenant"])
            except errors.ValidationError as exc:
                raise CommandError(f"--tenant: {exc}") from exc
        if queries.DCB_PERIODIC_TASK not in tables:
            raise CommandError(
                "django-celery-beat's tables are not in this database "
                "(django_celery_beat_periodictask is missing); nothing to import"
            )
        with connection.cursor() as cursor:
            cursor.execute(queries.dcb_tasks())
            rows = [dict(zip(_COLUMNS, values, strict=True)) for values in cursor.fetchall()]
        dry_run = options["dry_run"]
        verb = "would create" if dry_run else "created"
        counts = {"create": 0, "skip": 0, "exists": 0}
        for row in rows:
            plan = plan_row(row)
            label = f"#{plan.dcb_id} {plan.name!r}"
            outcome = "skip" if plan.skip else self._import(plan, options["tenant"], dry_run)
            counts[outcome] += 1
            if outcome == "skip":
                self.stdout.write(f"skip    {label}: {plan.skip}")
                continue
            state = "" if plan.enabled else " (paused: disabled in django-celery-beat)"
            if plan.lost:
                state += f"; not carried over: {plan.lost}"
            word = verb if outcome == "create" else "exists "
            timing = timing_text(plan)
            self.stdout.write(f"{word} {label}: {plan.values['task']}, {timing}{state}")
        self.stdout.write(
            f"{len(rows)} periodic task(s): {counts['create']} {verb}, "
            f"{counts['exists']} already imported, {counts['skip']} skipped"
            + (" (dry run: nothing written)" if dry_run else "")
        )
        if counts["skip"]:
            raise CommandError(
                f"{counts['skip']} periodic task(s) skipped (the lines starting with 'skip' say "
                "why); fix or remove them in django-celery-beat and run the import again",
                returncode=1,
            )

    def _import(self, plan: Plan, tenant: str | None, dry_run: bool) -> str:
        """One row in one transaction: "create", "exists" or "skip" (reason in ``plan.skip``).

        A dry run goes through the same transaction and rolls it back, so it meets the same
        database errors a real run would.
        """
        outcome = "skip"
        try:
            with transaction.atomic():
                outcome = self._create(plan, tenant)
                if dry_run:
                    raise _DryRun
        except _DryRun:
            pass
        except (errors.SchedulerError, DatabaseError, ArithmeticError, TypeError,
                ValueError) as exc:  # fmt: skip
            plan.skip = _reason(exc)
            outcome = "skip"
        return outcome

    def _create(self, plan: Plan, tenant: str | None) -> str:
        key = f"dcb:{plan.dcb_id}"
        tenant_obj = lifecycle.resolve_tenant(tenant)
        existed = tenant_obj.schedules.filter(idempotency_key=key).exists()
        try:
            with transaction.atomic():
                schedule = lifecycle.create_schedule(
                    tenant=tenant_obj, idempotency_key=key, source="django_celery_beat",
                    audited_by=(ACTOR, ""), **plan.values,
                )  # fmt: skip
        except errors.IdempotencyConflict:
            return "exists"  # imported before, changed since: leave the imported one alone
        if existed:
            return "exists"
        plan.first_run = schedule.next_run_at
        if not plan.enabled:
            audited.pause_schedule(
                schedule.id, actor=ACTOR, reason="disabled in django-celery-beat"
            )
        return "create"
