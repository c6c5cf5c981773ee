"""The bounds of :func:`django_app.db.retry.retry_lock_conflicts` (errors as drivers raise them).

That a real deadlock victim is retried is proven against the databases in
``test_lifecycle_races.py``; these pin down how often, and when never.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.db import OperationalError, transaction

from django_app.db import retry

pytestmark = pytest.mark.django_db(transaction=True)

DEADLOCK = OperationalError(1213, "Deadlock found when trying to get lock")
LOCK_WAIT_TIMEOUT = OperationalError(1205, "Lock wait timeout exceeded")
GONE = OperationalError(2006, "MySQL server has gone away")


def failing(errors: list[BaseException]) -> tuple[list[int], Callable[[], str]]:
    calls: list[int] = []

    @retry.retry_lock_conflicts
    def call() -> str:
        calls.append(1)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return "done"

    return calls, call


def test_a_deadlock_victim_runs_again_up_to_the_bound() -> None:
    calls, call = failing([DEADLOCK] * (retry.DEADLOCK_TRIES - 1))
    assert call() == "done"
    assert len(calls) == retry.DEADLOCK_TRIES

    calls, call = failing([DEADLOCK] * retry.DEADLOCK_TRIES)
    with pytest.raises(OperationalError, match="Deadlock"):
        call()
    assert len(calls) == retry.DEADLOCK_TRIES


def test_a_lock_wait_timeout_runs_once_more_only() -> None:
    calls, call = failing([LOCK_WAIT_TIMEOUT] * 5)
    with pytest.raises(OperationalError, match="Lock wait timeout"):
        call()
    assert len(calls) == retry.LOCK_TIMEOUT_TRIES == 2


def test_other_errors_and_the_callers_transaction_are_not_retried() -> None:
    calls, call = failing([GONE])
    with pytest.raises(OperationalError, match="gone away"):
        call()
    assert len(calls) == 1

    calls, call = failing([DEADLOCK])
    with pytest.raises(OperationalError, match="Deadlock"), transaction.atomic():
        call()
    assert len(calls) == 1  # the caller's transaction went with it: theirs to run again
