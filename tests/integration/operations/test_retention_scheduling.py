"""Retention is invisible to scheduling: pruning never changes which fire times run.

The reproduction of issue 25 (a skip made more than the retention age ahead was pruned and
the skipped time ran), then a property test: random schedules, skips, pauses, updates and
run-now calls, driven day by day with and without a daily prune at a random age, must run
exactly the same fire times, backfills over pruned history included.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_scheduler import api, errors
from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.publishers import RecordingPublisher
from django_app.models import Occurrence, PrunedHistory
from django_app.operations import reconcile, retention
from django_app.relay.batch import relay_due
from django_app.wiring import materialize_due
from django_app.worker import claim, finish
from tests.conftest import database_family

pytestmark = pytest.mark.django_db

START = datetime(2026, 3, 2, 0, 0, tzinfo=UTC)
DAY = timedelta(days=1)
#: Every schedule fires at 09:00 or 15:00 UTC; the drive steps through those instants.
HOURS = (9, 15)

#: What ran, counted: (schedule name, fire time, manual) -> runs through the real claim and
#: complete (a count, so a time that runs twice shows).
Ran = Counter[tuple[str, datetime, bool]]


def drive(
    clock: FrozenClock,
    days: int,
    *,
    prune_days: int | None,
    on_day: Callable[[int], None],
    lost: Collection[datetime] = (),
    down: Collection[datetime] = (),
) -> Ran:
    """Day by day: the day's operations, then around each fire instant materialize, relay,
    and run every published message through the real claim and complete; with
    ``prune_days`` a prune at that age after each day (the README's daily command). The
    first message of each fire time in ``lost`` never reaches a worker; at the fire instants
    in ``down`` no beat runs (the next instant plans them late)."""
    lost = set(lost)
    publisher = RecordingPublisher()
    ran: Ran = Counter()
    seen = 0
    for day in range(days):
        on_day(day)
        base = START + day * DAY
        for hour in HOURS:
            fire = base + timedelta(hours=hour)
            if fire in down:
                continue
            clock.set(fire - timedelta(seconds=30))
            materialize_due(clock=clock, horizon=timedelta(minutes=1))
            clock.set(fire + timedelta(seconds=1))
            relay_due(clock=clock, publisher=publisher)
            for message in publisher.sent[seen:]:
                if message.scheduled_for in lost:
                    lost.discard(message.scheduled_for)
                    continue
                result = claim.claim(message.occurrence_id, worker="w", clock=clock)
                if result.claimed:
                    assert result.fencing_token is not None
                    finish.complete(message.occurrence_id, result.fencing_token, clock=clock)
                    occ = Occurrence.objects.select_related("schedule").get(
                        pk=message.occurrence_id
                    )
                    ran[(occ.schedule.name, occ.scheduled_for, occ.manual)] += 1
            seen = len(publisher.sent)
        if prune_days is not None:
            clock.set(base + DAY - timedelta(minutes=1))
            retention.prune(now=clock.now(), older_than=prune_days * DAY)
    return ran


def test_a_skip_made_further_ahead_than_the_retention_age_still_skips() -> None:
    clock = FrozenClock(START)
    s = api.create_schedule(name="report", task="billing.ping", cron="0 9 * * *", clock=clock)
    skipped = START + 40 * DAY + timedelta(hours=9)
    api.skip_occurrence(s.id, scheduled_for=skipped, clock=clock)

    ran = drive(clock, 42, prune_days=30, on_day=lambda day: None)

    times = {at for _, at, _ in ran}
    assert skipped not in times, "the pruned skip let the skipped time run"
    assert len(times) == 41
    assert api.describe_schedule(s.id, clock=clock).skipped_times == [skipped]
    # Past the cursor the marker is history, aged by its time (day 40): it stays for now.
    assert Occurrence.objects.filter(schedule_id=s.id, scheduled_for=skipped).exists()


def test_a_skip_marker_is_history_only_once_its_time_is_older_than_the_retention_age() -> None:
    """A skip made 40 days ahead: its marker's finished_at is the moment of the skip, but
    its age is its time's. Once its time is recent history (days 35-42 with a 30-day age),
    the marker is still there: the reconciler finds it rather than report the time absent,
    and skipping the time again still answers as before."""
    clock = FrozenClock(START)
    s = api.create_schedule(name="report", task="billing.ping", cron="0 9 * * *", clock=clock)
    skipped = START + 40 * DAY + timedelta(hours=9)
    api.skip_occurrence(s.id, scheduled_for=skipped, clock=clock)

    drive(clock, 42, prune_days=30, on_day=lambda day: None)

    report = reconcile.reconcile(start=START + 35 * DAY, end=START + 42 * DAY, now=clock.now())
    assert report.absent == [], "the pruned skip marker was reported absent"
    again = api.skip_occurrence(s.id, scheduled_for=skipped, clock=clock)
    marker = Occurrence.objects.get(schedule_id=s.id, scheduled_for=skipped)
    assert (again.occurrence_id, marker.state) == (marker.id, "CANCELED")


def test_a_run_now_key_still_runs_once_after_its_occurrence_is_pruned() -> None:
    clock = FrozenClock(START)
    s = api.create_schedule(name="report", task="billing.ping", cron="0 9 * * *", clock=clock)
    first_id = api.run_now(s.id, idempotency_key="deploy-42", clock=clock).id
    answers: list[Occurrence] = []

    def on_day(day: int) -> None:
        if day == 5:  # the key's occurrence ran on day 0 and is pruned by now (age 2 days)
            clock.set(START + day * DAY + timedelta(hours=8))
            answers.append(api.run_now(s.id, idempotency_key="deploy-42", clock=clock))

    ran = drive(clock, 7, prune_days=2, on_day=on_day)

    manual = sorted(at for _, at, is_manual in ran.elements() if is_manual)
    assert manual == [START], f"the pruned key ran again: {manual}"
    # The answer is the first call's occurrence as retention last saw it.
    (again,) = answers
    assert (again.id, again.state, again.scheduled_for) == (first_id, "SUCCEEDED", START)


def test_an_update_after_a_lost_message_runs_no_pruned_time_again() -> None:
    """A message lost for longer than the retention age (redelivery off): its occurrence
    stays unclaimed while the next days run and are pruned. An update re-plans from the
    unclaimed time; the times in between ran (one of them is pruned) and must not run
    again."""
    clock = FrozenClock(START)
    s = api.create_schedule(name="report", task="billing.ping", cron="0 9 * * *",
                            misfire_policy="CATCH_UP", clock=clock)  # fmt: skip
    lost = START + timedelta(hours=9)

    def on_day(day: int) -> None:
        if day == 4:  # day 1's run is pruned by now (age 2 days); days 2 and 3 are not
            clock.set(START + day * DAY + timedelta(hours=8))
            assert not Occurrence.objects.filter(scheduled_for=lost + DAY).exists()
            api.update_schedule(s.id, args=[1], clock=clock)

    ran = drive(clock, 6, prune_days=2, on_day=on_day, lost={lost})

    assert ran[("report", lost + DAY, False)] == 1, "the pruned run ran again"
    assert max(ran.values()) == 1, ran
    assert ran[("report", lost, False)] == 1  # the lost time itself runs, re-planned


def test_an_update_after_a_lost_message_runs_no_pruned_missed_time() -> None:
    """As above, with a time between the lost one and the update that was MISSED (the
    beats were down past its max_lateness) and is pruned: a time that was passed over is
    taken like one that ran, so the update's new misfire policy (CATCH_UP) must not run it
    now, as it would not with the MISSED row there."""
    clock = FrozenClock(START)
    s = api.create_schedule(name="report", task="billing.ping", cron="0 9 * * *",
                            misfire_policy="SKIP", clock=clock)  # fmt: skip
    lost, missed = START + timedelta(hours=9), START + DAY + timedelta(hours=9)

    def on_day(day: int) -> None:
        if day == 4:  # day 1's MISSED row is pruned by now (age 2 days)
            clock.set(START + day * DAY + timedelta(hours=8))
            assert not Occurrence.objects.filter(scheduled_for=missed).exists()
            api.update_schedule(s.id, misfire_policy="CATCH_UP", catchup_cap=10, clock=clock)

    ran = drive(clock, 6, prune_days=2, on_day=on_day, lost={lost}, down={missed})

    assert ran[("report", missed, False)] == 0, "the pruned MISSED time ran"
    assert ran[("report", lost, False)] == 1  # the lost time itself runs, re-planned
    assert max(ran.values()) == 1, ran


def test_a_backfill_over_pruned_history_never_runs_a_time_twice() -> None:
    clock = FrozenClock(START)
    s = api.create_schedule(name="report", task="billing.ping", cron="0 9 * * *", clock=clock)
    refused: list[errors.ValidationError] = []
    reports = []

    def on_day(day: int) -> None:
        if day in (1, 8):  # the same range twice; its runs are pruned in between
            clock.set(START + day * DAY + timedelta(hours=8))
            try:
                reports.append(
                    api.backfill(s.id, start=START - 3 * DAY, end=START + DAY, clock=clock)
                )
            except errors.ValidationError as exc:
                refused.append(exc)

    ran = drive(clock, 10, prune_days=2, on_day=on_day)

    backfilled = sorted(at for _, at, is_manual in ran.elements() if is_manual)
    assert backfilled == [START - n * DAY + timedelta(hours=9) for n in (3, 2, 1)], (
        f"a backfill over pruned history ran times again: {backfilled}"
    )
    # The second backfill is not refused: retention kept which times were backfilled.
    assert refused == []
    assert [(r.created, r.already_backfilled) for r in reports[1:]] == [([], 3)]


def test_a_backfill_over_pruned_history_runs_the_times_that_were_missed() -> None:
    """A time that was MISSED (here: the schedule was paused over it) and whose rows
    retention deleted runs when backfilled, as it would with the rows there; the times
    that ran do not run again."""
    clock = FrozenClock(START)
    s = api.create_schedule(name="report", task="billing.ping", cron="0 9 * * *", clock=clock)
    reports = []

    def on_day(day: int) -> None:
        clock.set(START + day * DAY + timedelta(hours=8))
        if day == 2:
            api.pause_schedule(s.id, clock=clock)
        if day == 4:
            api.resume_schedule(s.id, clock=clock)
        if day == 9:  # days 0-8 are pruned by now (age 2 days)
            reports.append(api.backfill(s.id, start=START, end=START + 6 * DAY, clock=clock))

    ran = drive(clock, 10, prune_days=2, on_day=on_day)

    assert PrunedHistory.objects.get(schedule_id=s.id).through >= START + 5 * DAY
    backfilled = sorted(at for _, at, is_manual in ran.elements() if is_manual)
    assert backfilled == [START + n * DAY + timedelta(hours=9) for n in (2, 3)]
    assert sorted(ran.values()) == [1] * 10


# --- the property: the same operations with and without retention run the same times ---

CRONS = ("0 9 * * *", "0 15 * * *", "0 9,15 * * *", "0 9 */2 * *", "0 15 * * 1-5")
KINDS = [
    *("skip", "skip", "pause", "resume", "update", "run_now"),
    *("keyed", "keyed", "backfill", "backfill"),
]


@dataclass(frozen=True)
class Op:
    day: int
    kind: str  # skip / pause / resume / update / run_now / keyed (run now with a key) / backfill
    schedule: int
    ahead: int  # skip: days ahead; update: the new cron; keyed: days to the repeat;
    #             backfill: days back
    hour: int
    length: int  # backfill: days in the range


ops_strategy = st.lists(
    st.builds(
        Op,
        day=st.integers(0, 15),
        kind=st.sampled_from(KINDS),
        schedule=st.integers(0, 2),
        ahead=st.integers(0, 15),
        hour=st.sampled_from(HOURS),
        length=st.integers(1, 4),
    ),
    min_size=2,
    max_size=14,
)


def _apply(op: Op, schedules: list[Any], clock: FrozenClock) -> bool:
    """Apply ``op``; False when a backfill was refused for pruned history (it never is)."""
    sid = schedules[op.schedule % len(schedules)].id
    try:
        with transaction.atomic():  # a refused op rolls back alone
            _call(op, sid, clock)
    except errors.HistoryPruned:
        return False
    except errors.SchedulerError:
        pass  # not a fire time, already paused...: refused the same way in both runs
    return True


def _call(op: Op, sid: Any, clock: FrozenClock) -> None:
    if op.kind == "skip":
        at = START + (op.day + op.ahead) * DAY + timedelta(hours=op.hour)
        api.skip_occurrence(sid, scheduled_for=at, clock=clock)
    elif op.kind == "pause":
        api.pause_schedule(sid, clock=clock)
    elif op.kind == "resume":
        api.resume_schedule(sid, clock=clock)
    elif op.kind == "update":
        api.update_schedule(sid, cron=CRONS[op.ahead % len(CRONS)], clock=clock)
    elif op.kind == "keyed":  # three keys; each keyed op asks twice (see _world)
        api.run_now(sid, idempotency_key=f"k{op.ahead % 3}", clock=clock)
    elif op.kind == "backfill":  # ranges from before the schedules existed up to now
        start = START + (op.day - op.ahead) * DAY
        end = min(start + op.length * DAY, clock.now())
        api.backfill(sid, start=start, end=end, clock=clock)
    else:
        api.run_now(sid, clock=clock)


def _run_world(crons: list[str], ops: list[Op], prune_days: int | None) -> tuple[Ran, list[int]]:
    # Rolled back at the end: the next world (and example) starts from an empty database.
    with transaction.atomic():
        ran, refused = _world(crons, ops, prune_days)
        transaction.set_rollback(True)
    return ran, refused


def _world(crons: list[str], ops: list[Op], prune_days: int | None) -> tuple[Ran, list[int]]:
    clock = FrozenClock(START)
    schedules = [
        api.create_schedule(name=f"s{i}", task="billing.ping", cron=cron, clock=clock)
        for i, cron in enumerate(crons)
    ]
    by_day: dict[int, list[tuple[int, Op]]] = {}
    for index, op in enumerate(ops):
        by_day.setdefault(op.day, []).append((index, op))
        if op.kind == "keyed":  # the same key again, ``ahead`` days later (often pruned by then)
            by_day.setdefault(op.day + op.ahead, []).append((index, op))
    refused: list[int] = []

    def on_day(day: int) -> None:
        clock.set(START + day * DAY + timedelta(hours=8))
        for index, op in by_day.get(day, []):
            if not _apply(op, schedules, clock):
                refused.append(index)

    return drive(clock, 20, prune_days=prune_days, on_day=on_day), refused


#: Examples of the property: 10 on PostgreSQL (the production database), 4 on SQLite and
#: MariaDB, where the code under test is the same portable ORM (retention, the per-schedule
#: materializer, the batch relay, claim and complete) and each example costs seconds of the
#: pass; the examples are derandomized, the same on every run.
EXAMPLES = 10 if database_family() == "postgresql" else 4


@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    crons=st.lists(st.sampled_from(CRONS), min_size=1, max_size=3),
    ops=ops_strategy,
    prune_days=st.integers(1, 10),
)
def test_retention_at_any_age_runs_the_same_fire_times(
    crons: list[str], ops: list[Op], prune_days: int
) -> None:
    """With retention, every operation does what it does without, backfills over pruned
    history included (none is refused): the same fire times run, each as often, as in the
    same world without retention."""
    with_retention, refused = _run_world(crons, ops, prune_days)
    without, refused_without = _run_world(crons, ops, None)
    assert (refused, refused_without) == ([], [])
    assert with_retention == without
