"""Our DatabaseScheduler with the Redis fast-path publisher (the seam beat.py lacks so far).

``celery beat -S bench.fast_beat:FastDatabaseScheduler``: identical to
``celery_scheduler.beat:DatabaseScheduler`` except that the relay publishes through
:func:`celery_scheduler.publishers.redis_fast.publisher_for` (prepared envelopes, pipelined
LPUSH) instead of one ``send_task`` per message.
"""

from __future__ import annotations

from typing import Any

from celery_scheduler.beat import DatabaseScheduler
from celery_scheduler.publishers.redis_fast import publisher_for


class FastDatabaseScheduler(DatabaseScheduler):
    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("publisher", publisher_for(app))
        super().__init__(app, *args, **kwargs)
