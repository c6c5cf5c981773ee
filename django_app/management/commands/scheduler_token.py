"""``manage.py scheduler_token create --tenant SLUG [--name N]`` / ``revoke PREFIX`` / ``list``.

Per-tenant tokens for the HTTP API (docs/howto/http-api.md). ``create`` prints the token once:
only its SHA-256 is stored, so a lost token is revoked and replaced, never recovered.
Exit codes: 0 done, 2 bad arguments (unknown tenant or prefix).
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from celery_scheduler import errors
from django_app.http import tokens
from django_app.models import ApiToken


class Command(BaseCommand):
    help = "Create, revoke or list the per-tenant API tokens of the HTTP API."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="issue a token (printed once)")
        create.add_argument("--tenant", required=True, help="tenant slug")
        create.add_argument("--name", default="", help="what the token is for")
        create.add_argument("--json", action="store_true")
        revoke = sub.add_parser("revoke", help="revoke a token by its prefix")
        revoke.add_argument("prefix", help="the 8 characters after 'cs_' (or the whole token)")
        listing = sub.add_parser("list", help="tokens (prefix, tenant, name; never secrets)")
        listing.add_argument("--tenant", help="only this tenant's")
        listing.add_argument("--json", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            getattr(self, f"_{options['action']}")(options)
        except errors.ValidationError as exc:
            raise CommandError(f"--{exc.field or 'tenant'}: {exc}", returncode=2) from exc

    def _create(self, options: dict[str, Any]) -> None:
        issued = tokens.issue(options["tenant"], options["name"])
        if options["json"]:
            self.stdout.write(json.dumps({
                "token": issued.secret, "prefix": issued.token.prefix,
                "tenant": options["tenant"], "name": issued.token.name,
            }))  # fmt: skip
            return
        self.stdout.write(issued.secret)
        self.stderr.write(
            f"token {issued.token.prefix} for tenant {options['tenant']}: shown once, "
            "keep it secret (only its hash is stored)"
        )

    def _revoke(self, options: dict[str, Any]) -> None:
        try:
            token = tokens.revoke(options["prefix"])
        except errors.ValidationError as exc:
            raise CommandError(str(exc), returncode=2) from exc
        self.stdout.write(f"revoked {token.prefix} (tenant {token.tenant.slug})")

    def _list(self, options: dict[str, Any]) -> None:
        rows = ApiToken.objects.select_related("tenant").order_by("tenant__slug", "created_at")
        if options["tenant"]:
            rows = rows.filter(tenant__slug=options["tenant"])
        data = [
            {
                "prefix": t.prefix, "tenant": t.tenant.slug, "name": t.name,
                "created_at": t.created_at.isoformat(),
                "last_used_at": t.last_used_at.isoformat() if t.last_used_at else None,
                "revoked": t.revoked_at is not None,
            }
            for t in rows
        ]  # fmt: skip
        if options["json"]:
            self.stdout.write(json.dumps(data))
            return
        for row in data:
            state = "revoked" if row["revoked"] else "live"
            self.stdout.write(f"{row['prefix']}  {row['tenant']:<20} {state:<8} {row['name']}")
