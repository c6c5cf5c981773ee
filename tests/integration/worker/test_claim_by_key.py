"""The worker's claim and completion find the occurrence by its partition key (PostgreSQL).

On the partitioned history tables an occurrence id is unique only with ``scheduled_for``:
a lookup by id alone probes every populated slot, so a run's cost would grow with the
retention window. The message carries the time; the claim takes it, the completion takes
it from the claim. What a run reads must not grow with the number of populated slots, and
a missing or wrong time must still claim the right row.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from celery import Celery
from django.db import connection

from celery_scheduler import idempotent_task
from celery_scheduler.core.clock import FrozenClock
from django_app import tasks
from django_app.db import partitions
from django_app.models import Occurrence, Schedule
from django_app.worker import claim, claim_pg, queries
from tests.integration.worker_support import make_occurrence, make_schedule, message_kwargs

pytestmark = [pytest.mark.django_db, pytest.mark.postgres]
DAY = timedelta(days=1)
LEASE = timedelta(seconds=30)
NOW = datetime(2034, 3, 15, 12, 0, tzinfo=UTC)
#: Past daily slots that get history in the second half of the test.
SLOTS = 12
#: The time the run's calls are given (the message's, as the worker passes it).
KEY: datetime | None = NOW

app = Celery("claim-by-key-tests", set_as_current=False)


@app.task(name="tests.claim_by_key.plain")
def plain() -> int:
    return 1


@idempotent_task(app=app, name="tests.claim_by_key.once")
def once() -> int:
    return 2


def _fill(schedule: Schedule, day: datetime, rows: int = 300) -> None:
    """``rows`` finished occurrences and their attempts in ``day``'s slot."""
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO django_app_occurrence (id, schedule_id, schedule_version, tenant_id, "
            "scheduled_for, available_at, state, manual, overlap_policy, attempt_count, "
            "fencing_token, lease_owner, created_at, last_error, reason) "
            "SELECT gen_random_uuid(), %s, 1, %s, t, t, 'SUCCEEDED', true, '', 1, 1, '', t, "
            "'', '' FROM generate_series(1, %s) g, "
            "LATERAL (SELECT %s::timestamptz + g * interval '1 second' AS t) x",
            [schedule.pk, schedule.tenant_id, rows, day],
        )
        cur.execute(
            "INSERT INTO django_app_attempt (occurrence_id, scheduled_for, number, "
            "fencing_token, worker, started_at, finished_at, outcome, error) "
            "SELECT id, scheduled_for, 1, 1, 'h', scheduled_for, scheduled_for, 'SUCCEEDED', "
            "'' FROM django_app_occurrence WHERE schedule_id = %s AND scheduled_for >= %s "
            "AND scheduled_for < %s",
            [schedule.pk, day, day + DAY],
        )


def _buffers(sql: str, params: dict[str, Any]) -> int:
    """Shared buffers the statement touched, its function's statements included."""
    with connection.cursor() as cur:
        cur.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", params)
        plan = cur.fetchone()[0][0]["Plan"]
    return int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0))


def _run(occ: Occurrence, key: datetime | None, generic: bool) -> tuple[int, int]:
    """(buffers of the claim, buffers of the completion) for one run of ``occ``."""
    now = NOW + timedelta(seconds=1)
    claimed = _buffers(
        queries.CLAIM,
        {
            "id": occ.id, "scheduled_for": key, "worker": "w", "now": now, "lease": LEASE,
            "generic": generic,
        },
    )  # fmt: skip
    token = Occurrence.objects.values_list("fencing_token", flat=True).get(pk=occ.pk)
    completed = _buffers(
        queries.COMPLETE,
        {
            "id": occ.id, "scheduled_for": key, "token": token, "now": now,
            "result": json.dumps({"ok": 1}), "owner": f"{occ.id}:{token}",
            "state": "SUCCEEDED", "running": "RUNNING", "outcome": "SUCCEEDED",
            "generic": generic,
        },
    )  # fmt: skip
    assert Occurrence.objects.get(pk=occ.pk).state == "SUCCEEDED"
    return claimed, completed


@pytest.mark.parametrize("generic", [True, False], ids=["kept-session", "first-call"])
def test_a_run_reads_as_much_with_twelve_more_history_slots(tenant: Any, generic: bool) -> None:
    partitions.ensure(NOW, width=DAY, ahead=1, wait=True)
    occs = [make_occurrence(make_schedule(tenant), NOW) for _ in range(4)]
    _run(occs[0], KEY, generic)  # the session's first calls plan the functions' statements
    before = _run(occs[1], KEY, generic)
    partitions.ensure(NOW, width=DAY, ahead=1, behind=SLOTS, wait=True)
    history = make_schedule(tenant)
    for days in range(1, SLOTS + 1):
        _fill(history, NOW.replace(hour=0) - days * DAY)
    _run(occs[2], KEY, generic)  # new partitions: the plans are made again
    after = _run(occs[3], KEY, generic)
    # By id alone, each of the run's lookups descends the id index of every slot: a dozen
    # more slots cost a dozen more descents per lookup (the cost this guards against).
    assert after[0] - before[0] <= 4, (before, after)
    assert after[1] - before[1] <= 4, (before, after)


