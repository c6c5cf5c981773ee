"""Tasks the acceptance workers import (``celery worker -I tests.acceptance.worker_tasks``)."""

from __future__ import annotations

import os
import time

from celery import shared_task


@shared_task(name="acceptance.sleepy")
def sleepy(seconds: float) -> dict[str, int]:
    """A long body: it sleeps past its next trigger (overlap) or its lease (when stopped)."""
    time.sleep(seconds)
    return {"pid": os.getpid()}


@shared_task(name="acceptance.effect")
def effect(seconds: float = 0.0, read: str = "") -> dict[str, int]:
    """An external (never rolled back) effect: one line per run in ``ACCEPTANCE_EFFECT_FILE``.

    Before its long part it records which PostgreSQL backend its own (main thread) Django
    connection is, in ``ACCEPTANCE_BACKEND_FILE``, so a test can kill exactly that one (the
    outcome write's) or the others (the heartbeat's) from outside. ``read`` makes the body
    use its connection after the long part, in autocommit as ordinary task code does:
    ``"before"`` reads before the effect (a dead connection fails the body), ``"guarded"``
    after it, tolerating a database error (a best-effort lookup).
    """
    from django.db import DatabaseError, connection

    from celery_scheduler.tasks import current_occurrence_id
    from django_app.models import Occurrence

    occurrence_id = current_occurrence_id()
    assert occurrence_id is not None, "runs only as a scheduled occurrence"
    backend_file = os.environ.get("ACCEPTANCE_BACKEND_FILE")
    if backend_file:
        connection.ensure_connection()
        info = connection.connection.info  # psycopg 3
        with open(backend_file, "a") as fh:
            fh.write(f"{info.backend_pid}\n")
    time.sleep(seconds)
    if read == "before":
        Occurrence.objects.filter(pk=occurrence_id).exists()
    with open(os.environ["ACCEPTANCE_EFFECT_FILE"], "a") as fh:
        fh.write(f"{occurrence_id} {os.getpid()}\n")
    if read == "guarded":
        try:
            Occurrence.objects.filter(pk=occurrence_id).exists()
        except DatabaseError:
            pass
    return {"pid": os.getpid()}


@shared_task(name="acceptance.fails")
def fails(customer: int) -> None:
    """A permanent failure (bad data): the run goes DEAD, Celery reports a FAILURE."""
    raise ValueError(f"customer {customer} has no billing address")


@shared_task(name="acceptance.fails_slowly")
def fails_slowly(seconds: float) -> None:
    """Sleeps, records its pid in ``ACCEPTANCE_PID_FILE``, then fails permanently (DEAD)."""
    time.sleep(seconds)
    path = os.environ.get("ACCEPTANCE_PID_FILE")
    if path:
        with open(path, "a") as out:
            out.write(f"{os.getpid()}\n")
    raise ValueError("fails on purpose")


def _lose_first_claim_reply() -> None:
    """``ACCEPTANCE_LOSE_CLAIM_REPLY=1``: the first claim this worker makes commits, and the
    worker then sees the driver's error instead of its reply (a connection that dropped
    after the commit)."""
    from django.db import OperationalError

    from django_app.worker import claim

    real = claim._claim
    lost: list[object] = []

    def committed_then_lost(*args: object, **kwargs: object) -> object:
        result = real(*args, **kwargs)  # type: ignore[arg-type]
        if not lost:
            lost.append(result)
            raise OperationalError("server closed the connection unexpectedly")
        return result

    claim._claim = committed_then_lost  # type: ignore[assignment]


if os.environ.get("ACCEPTANCE_LOSE_CLAIM_REPLY") == "1":
    _lose_first_claim_reply()
