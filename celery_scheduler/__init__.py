"""A distributed Celery beat for Django. Public names are imported lazily.

``from celery_scheduler import idempotent_task`` must not import Django or Celery when the
package itself is imported (beat, the relay and the core modules import it too), so the
public names resolve on first access through the module ``__getattr__``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from celery_scheduler.tasks import (
        ScheduledRun,
        current_idempotency_key,
        current_occurrence,
        current_occurrence_id,
        idempotent_task,
    )

__all__ = [
    "ScheduledRun",
    "current_idempotency_key",
    "current_occurrence",
    "current_occurrence_id",
    "idempotent_task",
]

_LAZY = dict.fromkeys(__all__, "celery_scheduler.tasks")


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'celery_scheduler' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
