"""The create function reads ``max_schedules = 0`` as no limit, like every other reader.

``django_app.tenants`` documents 0, like None, as "no limit" for every quota, and the
other three quotas are read that way; the create function of migration 0023 (and the
portable create and bulk paths, fixed with this migration) refused every create of a
tenant whose ``max_schedules`` was 0. Same function otherwise.
"""

from __future__ import annotations

import importlib
from typing import Any

from django.db import migrations

_CURSOR = importlib.import_module("django_app.migrations.0023_schedule_cursor")

_NULL_ONLY = "        IF o_max_schedules IS NOT NULL THEN\n"
_NULL_OR_ZERO = "        IF coalesce(o_max_schedules, 0) <> 0 THEN\n"


def forward(apps: Any, schema_editor: Any) -> None:
    assert _CURSOR.FUNCTION.count(_NULL_ONLY) == 1, "0023's create function changed"
    _CURSOR._function(apps, schema_editor, _CURSOR.FUNCTION.replace(_NULL_ONLY, _NULL_OR_ZERO))


def backward(apps: Any, schema_editor: Any) -> None:
    _CURSOR.create_function(apps, schema_editor)


class Migration(migrations.Migration):
    dependencies = [
        ("django_app", "0031_claim_waits_out_a_retry"),
    ]

    operations = [migrations.RunPython(forward, backward, elidable=False)]
