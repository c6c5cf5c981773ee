"""The tenant-namespace migration places existing rows where the new code looks for them.

Rows written under the old schema (global idempotency keys, global slot keys) are migrated:
a record of a scheduled run goes to its occurrence's tenant, a ``.delay()`` record to the
default namespace; a held slot to its holder's tenant, free slot rows are dropped (the claim
recreates them). Runs on SQLite and PostgreSQL (where the data step must not leave pending
trigger events before the next ALTER TABLE).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from django_app import conf
from django_app.db import partitions

MIGRATION = "0003_tenant_namespaces_parked"
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _history_partitioned_again() -> Iterator[None]:
    """Migrating back and forth with rows in the tables leaves them plain on PostgreSQL
    (migration 0020 partitions only empty tables): partition them again, emptied, so the
    tests that run after this one in the same database get a fresh install's tables."""
    yield
    cfg = conf.get()
    if connection.vendor != "postgresql" or not cfg.partitioned_history:
        return
    if partitions.is_partitioned():
        return
    names = ", ".join(connection.ops.quote_name(t) for t in partitions.tables())
    with connection.cursor() as cur:
        cur.execute(f"TRUNCATE {names} CASCADE")
    partitions.partition_empty_tables(
        datetime.now(UTC),
        width=timedelta(hours=cfg.partition_width_hours),
        ahead=cfg.partitions_ahead,
    )
    assert partitions.is_partitioned()


@pytest.mark.django_db(transaction=True)
def test_existing_slots_and_records_get_their_tenant() -> None:
    executor = MigrationExecutor(connection)
    target = ("django_app", MIGRATION)
    (parent,) = [d for d in executor.loader.graph.node_map[target].parents if d[0] == "django_app"]
    executor.migrate([parent.key])
    apps = executor.loader.project_state([parent.key]).apps
    tenant_model = apps.get_model("django_app", "Tenant")
    schedule_model = apps.get_model("django_app", "Schedule")
    occurrence_model = apps.get_model("django_app", "Occurrence")
    slot_model = apps.get_model("django_app", "ConcurrencySlot")
    record_model = apps.get_model("django_app", "IdempotencyRecord")
    globex = tenant_model.objects.create(slug="globex")
    schedule = schedule_model.objects.create(
        tenant=globex, name="s", task="billing.ping", kind="CRON", cron="* * * * *"
    )
    occ = occurrence_model.objects.create(
        id=uuid.uuid4(), schedule=schedule, schedule_version=1, tenant=globex,
        scheduled_for=NOW, available_at=NOW, state="RUNNING",
    )  # fmt: skip
    slot_model.objects.create(key="reports", slot=0, owner=f"{occ.id}#1", occurrence_id=occ.id)
    slot_model.objects.create(key="reports", slot=1)
    record_model.objects.create(key="invoice:1", task_name="t", occurrence_id=occ.id)
    record_model.objects.create(key="invoice:2", task_name="t")

    executor = MigrationExecutor(connection)
    executor.migrate([target])
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())

    from django_app.models import ConcurrencySlot, IdempotencyRecord

    assert list(ConcurrencySlot.objects.values_list("tenant_id", "key", "slot", "owner")) == [
        (globex.pk, "reports", 0, f"{occ.id}#1")
    ]
    assert dict(IdempotencyRecord.objects.values_list("key", "tenant_id")) == {
        "invoice:1": globex.pk,
        "invoice:2": None,
    }