def test_a_claim_without_the_time_or_with_a_wrong_one_still_claims_its_row(
    tenant: Any, frozen_clock: FrozenClock
) -> None:
    at = frozen_clock.now()
    unkeyed = make_occurrence(make_schedule(tenant), at)
    found = claim_pg.claim(unkeyed.id, None, "w", at, LEASE)
    assert found is not None
    assert found.scheduled_for == at
    wrong = make_occurrence(make_schedule(tenant), at)
    assert claim_pg.claim(wrong.id, at + timedelta(minutes=1), "w", at, LEASE) is None
    result = claim.claim(wrong.id, worker="w", clock=frozen_clock, lease=LEASE,
                         scheduled_for=at + timedelta(minutes=1))  # fmt: skip
    assert result.claimed  # by the portable path, which reads the row by id
    assert result.scheduled_for == at


def test_the_worker_claims_with_the_messages_time_and_completes_with_the_claims(
    tenant: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = datetime.now(UTC).replace(microsecond=0)
    occ = make_occurrence(make_schedule(tenant, task="tests.claim_by_key.plain"), at)
    keys: list[Any] = []
    real_claim, real_complete = claim_pg.claim, tasks.finish.complete

    def claim_spy(occ_id: Any, key: Any, *rest: Any) -> Any:
        keys.append(key)
        return real_claim(occ_id, key, *rest)

    def complete_spy(*args: Any, **kwargs: Any) -> None:
        keys.append(kwargs["scheduled_for"])
        real_complete(*args, **kwargs)

    monkeypatch.setattr(claim_pg, "claim", claim_spy)
    monkeypatch.setattr(tasks.finish, "complete", complete_spy)
    message = message_kwargs(occ)
    outcome = tasks.execute(
        app, str(occ.id), "tests.claim_by_key.plain", [], {}, worker_name="w", message=message
    )
    assert outcome["outcome"] == "SUCCEEDED", outcome
    assert keys == [at, at]


@pytest.mark.django_db(transaction=True)  # so that close() ends the session
def test_generic_plans_only_once_a_session_ran_the_function_before() -> None:
    connection.ensure_connection()
    connection.close()
    connection.ensure_connection()  # a new session, as after a task on Celery's defaults
    assert [claim_pg.generic_plans("claim") for _ in range(3)] == [False, True, True]
    assert claim_pg.generic_plans("complete") is False  # each function's own first call
    connection.close()
    connection.ensure_connection()
    assert claim_pg.generic_plans("claim") is False


def test_a_message_whose_time_is_not_the_rows_still_runs_and_commits_its_effect(
    tenant: Any,
) -> None:
    """The claim falls back to the lookup by id; the fence of ``@idempotent_task`` then
    takes the row's time from the claim, not the message's (else it would find no row and
    roll the effect back as stale)."""
    at = datetime.now(UTC).replace(microsecond=0)
    occ = make_occurrence(make_schedule(tenant, task="tests.claim_by_key.once"), at)
    message = {**message_kwargs(occ), "scheduled_for": (at + timedelta(seconds=1)).isoformat()}
    outcome = tasks.execute(
        app, str(occ.id), "tests.claim_by_key.once", [], {}, worker_name="w", message=message,
        body=lambda: once(),
    )  # fmt: skip
    assert outcome["outcome"] == "SUCCEEDED", outcome
    assert Occurrence.objects.get(pk=occ.pk).state == "SUCCEEDED"


def test_workers_of_the_previous_version_still_claim_and_complete_during_an_upgrade(
    tenant: Any, frozen_clock: FrozenClock
) -> None:
    """Migration 0025 adds the keyed functions beside 0021's and 0022's: a worker not yet
    restarted calls the old signatures, which must still be there and work."""
    at = frozen_clock.now()
    occ = make_occurrence(make_schedule(tenant), at)
    claim_args: list[Any] = [occ.id, "old-worker", at, LEASE]
    with connection.cursor() as cur:
        cur.execute("SELECT o_outcome, o_token FROM django_app_claim(%s, %s, %s, %s)", claim_args)
        outcome, token = cur.fetchone()
        cur.execute(
            "SELECT o_moved FROM django_app_complete(%s, %s, %s, %s::jsonb, %s, %s, %s, %s)",
            [occ.id, token, at, "1", f"{occ.id}:{token}", "SUCCEEDED", "RUNNING", "SUCCEEDED"],
        )
        (moved,) = cur.fetchone()
    assert (outcome, moved) == ("claimed", 1)
    assert Occurrence.objects.get(pk=occ.pk).state == "SUCCEEDED"
