"""The compact set of instants retention keeps of pruned fire times (core.timeset)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from celery_scheduler.core import timeset

instants = st.sets(st.integers(0, 4_000_000_000_000_000), max_size=40)
#: Sets that are mostly a fixed step (a schedule's fire times) with a few odd instants.
stepped = st.builds(
    lambda first, step, n, odd: {first + step * k for k in range(n)} | odd,
    st.integers(0, 10**15),
    st.sampled_from([60_000_000, 3_600_000_000, 86_400_000_000]),
    st.integers(0, 200),
    st.sets(st.integers(0, 2 * 10**15), max_size=5),
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(old=instants | stepped, new=instants | stepped, probe=instants)
def test_add_and_members_agree_with_a_plain_set(
    old: set[int], new: set[int], probe: set[int]
) -> None:
    text = timeset.add(timeset.encode(old), new)
    assert timeset.decode(text) == sorted(old | new)
    assert timeset.members(text, probe | old | new) == old | new
    assert timeset.members(text, probe) == probe & (old | new)


def test_a_fixed_step_costs_two_tokens_however_long_and_appends_in_place() -> None:
    day = 86_400_000_000
    text = timeset.encode(range(day, 366 * day, day))
    assert text.count(",") == 1
    assert timeset.add(text, [366 * day, 367 * day]).count(",") == 1


def test_instants_round_trip_to_the_microsecond() -> None:
    at = datetime(2026, 3, 2, 9, 0, 0, 123_456, tzinfo=UTC)
    assert timeset.from_int(timeset.to_int(at)) == at
    assert timeset.to_int(at + timedelta(microseconds=1)) - timeset.to_int(at) == 1
