"""Example tasks. ``create_invoice`` gets ``@idempotent_task`` once the worker side lands."""

from __future__ import annotations

import logging

from celery import shared_task

logger = logging.getLogger(__name__)


@shared_task(name="billing.ping")
def ping(message: str = "pong") -> str:
    logger.info("ping: %s", message)
    return message
