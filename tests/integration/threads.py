"""Racing threads with their own database connections, and a look at who waits for a lock.

Django gives every thread its own connection, so these races go through the database's
locking exactly as separate processes would.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import connection, connections, transaction
from django.db.models import QuerySet


def run_threads(*targets: Callable[[], object]) -> list[BaseException]:
    """Start all targets at once (barrier) and return what they raised."""
    barrier = threading.Barrier(len(targets))
    failures: list[BaseException] = []

    def wrap(target: Callable[[], object]) -> None:
        try:
            barrier.wait(timeout=10)
            target()
        except BaseException as exc:
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=wrap, args=(t,)) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
        assert not thread.is_alive(), "a racing thread hung"
    return failures


def lock_waiters() -> int:
    """Transactions of this database now waiting for a row lock (asked on a new connection)."""
    with connections["default"].cursor() as cur:
        if connection.vendor == "mysql":
            cur.execute("SELECT COUNT(*) FROM information_schema.innodb_trx "
                        "WHERE trx_state = 'LOCK WAIT'")  # fmt: skip
        else:
            cur.execute("SELECT COUNT(*) FROM pg_stat_activity WHERE datname = "
                        "current_database() AND wait_event_type = 'Lock'")  # fmt: skip
        return int(cur.fetchone()[0])


def wait_for_a_lock_waiter(started: threading.Event, seen: threading.Event) -> None:
    """Once ``started`` is set, set ``seen`` as soon as a transaction waits for a row lock."""
    assert started.wait(timeout=20)
    for _ in range(100):
        # Not faster: InnoDB refreshes information_schema.innodb_trx only after 100 ms
        # without a read of it.
        threading.Event().wait(0.15)
        if lock_waiters():
            seen.set()
            return


def holding(rows: QuerySet[Any], locked: threading.Event, released: threading.Event,
            why: str) -> Callable[[], None]:  # fmt: skip
    """A thread target that locks ``rows`` (as another transaction's claim would), sets
    ``locked``, and holds them until ``released`` (``why``: what failed if it never is)."""

    def hold() -> None:
        with transaction.atomic():
            list(rows.select_for_update().values_list("pk"))
            locked.set()
            assert released.wait(timeout=20), why

    return hold
