"""Example tasks: ``create_invoice`` is the daily invoice job that must never bill twice.

The ``Invoice`` table deliberately has no unique constraint on (customer, period): the
``@idempotent_task`` business key is what prevents a second invoice when a worker dies
after creating one but before the scheduler recorded the completion.

Two demo knobs make concurrency visible (the acceptance tests use them):
``BILLING_WORK_SECONDS`` (simulated work inside the body) and ``BILLING_TRACE_FILE`` (each
body appends ``<pid> <start> <end>`` wall-clock seconds, to check that runs never overlap).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from celery import shared_task

from celery_scheduler import idempotent_task
from celery_scheduler.core.clock import SYSTEM_CLOCK
from celery_scheduler.tasks import current_idempotency_key
from example_project.billing.models import Invoice

logger = logging.getLogger(__name__)


@shared_task(name="billing.ping")
def ping(message: str = "pong") -> str:
    logger.info("ping: %s", message)
    return message


@idempotent_task(
    key=lambda customer, period: f"invoice:{customer}:{period}", name="billing.create_invoice"
)
def create_invoice(customer: str, period: str) -> dict[str, Any]:
    """Create the invoice of ``customer`` for ``period`` (e.g. ``2026-03``), once."""
    started = SYSTEM_CLOCK.now().timestamp()
    SYSTEM_CLOCK.sleep(float(os.environ.get("BILLING_WORK_SECONDS", "0") or 0))
    invoice = Invoice.objects.create(customer=customer, period=period, amount_cents=1000)
    trace = os.environ.get("BILLING_TRACE_FILE")
    if trace:
        with open(trace, "a") as fh:
            fh.write(f"{os.getpid()} {started} {SYSTEM_CLOCK.now().timestamp()}\n")
    logger.info("invoice %s created for %s %s", invoice.pk, customer, period)
    return {"invoice_id": invoice.pk, "key": current_idempotency_key()}
