"""The default publisher for a Celery app: a fast path for the broker when there is one.

Apart from the package's ``__init__`` (the ports and the message type) so that the
adapters, which import the ports, are never imported back by it.
"""

from __future__ import annotations

from typing import Any

from celery_scheduler.publishers import AMQP_SCHEMES, REDIS_SCHEMES, Publisher
from celery_scheduler.publishers.celery import CeleryPublisher


def celery_publisher(app: Any, *, timeout: float | None = None) -> Publisher:
    """The default publisher for a Celery app.

    On a Redis broker the pipelined fast path (same bytes as kombu, one round trip per
    batch); on RabbitMQ (``amqp://``, ``pyamqp://``, ``amqps://``) the AMQP fast path
    (same messages as kombu, pipelined with publisher confirms); elsewhere
    ``app.send_task`` through kombu. redis-py comes with the ``redis`` extra, so it is
    imported only for a Redis broker. ``timeout`` bounds every broker socket wait
    (seconds; default: the broker's ``socket_timeout`` option, else 5).
    """
    url = app.conf.broker_write_url or app.conf.broker_url
    if isinstance(url, str) and url.startswith(REDIS_SCHEMES):
        # deferred (optional dependency): redis-py comes with the ``redis`` extra
        from celery_scheduler.publishers.redis_fast import publisher_for

        return publisher_for(app, timeout=timeout)
    if isinstance(url, str) and url.startswith(AMQP_SCHEMES):
        # deferred (optional dependency): py-amqp comes with the ``rabbitmq`` extra
        from celery_scheduler.publishers.amqp_fast import publisher_for as amqp_publisher_for

        return amqp_publisher_for(app, timeout=timeout)
    return CeleryPublisher(app, timeout=timeout)
