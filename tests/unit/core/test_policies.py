"""Misfire decisions and per-pass planning: the documented contract, example by example."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from celery_scheduler.core.enums import MisfirePolicy
from celery_scheduler.core.policies import PassPlan, is_late, plan_misfire, plan_pass
from celery_scheduler.core.timemath import CronTrigger, IntervalTrigger, OneOffTrigger
from celery_scheduler.errors import InvalidPolicy

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
EVERY_MINUTE = CronTrigger(expression="* * * * *", timezone="UTC")


def minutes_ago(*ns: int) -> list[datetime]:
    return [NOW - n * MINUTE for n in ns]


def test_lateness_is_strict() -> None:
    assert not is_late(NOW - MINUTE, now=NOW, max_lateness=MINUTE)
    assert is_late(NOW - MINUTE - timedelta(microseconds=1), now=NOW, max_lateness=MINUTE)
    assert not is_late(NOW + MINUTE, now=NOW, max_lateness=timedelta(0))


@pytest.mark.parametrize(
    ("policy", "fired", "missed"),
    [
        (MisfirePolicy.SKIP, [1, 0], [5, 4, 3, 2]),
        (MisfirePolicy.FIRE_ONCE, [2, 1, 0], [5, 4, 3]),
        (MisfirePolicy.CATCH_UP, [3, 2, 1, 0], [5, 4]),
    ],
)
def test_each_policy_on_a_mixed_input(
    policy: MisfirePolicy, fired: list[int], missed: list[int]
) -> None:
    times = minutes_ago(5, 4, 3, 2, 1, 0)  # 5..2 are late with max_lateness 1 min
    plan = plan_misfire(times, now=NOW, policy=policy, max_lateness=MINUTE, catchup_cap=2)
    assert plan.fire == minutes_ago(*fired)
    assert plan.missed == minutes_ago(*missed)


def test_catch_up_cap_zero_fires_no_late_one() -> None:
    plan = plan_misfire(
        minutes_ago(3, 0),
        now=NOW,
        policy=MisfirePolicy.CATCH_UP,
        max_lateness=MINUTE,
        catchup_cap=0,
    )
    assert plan.fire == minutes_ago(0)
    assert plan.missed == minutes_ago(3)


def test_policy_given_as_stored_string() -> None:
    plan = plan_misfire(
        minutes_ago(3, 2),
        now=NOW,
        policy="FIRE_ONCE",
        max_lateness=MINUTE,
        catchup_cap=5,
    )
    assert plan.fire == minutes_ago(2)


def test_invalid_arguments_are_refused() -> None:
    with pytest.raises(InvalidPolicy, match="catchup_cap"):
        plan_misfire([], now=NOW, policy=MisfirePolicy.SKIP, max_lateness=MINUTE, catchup_cap=-1)
    with pytest.raises(InvalidPolicy, match="max_lateness"):
        plan_misfire([], now=NOW, policy=MisfirePolicy.SKIP, max_lateness=-MINUTE, catchup_cap=1)


offsets = st.lists(st.integers(min_value=-600, max_value=600), unique=True, max_size=40)


@given(
    offsets=offsets,
    policy=st.sampled_from(list(MisfirePolicy)),
    lateness=st.integers(min_value=0, max_value=300),
    cap=st.integers(min_value=0, max_value=50),
)
def test_plan_partitions_the_input(
    offsets: list[int], policy: MisfirePolicy, lateness: int, cap: int
) -> None:
    times = sorted(NOW + timedelta(seconds=o) for o in offsets)
    max_lateness = timedelta(seconds=lateness)
    plan = plan_misfire(times, now=NOW, policy=policy, max_lateness=max_lateness, catchup_cap=cap)
    assert sorted(plan.fire + plan.missed) == times
    assert not set(plan.fire) & set(plan.missed)
    assert plan.fire == sorted(plan.fire)
    assert plan.missed == sorted(plan.missed)
    late = [t for t in times if is_late(t, now=NOW, max_lateness=max_lateness)]
    on_time = [t for t in times if t not in late]
    kept = {MisfirePolicy.SKIP: 0, MisfirePolicy.FIRE_ONCE: 1, MisfirePolicy.CATCH_UP: cap}[policy]
    assert set(on_time) <= set(plan.fire)
    assert plan.missed == late[: max(len(late) - kept, 0)]
    assert len(plan.fire) == len(on_time) + min(kept, len(late))
    # The late ones that fire are the latest late ones.
    fired_late = [t for t in plan.fire if t in late]
    assert fired_late == late[len(late) - len(fired_late) :]


# --- plan_pass: enumeration from the cursor ------------------------------------------------


def outage_plan(policy: MisfirePolicy) -> PassPlan:
    return plan_pass(
        EVERY_MINUTE,
        NOW - 10 * MINUTE,
        now=NOW,
        until=NOW + MINUTE,
        policy=policy,
        max_lateness=MINUTE,
        catchup_cap=3,
        max_missed=1000,
    )


@pytest.mark.parametrize(
    ("policy", "fired", "missed"),
    [
        (MisfirePolicy.SKIP, [1, 0, -1], list(range(10, 1, -1))),
        (MisfirePolicy.FIRE_ONCE, [2, 1, 0, -1], list(range(10, 2, -1))),
        (MisfirePolicy.CATCH_UP, [4, 3, 2, 1, 0, -1], list(range(10, 4, -1))),
    ],
)
def test_ten_minute_outage_from_the_cursor(
    policy: MisfirePolicy, fired: list[int], missed: list[int]
) -> None:
    plan = outage_plan(policy)
    assert plan.fire == minutes_ago(*fired)
    assert plan.missed == minutes_ago(*missed)
    assert plan.next_cursor == NOW + 2 * MINUTE
    assert plan.jumped is None


def test_long_outage_is_bounded_and_jumps_the_oldest() -> None:
    plan = plan_pass(
        EVERY_MINUTE,
        NOW - timedelta(days=30),
        now=NOW,
        until=NOW,
        policy=MisfirePolicy.FIRE_ONCE,
        max_lateness=MINUTE,
        catchup_cap=3,
        max_missed=50,
    )
    assert len(plan.missed) <= 50
    assert len(plan.missed) >= 40  # bisection lands close to the bound, not at zero
    assert plan.fire == minutes_ago(2, 1, 0)  # latest late one + the two on time
    assert plan.missed[-1] == NOW - 3 * MINUTE  # no gap between recorded and fired
    assert plan.jumped is not None
    assert plan.jumped[0] == NOW - timedelta(days=30)
    assert plan.jumped[1] <= plan.missed[0]
    assert plan.next_cursor == NOW + MINUTE


def test_many_on_time_times_are_split_across_passes() -> None:
    plan = plan_pass(
        IntervalTrigger(every=timedelta(seconds=1), anchor=NOW),
        NOW,
        now=NOW,
        until=NOW + timedelta(hours=1),
        policy=MisfirePolicy.SKIP,
        max_lateness=MINUTE,
        catchup_cap=3,
        max_missed=9,
    )
    assert len(plan.fire) == 10
    assert plan.next_cursor == NOW + timedelta(seconds=10)


def test_one_off_completes_and_end_at_is_inclusive() -> None:
    one = plan_pass(
        OneOffTrigger(run_at=NOW),
        NOW,
        now=NOW,
        until=NOW + MINUTE,
        policy=MisfirePolicy.SKIP,
        max_lateness=MINUTE,
        catchup_cap=1,
        max_missed=10,
    )
    assert one.fire == [NOW]
    assert one.next_cursor is None
    ended = plan_pass(
        EVERY_MINUTE,
        NOW,
        now=NOW,
        until=NOW + 5 * MINUTE,
        policy=MisfirePolicy.SKIP,
        max_lateness=MINUTE,
        catchup_cap=1,
        max_missed=10,
        end_at=NOW + 2 * MINUTE,
    )
    assert ended.fire == [NOW, NOW + MINUTE, NOW + 2 * MINUTE]
    assert ended.next_cursor is None


def test_start_at_moves_the_first_fire_time() -> None:
    plan = plan_pass(
        EVERY_MINUTE,
        NOW - 5 * MINUTE,
        now=NOW,
        until=NOW + MINUTE,
        policy=MisfirePolicy.CATCH_UP,
        max_lateness=MINUTE,
        catchup_cap=10,
        max_missed=10,
        start_at=NOW,
    )
    assert plan.fire == [NOW, NOW + MINUTE]
    assert plan.missed == []


def test_unaligned_cursor_beyond_horizon_is_normalised_only() -> None:
    plan = plan_pass(
        CronTrigger(expression="0 * * * *", timezone="UTC"),
        NOW + timedelta(seconds=1),
        now=NOW,
        until=NOW + MINUTE,
        policy=MisfirePolicy.SKIP,
        max_lateness=MINUTE,
        catchup_cap=1,
        max_missed=10,
    )
    assert plan.fire == []
    assert plan.missed == []
    assert plan.next_cursor == NOW + timedelta(hours=1)
