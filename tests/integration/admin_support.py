"""Fixtures shared by the admin tests (test client and browser): tenants, users, schedules.

Two tenants, ``acme`` and ``globex``; a superuser; one staff user per tenant with every
django_app model permission; a view-only acme user; a staff user with no tenant.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest

from celery_scheduler.core.clock import SYSTEM_CLOCK

PASSWORD = "correct horse battery staple"
TASK = "billing.ping"


@pytest.fixture
def tenants(db: None) -> dict[str, Any]:
    from django_app.models import Tenant

    return {
        slug: Tenant.objects.create(slug=slug, name=slug.title()) for slug in ("acme", "globex")
    }


def make_user(
    username: str, *, tenant: Any = None, perms: tuple[str, ...] = ("view", "add", "change"),
    superuser: bool = False,
) -> Any:  # fmt: skip
    from django.contrib.auth.models import Permission, User

    from django_app.models import TenantMembership

    if superuser:
        return User.objects.create_superuser(username, f"{username}@example.com", PASSWORD)
    user = User.objects.create_user(username, f"{username}@example.com", PASSWORD, is_staff=True)
    codenames = [
        f"{perm}_{model}"
        for perm in perms
        for model in ("schedule", "occurrence", "attempt", "outboxentry")
    ]
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="django_app", codename__in=codenames)
    )
    if tenant is not None:
        TenantMembership.objects.create(user=user, tenant=tenant)
    return user


@pytest.fixture
def users(tenants: dict[str, Any], settings: Any) -> dict[str, Any]:
    # The default PBKDF2 costs ~0.5 s per user; these tests are about permissions, not hashing.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    return {
        "root": make_user("root", superuser=True),
        "acme": make_user("alice", tenant=tenants["acme"]),
        "globex": make_user("gary", tenant=tenants["globex"]),
        "viewer": make_user("vera", tenant=tenants["acme"], perms=("view",)),
        "loner": make_user("lou"),
    }


@pytest.fixture
def login(client: Any, users: dict[str, Any]) -> Callable[[str], Any]:
    def as_user(key: str) -> Any:
        client.force_login(users[key])
        return client

    return as_user


@pytest.fixture
def make_schedule(tenants: dict[str, Any]) -> Callable[..., Any]:
    from celery_scheduler import api

    def make(tenant: str = "acme", **fields: Any) -> Any:
        values: dict[str, Any] = {"name": f"job-{uuid.uuid4().hex[:6]}", "task": TASK}
        if not {"cron", "interval", "run_at"} & set(fields):
            values["cron"] = "*/5 * * * *"
        values.update(fields)
        return api.create_schedule(tenant=tenants[tenant], **values)

    return make


def add_occurrence(
    schedule: Any, *, state: str = "SUCCEEDED", minutes_ago: float = 5, lag: float | None = 0.5,
    now: datetime | None = None, error: str = "",
) -> Any:  # fmt: skip
    """An occurrence row as the data plane would leave it (no API creates history)."""
    from celery_scheduler.core import ids
    from django_app.models import Occurrence

    now = now or SYSTEM_CLOCK.now()
    scheduled_for = (now - timedelta(minutes=minutes_ago)).replace(microsecond=0)
    return Occurrence.objects.create(
        id=ids.occurrence_id(schedule.id, schedule.version, scheduled_for),
        schedule=schedule, schedule_version=schedule.version, tenant=schedule.tenant,
        scheduled_for=scheduled_for, available_at=scheduled_for, state=state,
        enqueued_at=None if lag is None else scheduled_for + timedelta(seconds=lag),
        attempt_count=1 if state not in ("SCHEDULED", "ENQUEUED") else 0, last_error=error,
    )  # fmt: skip
