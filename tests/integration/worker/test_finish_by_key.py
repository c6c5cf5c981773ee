"""Heartbeats and failures find the run's rows by their partition key (PostgreSQL).

The claim and the completion read one history slot (test_claim_by_key.py); a renewal, a
failure and its retry's outbox reset looked the occurrence, its attempt and its outbox row
up by id alone, which on the partitioned tables scans the id index of every slot of the
retention window. They now take the claim's ``scheduled_for`` (the row's own). What they
scan is counted from ``pg_stat_xact_user_tables`` (this transaction's scans per table).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from celery import Celery

from celery_scheduler.core.clock import SYSTEM_CLOCK, FrozenClock
from django_app import tasks
from django_app.db import partitions
from django_app.models import Attempt, Occurrence, OutboxEntry
from django_app.worker import claim, finish, heartbeat
from tests.integration.worker_support import (
    make_occurrence,
    make_schedule,
    message_kwargs,
    partitions_scanned,
)

pytestmark = [pytest.mark.django_db, pytest.mark.postgres]
DAY = timedelta(days=1)
LEASE = timedelta(seconds=30)
#: Past daily slots: without the key a lookup scans each one's id index.
SLOTS = 6

app = Celery("finish-by-key-tests", set_as_current=False)


@app.task(name="tests.finish_by_key.boom")
def boom() -> None:
    raise RuntimeError("boom")


def _claimed(tenant: Any, clock: FrozenClock, **schedule: Any) -> claim.ClaimResult:
    partitions.ensure(clock.now(), width=DAY, ahead=1, behind=SLOTS, wait=True)
    occ = make_occurrence(make_schedule(tenant, **schedule), clock.now())
    result = claim.claim(
        occ.id, worker="w", clock=clock, lease=LEASE, scheduled_for=occ.scheduled_for
    )
    assert result.claimed
    assert result.scheduled_for == occ.scheduled_for
    return result


def _one_slot_each(touched: dict[str, set[str]], at: datetime) -> None:
    slot = f"p{at:%Y%m%d}"
    for table, names in touched.items():
        assert names == {f"{table}_{slot}"}, touched


def test_a_renewal_reads_the_runs_slot_only(tenant: Any, frozen_clock: FrozenClock) -> None:
    run = _claimed(tenant, frozen_clock)

    def renew() -> None:
        assert run.fencing_token is not None
        finish.renew(
            run.occurrence_id, run.fencing_token, clock=frozen_clock, lease=LEASE,
            scheduled_for=run.scheduled_for, holds_slot=run.slot is not None,
        )  # fmt: skip

    touched = partitions_scanned(renew)
    assert set(touched) == {"django_app_occurrence", "django_app_attempt"}, touched
    _one_slot_each(touched, frozen_clock.now())
    attempt = Attempt.objects.get(occurrence_id=run.occurrence_id)
    assert attempt.heartbeat_at == frozen_clock.now()


@pytest.mark.parametrize("retry", [True, False], ids=["retry", "dead"])
def test_a_failure_reads_the_runs_slot_only(
    tenant: Any, frozen_clock: FrozenClock, retry: bool
) -> None:
    run = _claimed(tenant, frozen_clock)
    retry_at = frozen_clock.now() + timedelta(seconds=10) if retry else None

    def fail() -> None:
        assert run.fencing_token is not None
        finish.fail(
            run.occurrence_id, run.fencing_token, "boom", retry_at=retry_at,
            clock=frozen_clock, scheduled_for=run.scheduled_for,
        )  # fmt: skip

    touched = partitions_scanned(fail)
    _one_slot_each(touched, frozen_clock.now())
    occ = Occurrence.objects.get(pk=run.occurrence_id)
    assert occ.state == ("RETRY_WAIT" if retry else "DEAD")
    if retry:
        assert "django_app_outboxentry" in touched
        outbox = OutboxEntry.objects.get(occurrence_id=occ.pk)
        assert (outbox.sent_at, outbox.available_at) == (None, retry_at)


def test_a_completion_of_a_schedule_that_counts_failures_reads_the_runs_slot_only(
    tenant: Any, frozen_clock: FrozenClock
) -> None:
    """Such a completion runs the portable transaction (it resets the failure count)."""
    run = _claimed(tenant, frozen_clock, pause_after_failures=3)

    def complete() -> None:
        assert run.fencing_token is not None
        finish.complete(
            run.occurrence_id, run.fencing_token, {"ok": 1}, clock=frozen_clock,
            scheduled_for=run.scheduled_for,
        )  # fmt: skip

    touched = partitions_scanned(complete)
    _one_slot_each(touched, frozen_clock.now())
    assert Occurrence.objects.get(pk=run.occurrence_id).state == "SUCCEEDED"
    assert Attempt.objects.get(occurrence_id=run.occurrence_id).outcome == "SUCCEEDED"


def test_a_failing_body_records_its_failure_under_the_rows_time_not_the_messages(
    tenant: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker passes the claim's time (the row's) to the failure and the heartbeat:
    with the message's, a message whose time is not the row's would find no row, and the
    failure would be dropped as stale (the run left RUNNING until its lease expires)."""
    at = datetime.now(UTC).replace(microsecond=0)
    occ = make_occurrence(make_schedule(tenant, task="tests.finish_by_key.boom"), at)
    held: list[Any] = []
    real_hold = tasks.heartbeats.hold

    def hold_spy(*args: Any, **kwargs: Any) -> Any:
        held.append(real_hold(*args, **kwargs))
        return held[-1]

    monkeypatch.setattr(tasks.heartbeats, "hold", hold_spy)
    message = {**message_kwargs(occ), "scheduled_for": (at + timedelta(seconds=1)).isoformat()}
    outcome = tasks.execute(
        app, str(occ.id), "tests.finish_by_key.boom", [], {}, worker_name="w", message=message
    )
    assert outcome["outcome"] in {"RETRY_WAIT", "DEAD"}, outcome
    assert Occurrence.objects.get(pk=occ.pk).state == outcome["outcome"]
    assert [h.scheduled_for for h in held] == [at]


def test_the_heartbeat_renews_with_the_key_it_was_given(monkeypatch: pytest.MonkeyPatch) -> None:
    at = datetime(2034, 3, 15, 12, 0, tzinfo=UTC)
    keys: list[Any] = []
    monkeypatch.setattr(finish, "renew", lambda *a, **kw: keys.append(kw["scheduled_for"]))
    beats = heartbeat.Heartbeats()
    held = beats.hold("x", 1, timedelta(seconds=3), SYSTEM_CLOCK, at, holds_slot=False)
    beats._renew(held)
    assert keys == [at]
