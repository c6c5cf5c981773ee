"""Run a transaction of our own again when the database chose it as a deadlock victim.

InnoDB (MySQL 8, MariaDB) takes a shared lock on the parent row for every foreign-key check,
at once (PostgreSQL's constraints are deferred to commit and take a key-share lock that does
not block a non-key update). So the materializer's transaction, which inserts occurrences
(shared lock on their schedule row) and then moves the schedule's cursor (exclusive lock on
it), deadlocks with a lifecycle call that asked for the row's exclusive lock in between.
InnoDB rolls back the transaction that wrote less, which is the lifecycle call: it read and
locked nothing yet, so running it again once the other commits is exactly right.

Only a transaction that the wrapped call opens itself can be retried: inside the caller's
transaction the deadlock rolled back the caller's work too, and the error is theirs.
"""

from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from django.db import OperationalError, transaction

logger = logging.getLogger("celery_scheduler.dbretry")

P = ParamSpec("P")
R = TypeVar("R")

#: Attempts in all for a deadlock (MySQL error 1213, PostgreSQL SQLSTATE 40P01): the victim
#: waited for nothing, so trying again is cheap. A materializer looping over a schedule that
#: keeps changing can win several rounds in a row (5 attempts were seen to run out under the
#: lifecycle race test), so the waits between attempts grow (at most ~0.5 s in all).
DEADLOCK_TRIES = 10
#: Attempts in all after a lock wait timeout (MySQL 1205, PostgreSQL 55P03): each one has
#: already waited ``innodb_lock_wait_timeout`` (or ``lock_timeout``), so one more only.
LOCK_TIMEOUT_TRIES = 2

_MYSQL_DEADLOCK, _MYSQL_LOCK_WAIT_TIMEOUT = 1213, 1205
#: PostgreSQL SQLSTATEs: a deadlock victim, a lock not granted within ``lock_timeout``.
PG_DEADLOCK, PG_LOCK_NOT_AVAILABLE = "40P01", "55P03"
#: A relation dropped (by another process) while this one waited for its lock.
PG_UNDEFINED_TABLE = "42P01"


def lock_conflict_tries(exc: BaseException) -> int:
    """How many attempts in all ``exc`` allows: 1 (do not retry) unless it is a lock conflict."""
    if not isinstance(exc, OperationalError):
        return 1
    code = exc.args[0] if exc.args else None
    sqlstate = getattr(exc.__cause__, "sqlstate", None)
    if code == _MYSQL_DEADLOCK or sqlstate == PG_DEADLOCK:
        return DEADLOCK_TRIES
    if code == _MYSQL_LOCK_WAIT_TIMEOUT or sqlstate == PG_LOCK_NOT_AVAILABLE:
        return LOCK_TIMEOUT_TRIES
    return 1


def retry_lock_conflicts(fn: Callable[P, R]) -> Callable[P, R]:
    """Decorate a function whose whole database work is one transaction of its own.

    A deadlock victim runs again (at most :data:`DEADLOCK_TRIES` attempts in all), a lock
    wait timeout once more; any other error, and any error inside a transaction the caller
    holds, propagates unchanged.
    """

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        if transaction.get_connection().in_atomic_block:
            return fn(*args, **kwargs)
        attempt = 1
        while True:
            try:
                return fn(*args, **kwargs)
            except OperationalError as exc:
                if attempt >= lock_conflict_tries(exc):
                    raise
                logger.info(
                    "%s: lock conflict (%s), attempt %d, running it again",
                    fn.__qualname__,
                    exc,
                    attempt,
                    extra={"event": "lock_conflict_retry"},
                )
                # Apart by a random, growing wait (5 ms, 10 ms, ... at most 100 ms), so two
                # victims of one cycle do not meet again and a busy racer gets to commit.
                time.sleep(random.uniform(0, min(0.005 * 2 ** (attempt - 1), 0.1)))
                attempt += 1

    return wrapper
