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
