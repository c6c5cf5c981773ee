"""Publisher adapter over a Celery app: ``app.send_task`` with one pooled producer per batch.

Every occurrence goes out as the wrapper task ``celery_scheduler.run_occurrence`` with
``task_id = occurrence id``. Routing follows the *real* task: the schedule's queue if it
names one, else whatever Celery would choose for a direct call of the real task
(``task_routes``, the task's own ``queue`` option), else the default queue, so adopting
the scheduler does not move work between queues.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from kombu.exceptions import KombuError

from celery_scheduler import errors
from celery_scheduler.publishers import RUN_OCCURRENCE_TASK, OccurrenceMessage

logger = logging.getLogger(__name__)


def _broker_errors() -> tuple[type[BaseException], ...]:
    found: list[type[BaseException]] = [KombuError, OSError]
    # kombu wraps most transport errors, but not on every code path.
    try:  # deferred (optional dependency): redis-py comes with the redis extra
        from redis.exceptions import RedisError

        found.append(RedisError)
    except ImportError:  # pragma: no cover - redis is a dependency
        pass
    return tuple(found)


_BROKER_ERRORS = _broker_errors()

#: Bounded: a broker that stays down must surface as CoordinationUnavailable so the beat
#: loop backs off (and the rows stay unsent), not hang the loop.
DEFAULT_RETRY_POLICY: dict[str, float] = {
    "max_retries": 3,
    "interval_start": 0,
    "interval_step": 0.2,
    "interval_max": 1.0,
}


class CeleryPublisher:
    """Implements :class:`celery_scheduler.publishers.Publisher` with ``app.send_task``."""

    def __init__(
        self,
        app: Any,
        *,
        retry_policy: dict[str, float] | None = None,
        timeout: float | None = None,
    ) -> None:
        self.app = app
        self.retry_policy = dict(DEFAULT_RETRY_POLICY if retry_policy is None else retry_policy)
        #: kombu's publish timeout (seconds) per message; None: kombu's default.
        self.timeout = timeout

    def route_for(self, message: OccurrenceMessage) -> dict[str, Any]:
        """Routing options (``queue`` etc.) for the message, computed for the real task."""
        if message.queue:
            return {"queue": message.queue}
        options: dict[str, Any] = {}
        task_type = self.app.tasks.get(message.task)
        own_queue = getattr(task_type, "queue", None) if task_type is not None else None
        if own_queue:
            options["queue"] = own_queue
        route: dict[str, Any] = self.app.amqp.router.route(
            options, message.task, list(message.args), dict(message.kwargs), task_type
        )
        return route

    def publish(self, messages: Sequence[OccurrenceMessage]) -> None:
        if not messages:
            return
        try:
            with self.app.producer_or_acquire() as producer:
                for message in messages:
                    self._send(message, producer)
        except errors.SchedulerError:
            raise
        except _BROKER_ERRORS as exc:
            raise errors.CoordinationUnavailable(
                f"broker did not accept a batch of {len(messages)} occurrence message(s): "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    def _send(self, message: OccurrenceMessage, producer: Any) -> None:
        options = self.route_for(message)
        # The schedule's priority, else the user task's own (as its apply_async would use).
        priority = message.priority or getattr(self.app.tasks.get(message.task), "priority", None)
        if priority:
            options["priority"] = priority
        self.app.send_task(
            RUN_OCCURRENCE_TASK,
            kwargs=message.task_kwargs(),
            task_id=message.task_id,
            shadow=message.task,  # logs, events and Flower name the user's task
            retries=message.retries,
            headers=message.headers(),
            producer=producer,
            retry=True,
            retry_policy=self.retry_policy,
            timeout=self.timeout,
            add_to_parent=False,
            **options,
        )
