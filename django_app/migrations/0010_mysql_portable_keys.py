"""MySQL 8 / MariaDB: the portable equivalents of the models' conditional unique keys.

MySQL and MariaDB have no partial indexes, and Django silently creates nothing for a
conditional ``UniqueConstraint`` there (system check models.W036). Without this migration two
default-namespace idempotency records could share a key (an effect done twice). (Conditional
plain indexes are created without their condition there, which serves the due scans.) On
MySQL/MariaDB only (a no-op elsewhere, where the conditional versions exist):

- ``schedule (tenant_id, idempotency_key)``: a plain unique key. NULLs never collide in a
  MySQL unique key, which is exactly the condition ``idempotency_key IS NOT NULL``.
- ``idempotencyrecord``: a stored generated column ``namespace_id = COALESCE(tenant_id, 0)``
  (tenant ids start at 1) and one unique key on (namespace_id, task_name, key): the tenant's
  namespace and the default one (tenant NULL) in one key. Django never writes the column.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

FORWARD = [
    "ALTER TABLE django_app_schedule ADD CONSTRAINT schedule_tenant_idem_key_uniq_my "
    "UNIQUE (tenant_id, idempotency_key)",
    "ALTER TABLE django_app_idempotencyrecord ADD COLUMN namespace_id bigint "
    "GENERATED ALWAYS AS (COALESCE(tenant_id, 0)) STORED",
    "ALTER TABLE django_app_idempotencyrecord ADD CONSTRAINT idempotency_ns_task_key_uniq_my "
    "UNIQUE (namespace_id, task_name, `key`)",
]

BACKWARD = [
    "ALTER TABLE django_app_idempotencyrecord DROP INDEX idempotency_ns_task_key_uniq_my",
    "ALTER TABLE django_app_idempotencyrecord DROP COLUMN namespace_id",
    "ALTER TABLE django_app_schedule DROP INDEX schedule_tenant_idem_key_uniq_my",
]


def _run(statements: list[str]) -> Any:
    def run(apps: Any, schema_editor: Any) -> None:
        if schema_editor.connection.vendor != "mysql":
            return
        for sql in statements:
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [("django_app", "0009_api_tokens")]

    # atomic=False: MySQL cannot run DDL inside a transaction (it commits implicitly).
    operations = [
        migrations.RunPython(_run(FORWARD), _run(BACKWARD), atomic=False, elidable=False)
    ]
