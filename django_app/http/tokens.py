"""Per-tenant API tokens: issue, check, revoke. Only a SHA-256 of each secret is stored.

A token reads ``cs_<prefix>.<secret>``: the prefix (8 hex characters, public) finds one row
by its unique index, then the secret's digest is compared with :func:`hmac.compare_digest`.
The secret has 256 bits from :mod:`secrets`, so a plain (unsalted) SHA-256 is enough: there
is nothing to brute-force that a slow hash would protect.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from django.utils import timezone

from celery_scheduler import errors
from django_app.models import ApiToken, Tenant
from django_app.schedules.lifecycle import resolve_tenant

PREFIX = "cs_"


@dataclass(frozen=True)
class IssuedToken:
    """A new token; ``secret`` is the whole token to give the client, shown once."""

    token: ApiToken
    secret: str


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def issue(tenant: Tenant | str, name: str = "") -> IssuedToken:
    """Create a token for ``tenant`` (object or slug) and return its one-time secret.

    An unknown slug is a ``ValidationError`` on ``tenant``, except the ``default_tenant``
    setting's, which is created as ``create_schedule`` would.
    """
    # The same rule as creating a schedule: the default tenant exists on first use.
    tenant = resolve_tenant(tenant)
    if len(name) > 200:
        raise errors.ValidationError("name is longer than 200 characters", field="name")
    token = ApiToken(tenant=tenant, name=name)
    secret = fill(token)
    token.save(force_insert=True)
    return IssuedToken(token=token, secret=secret)


def fill(token: ApiToken) -> str:
    """Give an unsaved token a fresh prefix and digest; returns the whole secret token."""
    while True:
        prefix = secrets.token_hex(4)
        if not ApiToken.objects.filter(prefix=prefix).exists():
            break
    secret = secrets.token_urlsafe(32)
    token.prefix, token.digest = prefix, digest(secret)
    return f"{PREFIX}{prefix}.{secret}"


def check(raw: str) -> ApiToken | None:
    """The live token ``raw`` stands for, else None (malformed, unknown, wrong or revoked)."""
    if not raw.startswith(PREFIX) or "." not in raw:
        return None
    prefix, _, secret = raw[len(PREFIX) :].partition(".")
    token = (
        ApiToken.objects.select_related("tenant")
        .filter(prefix=prefix, revoked_at__isnull=True)
        .first()
    )
    # Compare even when no row matched, so timing does not tell a known prefix apart.
    expected = token.digest if token is not None else digest("")
    if not hmac.compare_digest(expected, digest(secret)) or token is None:
        return None
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now())
    return token


def revoke(prefix: str) -> ApiToken:
    """Revoke the token with this prefix (the ``cs_`` and the secret may be included)."""
    prefix = prefix.removeprefix(PREFIX).partition(".")[0]
    token = ApiToken.objects.filter(prefix=prefix).first()
    if token is None:
        raise errors.ValidationError(f"No API token with prefix {prefix!r}", field="prefix")
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
    return token
