"""celery_scheduler.stopping: a stop after the first publish waits for the block's end."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from types import FrameType

import pytest

from celery_scheduler.stopping import stop_deferred


@pytest.fixture
def received() -> Iterator[list[str]]:
    """SIGTERM recorded by a handler standing for Celery's (which raises SystemExit)."""
    got: list[str] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        got.append("TERM")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield got
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_stop_before_the_hold_is_delivered_at_once(received: list[str]) -> None:
    with stop_deferred():
        os.kill(os.getpid(), signal.SIGTERM)
        assert received == ["TERM"]


def test_a_stop_after_the_hold_waits_for_the_end_of_the_block(received: list[str]) -> None:
    with stop_deferred() as stopping:
        stopping.hold()
        os.kill(os.getpid(), signal.SIGTERM)
        assert received == []
    assert received == ["TERM"]


def test_a_second_stop_while_one_is_held_is_delivered_at_once(received: list[str]) -> None:
    with stop_deferred() as stopping:
        stopping.hold()
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        assert received == ["TERM"]
    assert received == ["TERM"]  # the held one went with the second


def test_the_handlers_that_were_there_come_back(received: list[str]) -> None:
    before = signal.getsignal(signal.SIGTERM)
    with stop_deferred() as stopping:
        stopping.hold()
    assert signal.getsignal(signal.SIGTERM) is before
    os.kill(os.getpid(), signal.SIGTERM)
    assert received == ["TERM"]
