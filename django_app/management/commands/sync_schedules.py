"""``manage.py sync_schedules <file.json> [--tenant SLUG] [--prune] [--reason TEXT] [--json]``.

Makes the tenant's schedules match a JSON file (schedules as code): a list of
``create_schedule`` items, each with its ``idempotency_key``, or ``{"items": [...]}``.
Thin over :func:`celery_scheduler.api.sync_schedules`: one transaction, all or nothing.
Datetimes are ISO 8601 strings with an offset. Exit codes: 0 done, 1 refused (a key
conflict, the quota), 2 bad input (the message names ``items[<index>].<field>``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from celery_scheduler import api, errors
from celery_scheduler.api_types import as_json


class Command(BaseCommand):
    help = "Create, update (and with --prune cancel) schedules to match a JSON file."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "file", help='JSON: a list of schedules or {"items": [...]}; - reads stdin'
        )
        parser.add_argument("--tenant", help="tenant slug (default: the default tenant)")
        parser.add_argument(
            "--prune",
            action="store_true",
            help="also cancel the tenant's sync-made schedules whose key is not in the file",
        )
        parser.add_argument("--reason", help="why, for the audit trail")
        parser.add_argument("--json", action="store_true", help="print the report as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        items = _load(options["file"])
        try:
            report = api.sync_schedules(
                items,
                tenant=options["tenant"],
                prune=options["prune"],
                actor="manage.py sync_schedules",
                reason=options["reason"],
            )
        except errors.ValidationError as exc:
            raise CommandError(
                f"{exc.field}: {exc}" if exc.field else str(exc), returncode=2
            ) from None
        except (errors.IdempotencyConflict, errors.QuotaExceeded) as exc:
            raise CommandError(str(exc), returncode=1) from None
        if options["json"]:
            self.stdout.write(json.dumps(as_json(report), indent=2))
            return
        for outcome in ("created", "updated", "unchanged", "stopped", "pruned"):
            keys = getattr(report, outcome)
            shown = ", ".join(keys[:10]) + (f" (+{len(keys) - 10} more)" if len(keys) > 10 else "")
            self.stdout.write(f"{outcome}: {len(keys)}" + (f"  {shown}" if keys else ""))


def _load(name: str) -> list[Any]:
    try:
        text = sys.stdin.read() if name == "-" else Path(name).read_text(encoding="utf-8")
        data = json.loads(text)
    except (OSError, ValueError) as exc:
        raise CommandError(f"{name}: {exc}", returncode=2) from None
    if isinstance(data, dict) and set(data) == {"items"}:
        data = data["items"]
    if not isinstance(data, list):
        raise CommandError(
            f'{name}: expected a JSON list of schedules or {{"items": [...]}}', returncode=2
        )
    return data
