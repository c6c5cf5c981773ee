"""Tenants: create, change quotas and relay weight, list with usage against each quota.

Quotas are read from the tenant row by the code that enforces them, at the moment it
enforces them (the create transaction locks the row; the claim locks it when it has
``max_running``; the relay and the materializer read it per batch), so a change applies
to the next create, claim, relay batch or materializer pass, with no restart or cache.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Count, Q

from celery_scheduler import errors
from celery_scheduler.api_types import TenantInfo, TenantUsage
from django_app.models import Occurrence, OutboxEntry, Schedule, Tenant
from django_app.querysets import SAME_SLOT
from django_app.schedules import validation
from django_app.schedules.backfill import BACKFILL_VERSION

QUOTA_FIELDS = ("max_schedules", "max_trigger_rate", "max_running", "catchup_rate")
FIELDS = frozenset({"name", "relay_weight", *QUOTA_FIELDS})
#: A quota above this is a typo, not a plan (and must fit a 32-bit column).
MAX_QUOTA = 2_000_000_000
MAX_RELAY_WEIGHT = 1000
_SLUG = re.compile(r"[-a-zA-Z0-9_]{1,64}")


def info(tenant: Tenant) -> TenantInfo:
    return TenantInfo(
        slug=tenant.slug, name=tenant.name, max_schedules=tenant.max_schedules,
        max_trigger_rate=tenant.max_trigger_rate, max_running=tenant.max_running,
        catchup_rate=tenant.catchup_rate, relay_weight=tenant.relay_weight,
        created_at=tenant.created_at,
    )  # fmt: skip


def _validate(values: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(values) - FIELDS)
    if unknown:
        raise errors.ValidationError(
            f"Unknown tenant field(s) {unknown}; allowed: {sorted(FIELDS)}", field=unknown[0]
        )
    out: dict[str, Any] = {}
    if "name" in values:
        out["name"] = validation.checked_text(values["name"], "name", max_length=200)
    for quota in QUOTA_FIELDS:
        if quota in values:
            # 0 is accepted and, like None, means no limit (as the enforcing code reads it).
            out[quota] = validation.optional_int(values[quota], quota, 0, MAX_QUOTA)
    if "relay_weight" in values:
        out["relay_weight"] = validation.bounded_int(
            values["relay_weight"], "relay_weight", default=1, low=1, high=MAX_RELAY_WEIGHT
        )
    return out


def _slug(slug: Any) -> str:
    if not isinstance(slug, str) or not _SLUG.fullmatch(slug):
        raise errors.ValidationError(
            f"slug must be 1-64 letters, digits, '-' or '_', got {slug!r}", field="slug"
        )
    return slug


def create_tenant(slug: str, **values: Any) -> TenantInfo:
    """See :func:`celery_scheduler.api.create_tenant`."""
    slug = _slug(slug)
    fields = _validate(values)
    if not fields.get("name"):  # not given, or "" (the facade's default): the slug
        fields["name"] = slug
    try:
        with transaction.atomic():
            tenant = Tenant.objects.create(slug=slug, **fields)
    except IntegrityError:
        raise errors.ValidationError(f"tenant {slug!r} already exists", field="slug") from None
    return info(tenant)


def _locked(slug: str) -> Tenant:
    tenant = Tenant.objects.select_for_update().filter(slug=slug).first()
    if tenant is None:
        raise errors.ValidationError(f"Unknown tenant {slug!r}", field="tenant")
    return tenant


def update_tenant(slug: str, **changes: Any) -> TenantInfo:
    """See :func:`celery_scheduler.api.update_tenant`."""
    fields = _validate(changes)
    if "name" in fields and not fields["name"]:  # cleared: the default, as at create
        fields["name"] = slug
    with transaction.atomic():
        tenant = _locked(slug)
        for name, value in fields.items():
            setattr(tenant, name, value)
        if fields:
            tenant.save(update_fields=list(fields))
    return info(tenant)


def get_tenant(slug: str) -> TenantInfo:
    tenant = Tenant.objects.filter(slug=slug).first() if isinstance(slug, str) else None
    if tenant is None:
        raise errors.ValidationError(f"Unknown tenant {slug!r}", field="tenant")
    return info(tenant)


#: The window of ``TenantUsage.published_last_minute``.
PUBLISHED_WINDOW = timedelta(seconds=60)


def list_tenants(*, now: datetime, slug: str | None = None) -> list[TenantUsage]:
    """Every tenant (by slug) with its usage: four grouped queries, not four per tenant.

    ``slug``: that tenant's usage alone, each count read from its rows only (what one
    tenant's view costs does not grow with the others' schedules); an unknown slug names
    ``tenant``.
    """
    if slug is None:
        tenants = list(Tenant.objects.order_by("slug"))
    else:
        tenants = list(Tenant.objects.filter(slug=slug))
        if not tenants:
            raise errors.ValidationError(f"Unknown tenant {slug!r}", field="tenant")

    def grouped(qs: Any) -> dict[int, int]:
        return _grouped(qs if slug is None else qs.filter(tenant_id=tenants[0].id))

    schedules = grouped(Schedule.objects.live())
    running = grouped(Occurrence.objects.running_leased(now))
    published = grouped(OutboxEntry.objects.published_since(now - PUBLISHED_WINDOW, now))
    # What catchup_rate paces: a CATCH_UP schedule's late runs and every backfill.
    paced = Q(occurrence__manual=False, occurrence__schedule__misfire_policy="CATCH_UP") | Q(
        occurrence__manual=True, occurrence__schedule_version=BACKFILL_VERSION
    )
    backlog = grouped(
        OutboxEntry.objects.unsent().filter(
            paced, SAME_SLOT, scheduled_for__lt=now, occurrence__scheduled_for__lt=now
        )
    )
    return [
        TenantUsage(
            tenant=info(t),
            schedules=schedules.get(t.id, 0),
            running=running.get(t.id, 0),
            published_last_minute=published.get(t.id, 0),
            catchup_backlog=backlog.get(t.id, 0),
            measured_at=now,
        )
        for t in tenants
    ]


def _grouped(qs: Any) -> dict[int, int]:
    return dict(qs.values_list("tenant_id").annotate(n=Count("id")).order_by())
