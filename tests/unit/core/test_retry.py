"""Retry classification, full-jitter backoff bounds and the dead-letter decision (pure)."""

from __future__ import annotations

import random
import socket
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from celery_scheduler import errors
from celery_scheduler.core.retry import (
    ErrorClass,
    RetryPolicy,
    backoff_delay,
    classify,
    decide,
    http_status,
)

NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)


class HTTPError(Exception):
    def __init__(self, status: int, *, on_response: bool = False) -> None:
        super().__init__(f"HTTP {status}")
        if on_response:
            self.response = type("Response", (), {"status_code": status})()
        else:
            self.status_code = status


class PaymentDeclined(Exception):
    pass


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (TypeError("bad arg"), ErrorClass.PERMANENT),
        (ValueError("bad value"), ErrorClass.PERMANENT),
        (KeyError("missing"), ErrorClass.PERMANENT),
        (errors.ValidationError("bad"), ErrorClass.PERMANENT),
        (errors.NotJSONSerializable("x"), ErrorClass.PERMANENT),
        (ConnectionError("reset"), ErrorClass.TRANSIENT),
        (ConnectionRefusedError("refused"), ErrorClass.TRANSIENT),
        (TimeoutError("slow"), ErrorClass.TRANSIENT),
        (socket.gaierror("dns"), ErrorClass.TRANSIENT),
        (OSError("io"), ErrorClass.TRANSIENT),
        (errors.TransientError("later"), ErrorClass.TRANSIENT),
        (errors.Throttled("429"), ErrorClass.TRANSIENT),
        (HTTPError(503), ErrorClass.TRANSIENT),
        (HTTPError(500, on_response=True), ErrorClass.TRANSIENT),
        (HTTPError(429), ErrorClass.TRANSIENT),
        (HTTPError(404), ErrorClass.PERMANENT),
        (HTTPError(400, on_response=True), ErrorClass.PERMANENT),
        (RuntimeError("unknown"), ErrorClass.TRANSIENT),
        (PaymentDeclined(), ErrorClass.TRANSIENT),
    ],
)
def test_default_classification(exc: BaseException, expected: ErrorClass) -> None:
    assert classify(exc) is expected


def test_user_declared_errors_override_builtins() -> None:
    policy = RetryPolicy(permanent_errors=(PaymentDeclined,), transient_errors=(KeyError,))
    assert classify(PaymentDeclined(), policy) is ErrorClass.PERMANENT
    assert classify(KeyError("cache miss"), policy) is ErrorClass.TRANSIENT
    assert classify(ValueError("still permanent"), policy) is ErrorClass.PERMANENT


def test_http_status_ignores_non_int_attributes() -> None:
    exc = Exception()
    exc.status_code = "503"  # type: ignore[attr-defined]
    assert http_status(exc) is None
    exc.status_code = True  # type: ignore[attr-defined]
    assert http_status(exc) is None


@given(
    n=st.integers(min_value=0, max_value=200),
    base=st.floats(min_value=0.01, max_value=10),
    cap=st.floats(min_value=10, max_value=3600),
    seed=st.integers(),
)
def test_full_jitter_stays_within_zero_and_the_capped_exponential(
    n: int, base: float, cap: float, seed: int
) -> None:
    delay = backoff_delay(n, base=base, cap=cap, rng=random.Random(seed))
    assert 0 <= delay <= min(cap, base * 2 ** min(n, 64))


def test_full_jitter_covers_the_whole_window() -> None:
    """Full (not equal) jitter: delays spread over [0, ceiling], not bunched at the top."""
    rng = random.Random(7)
    delays = [backoff_delay(3, base=1, cap=100, rng=rng) for _ in range(2000)]
    assert max(delays) <= 8
    assert min(delays) < 0.5  # an equal-jitter bug would never go below 4
    assert 3.5 < sum(delays) / len(delays) < 4.5


def test_backoff_grows_exponentially_until_the_cap() -> None:
    top = type("Top", (), {"uniform": staticmethod(lambda a, b: b)})()
    ceilings = [backoff_delay(n, base=2, cap=60, rng=top) for n in range(7)]
    assert ceilings == [2, 4, 8, 16, 32, 60, 60]


def test_transient_error_retries_until_max_attempts_then_dead() -> None:
    policy = RetryPolicy(max_attempts=3, backoff_base=1, backoff_cap=10)
    rng = random.Random(1)
    outcomes = [
        decide(ConnectionError("x"), attempts_used=n, policy=policy, now=NOW, rng=rng)
        for n in (1, 2, 3)
    ]
    assert [d.retry for d in outcomes] == [True, True, False]
    assert outcomes[0].delay is not None
    assert 0 <= outcomes[0].delay <= 1
    assert outcomes[1].delay is not None
    assert 0 <= outcomes[1].delay <= 2
    assert "3 of 3 attempts" in outcomes[2].reason


def test_permanent_error_is_dead_on_the_first_attempt() -> None:
    decision = decide(TypeError("x"), attempts_used=1, policy=RetryPolicy(), now=NOW)
    assert not decision.retry
    assert decision.error_class is ErrorClass.PERMANENT


def test_retry_past_the_deadline_is_dead() -> None:
    policy = RetryPolicy(max_attempts=10, backoff_base=100, backoff_cap=100)
    top = random.Random()
    top.uniform = lambda a, b: b  # type: ignore[method-assign]
    inside = decide(
        TimeoutError(), attempts_used=1, policy=policy, now=NOW,
        deadline=NOW + timedelta(seconds=101), rng=top,
    )  # fmt: skip
    past = decide(
        TimeoutError(), attempts_used=1, policy=policy, now=NOW,
        deadline=NOW + timedelta(seconds=99), rng=top,
    )  # fmt: skip
    assert inside.retry
    assert not past.retry
    assert "deadline" in past.reason


def test_invalid_policies_are_rejected() -> None:
    with pytest.raises(errors.InvalidPolicy):
        RetryPolicy(max_attempts=0)
    with pytest.raises(errors.InvalidPolicy):
        RetryPolicy(backoff_base=10, backoff_cap=5)
