"""The run_occurrence wrapper: body in context, retries via the outbox, DEAD, replay."""

from __future__ import annotations

import itertools
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery

from celery_scheduler import errors
from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.core.enums import AttemptOutcome
from celery_scheduler.core.enums import OccurrenceState as S
from celery_scheduler.tasks import current_occurrence_id
from django_app.models import Attempt, IdempotencyRecord, Occurrence, OutboxEntry
from django_app.tasks import execute
from django_app.worker import claim, finish
from tests.integration.worker_support import make_occurrence, make_schedule

pytestmark = pytest.mark.django_db
app = Celery("execute-tests", set_as_current=False)
seen: list[Any] = []
flaky_calls = itertools.count()


@app.task(name="t.ok")
def ok(x: int) -> dict[str, Any]:
    seen.append(current_occurrence_id())
    return {"double": 2 * x}


@app.task(name="t.transient", max_attempts=3)
def transient() -> None:
    raise errors.Throttled("slow down")


@app.task(name="t.permanent")
def permanent() -> None:
    raise ValueError("customer id is malformed")


@app.task(name="t.declared", permanent_errors=(ConnectionError,))
def declared() -> None:
    raise ConnectionError("treated as permanent by this task")


def run(occ: Any, clock: FrozenClock) -> dict[str, Any]:
    schedule = occ.schedule
    return execute(
        app, str(occ.id), schedule.task, schedule.args, schedule.kwargs,
        worker_name="w", clock=clock, lease=timedelta(seconds=30),
    )  # fmt: skip


def test_success_runs_the_body_with_the_occurrence_in_context(
    tenant: Any, frozen_clock: FrozenClock
) -> None:
    occ = make_occurrence(make_schedule(tenant, task="t.ok", args=[21]), frozen_clock.now())
    outcome = run(occ, frozen_clock)
    assert outcome["outcome"] == "SUCCEEDED"
    assert seen[-1] == str(occ.id)
    row = Occurrence.objects.get(pk=occ.pk)
    assert (row.state, row.result) == (S.SUCCEEDED, {"double": 42})
    assert run(occ, frozen_clock)["outcome"] == "DUPLICATE"


def test_transient_errors_retry_with_backoff_then_go_dead_and_replay_keeps_the_id(
    tenant: Any, frozen_clock: FrozenClock
) -> None:
    occ = make_occurrence(make_schedule(tenant, task="t.transient"), frozen_clock.now())
    for attempt in (1, 2):
        before = frozen_clock.now()
        assert run(occ, frozen_clock)["outcome"] == "RETRY_WAIT"
        row = Occurrence.objects.get(pk=occ.pk)
        assert row.retry_at is not None
        # full jitter: 0 <= delay <= base * 2**(attempt - 1)
        assert before <= row.retry_at <= before + timedelta(seconds=2 ** (attempt - 1))
        outbox = OutboxEntry.objects.get(occurrence=occ)
        assert (outbox.sent_at, outbox.available_at) == (None, row.retry_at)
        frozen_clock.advance(5)
    outcome = run(occ, frozen_clock)
    assert outcome["outcome"] == "DEAD"
    assert "3 of 3 attempts" in outcome["reason"]
    row = Occurrence.objects.get(pk=occ.pk)
    assert row.state == S.DEAD
    assert "Throttled: slow down" in row.last_error
    outcomes = list(Attempt.objects.filter(occurrence=occ).values_list("outcome", flat=True))
    assert outcomes == [AttemptOutcome.RETRY, AttemptOutcome.RETRY, AttemptOutcome.FAILED]
    replayed = finish.replay_occurrence(occ.id, clock=frozen_clock)
    assert replayed.id == occ.id
    assert run(occ, frozen_clock)["outcome"] == "RETRY_WAIT"  # fresh budget after replay
    assert Attempt.objects.filter(occurrence=occ).count() == 4


def test_schedule_max_attempts_wins_over_the_task_option(
    tenant: Any, frozen_clock: FrozenClock
) -> None:
    schedule = make_schedule(tenant, task="t.transient", max_attempts=1)
    occ = make_occurrence(schedule, frozen_clock.now())
    assert run(occ, frozen_clock)["outcome"] == "DEAD"


def test_retry_that_would_pass_the_deadline_goes_dead(
    tenant: Any, frozen_clock: FrozenClock
) -> None:
    schedule = make_schedule(tenant, task="t.transient", deadline_seconds=60)
    occ = make_occurrence(schedule, frozen_clock.now() - timedelta(seconds=60))
    outcome = run(occ, frozen_clock)
    assert outcome["outcome"] == "DEAD"
    assert "deadline" in outcome["reason"]


