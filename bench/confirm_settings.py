"""example_project settings with RabbitMQ publisher confirms (``bench.topofhour`` ours-confirm).

kombu's py-amqp transport publishes without confirms by default: ``basic_publish`` returns
once the frame is written to the socket. With ``confirm_publish`` every publish waits for
the broker's ack, which for a persistent message on a durable queue comes after the broker
wrote it: only then does "the broker accepted it" mean it survives a broker restart.
"""

from __future__ import annotations

from example_project.settings import *  # noqa: F403

CELERY_BROKER_TRANSPORT_OPTIONS = {"confirm_publish": True}
