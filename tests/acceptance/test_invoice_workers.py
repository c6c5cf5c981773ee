"""The motivating case: a daily invoice job, three workers, a cap of 1, and a worker that is
SIGKILLed after creating the invoice but before the scheduler recorded completion.

Proven with real worker processes on PostgreSQL and Redis: bodies never overlap (each body
logs its wall-clock interval), every (customer, period) gets exactly one invoice even with
duplicate deliveries, and the retry of the killed attempt returns the stored result.
"""

from __future__ import annotations

import itertools
import signal
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from celery_scheduler.core.clock import SYSTEM_CLOCK
from celery_scheduler.core.enums import AttemptOutcome
from celery_scheduler.core.enums import OccurrenceState as S
from django_app.models import Attempt, IdempotencyRecord, Occurrence
from example_project.billing.models import Invoice
from tests.acceptance.worker_harness import pumping, wait_until, workers
from tests.integration.worker_support import make_occurrence, make_schedule, message_kwargs

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.concurrent_db,
    pytest.mark.redis,
    pytest.mark.django_db(transaction=True),
]
PERIOD = "2026-03"
CUSTOMERS = ["acme", "globex", "initech", "umbrella", "hooli"]


def invoice_schedule(tenant: Any, customer: str) -> Any:
    return make_schedule(
        tenant,
        task="billing.create_invoice",
        kwargs={"customer": customer, "period": PERIOD},
        concurrency_limit=1,
        concurrency_group="invoices",
        cron="0 6 * * *",
    )


def test_three_workers_cap_one_crash_after_effect(
    tenant: Any, redis_url: str, tmp_path: Path
) -> None:
    trace = tmp_path / "bodies.txt"
    env = {"BILLING_TRACE_FILE": str(trace), "BILLING_WORK_SECONDS": "0.3"}
    due = SYSTEM_CLOCK.now() - timedelta(seconds=1)
    schedules = [invoice_schedule(tenant, c) for c in CUSTOMERS]
    first = make_occurrence(schedules[0], due, sent=False)

    with pumping(redis_url) as pump:
        # Phase 1: the first worker creates the invoice, then dies before completing.
        with workers(
            redis_url, tmp_path, ["doomed"], CELERY_SCHEDULER_FAULT="worker.after_effect", **env
        ) as (doomed,):
            doomed.process.wait(timeout=30)
            assert doomed.process.returncode == -signal.SIGKILL
        assert Invoice.objects.filter(customer="acme").count() == 1
        assert Occurrence.objects.get(pk=first.pk).state == S.RUNNING  # completion never ran

        # Phase 2: three live workers (the dead one's occurrence is reaped and republished)
        # plus the other customers' occurrences, each also delivered twice.
        others = [make_occurrence(s, due, sent=False) for s in schedules[1:]]
        occurrences = [first, *others]
        with workers(redis_url, tmp_path, ["w1", "w2", "w3"], **env):
            for occ in occurrences:
                pump.send_duplicate(message_kwargs(occ))
            wait_until(
                lambda: (
                    Occurrence.objects.filter(
                        pk__in=[o.pk for o in occurrences], state=S.SUCCEEDED
                    ).count()
                    == len(occurrences)
                ),
                timeout=60,
                what="every invoice occurrence succeeded",
            )

    for customer in CUSTOMERS:
        assert Invoice.objects.filter(customer=customer, period=PERIOD).count() == 1, customer

    # The killed attempt was lost; its retry returned the stored result, body not re-run.
    stored: Any = IdempotencyRecord.objects.get(key=f"invoice:acme:{PERIOD}").result
    assert stored["invoice_id"] == Invoice.objects.get(customer="acme").pk
    assert Occurrence.objects.get(pk=first.pk).result == stored
    attempts = list(Attempt.objects.filter(occurrence=first).order_by("number"))
    assert [a.outcome for a in attempts] == [AttemptOutcome.LOST, AttemptOutcome.SUCCEEDED]
    assert attempts[0].worker.startswith("doomed@")

    # Cap of 1 across all workers: no two bodies ever ran at the same time.
    intervals = sorted(
        (float(start), float(end), int(pid))
        for pid, start, end in (line.split() for line in trace.read_text().splitlines())
    )
    assert len(intervals) == len(CUSTOMERS)  # one body per business key, the crash included
    assert len({pid for *_, pid in intervals}) >= 2  # really spread over several workers
    for (_, prev_end, _), (next_start, _, _) in itertools.pairwise(intervals):
        assert next_start >= prev_end, intervals
