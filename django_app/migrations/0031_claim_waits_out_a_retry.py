"""The one-statement claim leaves a run waiting out its retry's backoff to the portable path.

``django_app_claim()`` (migration 0025) claimed a RETRY_WAIT occurrence whatever its
``retry_at``: a second message of a run that had just failed (a copy the redelivery sent
while the queue was slow, a retry message read by a worker whose clock lags the relay's)
ran the next attempt at once, before the backoff. Such a claim now answers ``fallback``
before writing anything, and the portable claim (``django_app.worker.claim``) defers it
to ``retry_at``. Same function otherwise; the rare case costs one more round trip.
"""

from __future__ import annotations

import importlib
from typing import Any

from django.db import migrations

_BY_KEY = importlib.import_module("django_app.migrations.0025_claim_complete_by_key")

#: The state check of 0025's function, and the same with the backoff added.
_STATE_CHECK = "    IF NOT FOUND OR o.state NOT IN ('SCHEDULED', 'ENQUEUED', 'RETRY_WAIT')\n"
_WITH_BACKOFF = _STATE_CHECK + "       OR (o.state = 'RETRY_WAIT' AND o.retry_at > p_now)\n"


def forward(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    assert _BY_KEY.CLAIM.count(_STATE_CHECK) == 1, "0025's claim function changed"
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(_BY_KEY.CLAIM.replace(_STATE_CHECK, _WITH_BACKOFF))


def backward(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(_BY_KEY.CLAIM)


class Migration(migrations.Migration):
    dependencies = [
        ("django_app", "0030_pruned_history_passed_over"),
    ]

    operations = [migrations.RunPython(forward, backward, elidable=False)]
