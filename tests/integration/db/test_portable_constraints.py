"""The unique keys and hot-path indexes hold on every database, MySQL/MariaDB included.

The models declare some as *conditional* (partial) constraints and indexes. MySQL and MariaDB
have no partial indexes: Django silently creates no conditional unique constraint there (system
check W036), which would let two default-namespace idempotency records share a key, and creates
conditional plain indexes without their condition. Migration 0010 adds the portable unique keys
on MySQL/MariaDB; these tests hold on every backend.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction

from django_app.models import IdempotencyRecord, OutboxEntry, Schedule, ScheduleCursor
from tests.integration.worker_support import make_schedule

pytestmark = pytest.mark.django_db


def test_default_namespace_idempotency_key_is_unique() -> None:
    IdempotencyRecord.objects.create(tenant=None, task_name="t.charge", key="k1")
    with pytest.raises(IntegrityError), transaction.atomic():
        IdempotencyRecord.objects.create(tenant=None, task_name="t.charge", key="k1")
    # Another task or another case of the key is another effect.
    IdempotencyRecord.objects.create(tenant=None, task_name="t.other", key="k1")
    IdempotencyRecord.objects.create(tenant=None, task_name="t.charge", key="K1")


def test_tenant_namespace_idempotency_key_is_unique(tenant: Any) -> None:
    IdempotencyRecord.objects.create(tenant=tenant, task_name="t.charge", key="k1")
    with pytest.raises(IntegrityError), transaction.atomic():
        IdempotencyRecord.objects.create(tenant=tenant, task_name="t.charge", key="k1")
    IdempotencyRecord.objects.create(tenant=None, task_name="t.charge", key="k1")


def test_schedule_idempotency_key_is_unique_per_tenant_and_null_never_collides(
    tenant: Any,
) -> None:
    first = make_schedule(tenant)
    second = make_schedule(tenant)
    assert first.idempotency_key is None
    assert second.idempotency_key is None
    Schedule.objects.filter(pk=first.pk).update(idempotency_key="create-1")
    with pytest.raises(IntegrityError), transaction.atomic():
        Schedule.objects.filter(pk=second.pk).update(idempotency_key="create-1")
    Schedule.objects.filter(pk=second.pk).update(idempotency_key="Create-1")


def _indexed_column_lists(model: type[Any]) -> list[list[str]]:
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, model._meta.db_table)
    return [c["columns"] for c in found.values() if c["index"] or c["unique"]]


@pytest.mark.parametrize(
    ("model", "columns"),
    [
        (ScheduleCursor, ["shard", "next_run_at"]),
        (OutboxEntry, ["available_at"]),
        (OutboxEntry, ["shard", "available_at"]),
    ],
)
def test_hot_path_indexes_exist(model: type[Any], columns: list[str]) -> None:
    """The due scans of the materializer and the relays have an index on every backend."""
    # Partial indexes on PostgreSQL/SQLite; on MySQL Django creates them without the condition.
    assert columns in _indexed_column_lists(model)