@pytest.mark.parametrize("task", ["t.permanent", "t.declared", "t.not_registered"])
def test_permanent_errors_go_straight_to_dead(
    tenant: Any, frozen_clock: FrozenClock, task: str
) -> None:
    occ = make_occurrence(make_schedule(tenant, task=task), frozen_clock.now())
    assert run(occ, frozen_clock)["outcome"] == "DEAD"
    row = Occurrence.objects.get(pk=occ.pk)
    assert (row.state, row.attempt_count) == (S.DEAD, 1)


def test_database_down_at_claim_is_coordination_unavailable(
    tenant: Any, frozen_clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.db import OperationalError

    def down(*args: Any, **kwargs: Any) -> None:
        raise OperationalError("connection refused")

    occ = make_occurrence(make_schedule(tenant, task="t.ok", args=[1]), frozen_clock.now())
    monkeypatch.setattr(claim, "_claim", down)
    with pytest.raises(errors.CoordinationUnavailable, match="database unavailable"):
        run(occ, frozen_clock)
    assert Occurrence.objects.get(pk=occ.pk).state == S.ENQUEUED


@pytest.mark.parametrize("task", ["t.ok", "t.unknown"])
def test_a_lost_outcome_write_is_logged_with_the_occurrence_id(
    tenant: Any,
    frozen_clock: FrozenClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    task: str,
) -> None:
    from django.db import OperationalError

    def down(*args: Any, **kwargs: Any) -> None:
        raise OperationalError("server closed the connection unexpectedly")

    occ = make_occurrence(make_schedule(tenant, task=task, args=[1]), frozen_clock.now())
    monkeypatch.setattr(finish, "complete", down)
    monkeypatch.setattr(finish, "fail", down)
    with caplog.at_level("ERROR", logger="celery_scheduler.worker"):
        outcome = run(occ, frozen_clock)
    assert outcome["outcome"] in {"STALE_WRITE", "DEAD"}
    lost = [r for r in caplog.records if r.getMessage().startswith("could not record")]
    assert len(lost) == 1, caplog.text
    assert str(occ.id) in lost[0].getMessage()
    assert task not in lost[0].getMessage()
    assert getattr(lost[0], "occurrence_id", None) == str(occ.id)


@pytest.mark.parametrize(
    ("outcome", "level"), [("SUCCEEDED", "DEBUG"), ("DUPLICATE", "INFO"), ("DEAD", "INFO")]
)
def test_the_run_line_is_debug_where_celerys_own_line_tells_the_same(
    caplog: pytest.LogCaptureFixture, outcome: str, level: str
) -> None:
    """Celery's worker logs "Task <task>[<id>] succeeded in ..." for a scheduled run (it is
    traced as the task itself): the scheduler's line repeats a success at DEBUG only, and
    keeps what Celery's lines cannot tell at INFO."""
    from django_app.tasks import _log_outcome

    with caplog.at_level("DEBUG", logger="celery_scheduler.worker"):
        _log_outcome("occ-1", {"outcome": outcome})
    [record] = caplog.records
    assert (record.levelname, record.getMessage()) == (level, f"occurrence occ-1: {outcome}")
    assert getattr(record, "event", None) == "occurrence_run"


def test_a_body_does_not_start_on_a_lease_that_lapsed_after_the_claim(
    tenant: Any, frozen_clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker stalled (SIGSTOP, a long GC pause, a frozen VM) between its claim and the
    body: the lease lapsed, the reaper re-queued the occurrence, an update cancelled it.
    Fencing would roll back the body's database writes, not an e-mail it sends, so the body
    must not start. Found by the chaos soak (a body started 4 s after its occurrence was
    cancelled); before: `assert [...] == []`, the body ran."""
    occ = make_occurrence(make_schedule(tenant, task="t.ok", args=[1]), frozen_clock.now())
    real_claim = claim.claim

    def claim_then_stall(*args: Any, **kwargs: Any) -> claim.ClaimResult:
        claimed = real_claim(*args, **kwargs)
        frozen_clock.advance(31)  # past the 30 s lease
        assert finish.reap_expired(clock=frozen_clock) == 1
        return claimed

    monkeypatch.setattr(claim, "claim", claim_then_stall)
    seen.clear()
    outcome = run(occ, frozen_clock)
    assert seen == []
    assert outcome["outcome"] == "LEASE_LOST"
    assert Occurrence.objects.get(pk=occ.pk).state == S.RETRY_WAIT


def test_a_body_that_starts_late_under_its_own_lease_renews_it_and_runs(
    tenant: Any, frozen_clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow start (past the renewal period, within the 30 s lease): the check renews it."""
    occ = make_occurrence(make_schedule(tenant, task="t.ok", args=[1]), frozen_clock.now())
    real_claim = claim.claim

    def claim_then_pause(*args: Any, **kwargs: Any) -> claim.ClaimResult:
        claimed = real_claim(*args, **kwargs)
        frozen_clock.advance(20)
        return claimed

    monkeypatch.setattr(claim, "claim", claim_then_pause)
    assert run(occ, frozen_clock)["outcome"] == "SUCCEEDED"
    assert seen[-1] == str(occ.id)


def test_a_body_does_not_start_on_a_lapsed_lease_that_nobody_reaped_yet(
    tenant: Any, frozen_clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past its expiry the run stopped counting (its slot could be taken, the next run
    could start): the token is still current, but the body must not start. The run stays
    RUNNING on its lapsed lease, and the reaper re-queues it. Before: the check renewed the
    lapsed lease and the body ran (two bodies under a cap of 1 in the invoice test)."""
    occ = make_occurrence(make_schedule(tenant, task="t.ok", args=[1]), frozen_clock.now())
    real_claim = claim.claim

    def claim_then_stall(*args: Any, **kwargs: Any) -> claim.ClaimResult:
        claimed = real_claim(*args, **kwargs)
        frozen_clock.advance(31)  # past the 30 s lease
        return claimed

    monkeypatch.setattr(claim, "claim", claim_then_stall)
    seen.clear()
    assert run(occ, frozen_clock)["outcome"] == "LEASE_LOST"
    assert seen == []
    assert Occurrence.objects.get(pk=occ.pk).state == S.RUNNING
    assert finish.reap_expired(clock=frozen_clock) == 1


@app.task(name="t.two_tries", max_attempts=2)
def two_tries() -> None:
    seen.append("two_tries ran")


@app.task(name="t.eight_tries", max_attempts=8)
def eight_tries() -> None:
    seen.append("eight_tries ran")


def lose_lease(occ: Any, clock: FrozenClock) -> None:
    """A worker claims and dies: its lease lapses and the beat's reaper recovers the run."""
    assert claim.claim(occ.id, worker="dies", clock=clock, lease=timedelta(seconds=30)).claimed
    clock.advance(timedelta(seconds=31))
    assert finish.reap_expired(clock=clock) == 1


def test_runs_whose_workers_die_stop_at_the_tasks_own_max_attempts(
    tenant: Any, frozen_clock: FrozenClock
) -> None:
    """The task's ``max_attempts`` (2) bounds lost attempts too, under the default (5)."""
    occ = make_occurrence(make_schedule(tenant, task="t.two_tries"), frozen_clock.now())
    for _ in range(2):
        lose_lease(occ, frozen_clock)
    assert Occurrence.objects.get(pk=occ.pk).state == S.RETRY_WAIT
    seen.clear()
    outcome = run(occ, frozen_clock)
    assert (outcome["outcome"], seen) == ("DEAD", [])  # a third attempt is not run
    row = Occurrence.objects.get(pk=occ.pk)
    assert row.state == S.DEAD
    assert "attempts exhausted" in row.last_error


def test_runs_whose_workers_die_get_every_attempt_the_task_allows(
    tenant: Any, frozen_clock: FrozenClock
) -> None:
    """The task's ``max_attempts`` (8) is not cut to the default (5) by the reaper."""
    occ = make_occurrence(make_schedule(tenant, task="t.eight_tries"), frozen_clock.now())
    for _ in range(7):
        lose_lease(occ, frozen_clock)
    assert Occurrence.objects.get(pk=occ.pk).state == S.RETRY_WAIT
    seen.clear()
    assert run(occ, frozen_clock)["outcome"] == "SUCCEEDED"
    assert seen == ["eight_tries ran"]


@app.task(name="t.one_try", max_attempts=1)
def one_try() -> None:
    seen.append("one_try ran")


def test_a_run_past_its_budget_whose_effect_was_recorded_is_done_not_dead(
    tenant: Any, frozen_clock: FrozenClock
) -> None:
    """An @idempotent_task body did its effect and recorded it, then its completion write
    was lost (the worker died): the claim past the budget settles the run with the stored
    result, as a re-run would have found, instead of dead-lettering it."""
    occ = make_occurrence(make_schedule(tenant, task="t.one_try"), frozen_clock.now())
    lose_lease(occ, frozen_clock)
    IdempotencyRecord.objects.create(
        tenant=tenant, task_name="t.one_try", key="invoice:7", occurrence_id=occ.pk,
        result={"invoice": 7},
    )  # fmt: skip
    seen.clear()
    outcome = run(occ, frozen_clock)
    assert (outcome["outcome"], outcome.get("value"), seen) == ("SUCCEEDED", {"invoice": 7}, [])
    row = Occurrence.objects.get(pk=occ.pk)
    assert (row.state, row.result) == (S.SUCCEEDED, {"invoice": 7})
