"""Differential test: the dispatcher against a sorted-list reference model.

Random submit / replace / cancel / advance / pop_due / drain sequences must dispatch exactly
what the model dispatches, in the same order; nothing future, nothing canceled and no stale
version is ever dispatched; the stale/live bound holds after every step.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.core.dispatcher import Dispatcher

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
IDS = st.sampled_from([f"occ-{n}" for n in range(8)])
# Whole and half seconds around "now" so ties on available_at are frequent.
OFFSETS = st.integers(min_value=-6, max_value=40).map(lambda half: half / 2)
PRIORITIES = st.integers(min_value=-2, max_value=2)


@dataclass(frozen=True)
class Token:
    """What is dispatched: an id plus the submit that produced it, to catch stale versions."""

    item_id: str
    submit_no: int


@dataclass(frozen=True)
class ModelEntry:
    token: Token
    available_at: datetime
    priority: int
    sequence: int

    @property
    def key(self) -> tuple[datetime, int, int]:
        return (self.available_at, -self.priority, self.sequence)


class DispatcherModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FrozenClock(T0)
        self.model: list[ModelEntry] = []  # the reference: a plain list, sorted when read
        self.sequence = 0
        self.canceled_or_replaced: set[Token] = set()
        self.dispatched: list[Token] = []
        self.factor = 2.0
        self.dispatcher: Dispatcher[Token] = Dispatcher(rebuild_factor=self.factor)

    @initialize(factor=st.sampled_from([0.5, 1.0, 2.0, 3.0]))
    def choose_rebuild_factor(self, factor: float) -> None:
        self.factor = factor
        self.dispatcher = Dispatcher(rebuild_factor=factor)

    def _live(self, item_id: str) -> ModelEntry | None:
        return next((e for e in self.model if e.token.item_id == item_id), None)

    def _sorted(self) -> list[ModelEntry]:
        return sorted(self.model, key=lambda e: e.key)

    @rule(item_id=IDS, offset=OFFSETS, priority=PRIORITIES)
    def submit(self, item_id: str, offset: float, priority: int) -> None:
        token = Token(item_id, self.sequence)
        when = self.clock.now() + timedelta(seconds=offset)
        old = self._live(item_id)
        if old is not None:
            self.model.remove(old)
            self.canceled_or_replaced.add(old.token)
            event("replace")
        self.model.append(ModelEntry(token, when, priority, self.sequence))
        self.sequence += 1
        assert self.dispatcher.submit(item_id, token, when, priority) is True

    @rule(item_id=IDS)
    def cancel(self, item_id: str) -> None:
        old = self._live(item_id)
        if old is not None:
            self.model.remove(old)
            self.canceled_or_replaced.add(old.token)
        assert self.dispatcher.cancel(item_id) is (old is not None)

    @rule(seconds=st.sampled_from([0, 0.25, 0.5, 1, 3, 10]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule(limit=st.none() | st.integers(min_value=1, max_value=3))
    def pop_due(self, limit: int | None) -> None:
        now = self.clock.now()
        expected = [e for e in self._sorted() if e.available_at <= now]
        if limit is not None:
            expected = expected[:limit]
        got = self.dispatcher.pop_due(now, limit)
        live_by_token = {e.token: e for e in self.model}
        for token in got:
            assert token not in self.canceled_or_replaced, f"stale/canceled {token} dispatched"
            assert live_by_token[token].available_at <= now, f"future {token} dispatched"
        assert got == [e.token for e in expected]
        for entry in expected:
            self.model.remove(entry)
        self.dispatched.extend(got)

    @rule()
    def drain(self) -> None:
        assert self.dispatcher.drain_pending() == [e.token for e in self._sorted()]
        self.model.clear()

    @invariant()
    def same_live_set_and_head(self) -> None:
        assert len(self.dispatcher) == len(self.model)
        head = self._sorted()[0].available_at if self.model else None
        assert self.dispatcher.next_due_at() == head

    @invariant()
    def stale_entries_stay_bounded(self) -> None:
        stats = self.dispatcher.stats()
        assert stats.stale >= 0
        assert stats.stale <= self.factor * stats.live
        if stats.rebuilds:
            event("rebuilt")

    @invariant()
    def nothing_dispatched_twice(self) -> None:
        assert len(set(self.dispatched)) == len(self.dispatched)


DispatcherModel.TestCase.settings = settings(
    max_examples=300, stateful_step_count=60, deadline=None
)
TestDispatcherModel = DispatcherModel.TestCase


def test_model_exercises_rebuilds() -> None:
    """Guard against a state machine that never reaches the rebuild path."""
    d: Dispatcher[int] = Dispatcher(rebuild_factor=1.0)
    for i in range(6):
        d.submit(i, i, T0)
    for i in range(4):
        d.cancel(i)
    assert d.stats().rebuilds >= 1
    assert d.stale_count <= len(d)
