"""Outcome writes and claims reconnect after the worker's database connection was killed.

In-process and on PostgreSQL: ``pg_terminate_backend`` from a second connection, then an
ordinary autocommit query meets the dead backend first (as task code does), which leaves
Django's connection object broken. (The acceptance test
``tests/acceptance/test_worker_connection_kill.py`` does the same to a real worker process.)
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from django.db import DatabaseError, connection

from celery_scheduler import errors
from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.core.enums import OccurrenceState as S
from django_app.models import Occurrence
from django_app.tasks import _finish
from django_app.worker import claim, finish
from tests.acceptance.support import database_url
from tests.integration.worker_support import make_occurrence, make_schedule

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def break_connection() -> None:
    """Kill this thread's backend from another connection; let a plain query meet it."""
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    with psycopg.connect(database_url(), autocommit=True) as killer:
        killer.execute("SELECT pg_terminate_backend(%s)", [pid])
    with pytest.raises(DatabaseError):
        Occurrence.objects.exists()


def test_outcome_write_reconnects_after_the_connection_was_killed(
    tenant: Any, frozen_clock: FrozenClock
) -> None:
    occ = make_occurrence(make_schedule(tenant), frozen_clock.now())
    claimed = claim.claim(occ.id, worker="w", clock=frozen_clock)
    assert claimed.fencing_token is not None
    token = claimed.fencing_token
    break_connection()
    before = frozen_clock.now()
    ok = _finish(
        "completion",
        lambda: finish.complete(occ.id, token, {"ok": 1}, clock=frozen_clock),
        str(occ.id),
        frozen_clock,
    )
    assert ok
    assert Occurrence.objects.get(pk=occ.pk).state == S.SUCCEEDED
    assert (frozen_clock.now() - before).total_seconds() <= 1  # one back-off, not three


def test_claim_on_a_killed_connection_leaves_a_fresh_one_for_the_retry(
    tenant: Any, frozen_clock: FrozenClock
) -> None:
    occ = make_occurrence(make_schedule(tenant), frozen_clock.now())
    break_connection()
    with pytest.raises(errors.CoordinationUnavailable):
        claim.claim(occ.id, worker="w", clock=frozen_clock)
    assert claim.claim(occ.id, worker="w", clock=frozen_clock).claimed


def test_a_kept_connection_broken_by_a_task_does_not_fail_the_next_claim(
    tenant: Any, frozen_clock: FrozenClock
) -> None:
    """Workers keep their connection across tasks (CELERY_DB_REUSE_MAX): a body that met a
    killed backend must not leave the next run's claim to fail and wait for a retry."""
    from celery import Celery

    from django_app.tasks import execute

    app = Celery("kept-connection", set_as_current=False)

    @app.task(name="kept.ok")
    def ok() -> dict[str, bool]:
        return {"ok": True}

    occ = make_occurrence(make_schedule(tenant), frozen_clock.now())
    break_connection()  # what the previous task's body left behind
    outcome = execute(app, str(occ.id), "kept.ok", [], {}, worker_name="w", clock=frozen_clock)
    assert outcome["outcome"] == "SUCCEEDED"
    assert Occurrence.objects.get(pk=occ.pk).state == S.SUCCEEDED
