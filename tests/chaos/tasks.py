"""The chaos soak's business task, written as a user would: ``@idempotent_task``.

Its effect is one row in ``chaos.effect`` (see :mod:`tests.chaos.effects`), inserted in the
same transaction as the idempotency record. The row says which occurrence ran (id, schedule,
version and scheduled_for as the worker received them in the message), for which tenant,
when the message was delivered to the worker (``task_prerun`` of the wrapper: a lower bound
of the claim), when the body started and ended, and in which process.

Bodies sleep ``duration``, or ``long`` for one fire time in five (overlap and caps).
"Poison" schedules fail permanently (``ValueError`` -> DEAD) for a deterministic third of
their fire times until the driver cures that time and replays the occurrence.
"""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime
from typing import Any

from celery.signals import task_prerun
from django.db import connection

from celery_scheduler import current_occurrence, idempotent_task
from celery_scheduler.publishers import iso_utc
from tests.chaos.effects import SCHEMA
from tests.chaos.fate import is_poisoned, runs_long

WRAPPER = "celery_scheduler.run_occurrence"
#: Delivery time of each wrapper message this process started, by task id (= occurrence id).
_delivered: dict[str, datetime] = {}


@task_prerun.connect(weak=False)
def _on_prerun(sender: Any = None, task_id: str | None = None, **_: Any) -> None:
    # A scheduled run's prerun names the user's task (the wrapper before it traced as it).
    if getattr(sender, "name", None) in (WRAPPER, "chaos.effect") and task_id:
        _delivered[str(task_id)] = datetime.now(UTC)


def note_attempt(
    occurrence_id: str, schedule_id: str, version: int, scheduled_for: str, started: datetime
) -> None:
    """Append "this body started" to this process's attempt log (outside the transaction).

    One ``write`` of one short line on an ``O_APPEND`` descriptor: a SIGKILL leaves either
    the whole line or none. The judge uses it to tell a started run that never finished.
    """
    folder = os.environ.get("CHAOS_LOG_DIR")
    if not folder:
        return
    line = json.dumps(
        {"occurrence_id": occurrence_id, "schedule_id": schedule_id, "version": version,
         "scheduled_for": scheduled_for, "started_at": started.isoformat(), "pid": os.getpid()}
    )  # fmt: skip
    fd = os.open(
        os.path.join(folder, f"attempts-{os.getpid()}.jsonl"),
        os.O_WRONLY | os.O_APPEND | os.O_CREAT,
        0o644,
    )
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@idempotent_task(name="chaos.effect")
def effect(
    label: str, tenant: str, duration: float, poison: bool = False, long: float = 0.0
) -> dict[str, Any]:
    started = datetime.now(UTC)
    # What the worker was told to run, from the run's own context (no table is consulted).
    run = current_occurrence()
    if run is None:
        raise RuntimeError("chaos.effect ran outside a scheduled occurrence")
    occurrence_id = run.occurrence_id
    schedule_id = run.schedule_id
    version = run.schedule_version
    scheduled_for = iso_utc(run.scheduled_for)  # the message's own form
    note_attempt(occurrence_id, schedule_id, version, scheduled_for, started)
    with connection.cursor() as cursor:
        if poison and is_poisoned(schedule_id, scheduled_for):
            cursor.execute(
                f"SELECT 1 FROM {SCHEMA}.cured WHERE schedule_id = %s AND scheduled_for = %s",
                [schedule_id, scheduled_for],
            )
            if cursor.fetchone() is None:
                raise ValueError(f"poisoned fire time {scheduled_for} of {label}")
        # Overlap and caps need bodies that outlast the next trigger, but a solo worker
        # sleeping is a worker lost: only some fire times run long.
        time.sleep(long if long and runs_long(schedule_id, scheduled_for) else duration)
        cursor.execute(
            f"INSERT INTO {SCHEMA}.effect (occurrence_id, schedule_id, version, scheduled_for,"
            " label, tenant, delivered_at, started_at, ended_at, pid)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            [
                occurrence_id,
                schedule_id,
                version,
                scheduled_for,
                label,
                tenant,
                _delivered.pop(occurrence_id, None),
                started,
                datetime.now(UTC),
                os.getpid(),
            ],
        )
    return {"pid": os.getpid()}
