"""A message the broker lost is published again under the same id, once, by one beat.

An occurrence that is ENQUEUED (its message accepted by the broker) and still unclaimed
``redelivery_timeout_seconds`` after that publish had its message lost (a Redis restart
without persistence, a purged queue, a worker killed between receiving and claiming): the
redelivery pass re-opens its outbox row so the relay publishes it again, same occurrence id.
The claim fences every copy, so a message that was only slow costs a duplicate delivery,
never a second run. Frozen clock throughout.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any

import pytest
from celery import Celery
from django.db import connection
from django.test.utils import CaptureQueriesContext

from celery_scheduler import api, metrics
from celery_scheduler.beat import DatabaseScheduler
from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.core.enums import OccurrenceState as S
from celery_scheduler.publishers import RecordingPublisher
from django_app.db import partitions
from django_app.models import Attempt, Occurrence, OutboxEntry
from django_app.relay import redelivery
from django_app.relay.batch import relay_due
from django_app.tasks import run_occurrence
from django_app.worker import claim, finish

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
TIMEOUT = 60
pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def short_timeout(settings: Any) -> None:
    settings.CELERY_SCHEDULER = {"redelivery_timeout_seconds": TIMEOUT}
    metrics.reset()


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(NOW)


def published_once(clock: FrozenClock, publisher: RecordingPublisher, tenant: str = "") -> Any:
    """A run-now occurrence, published by the relay at ``clock.now()``: ENQUEUED, sent."""
    schedule = api.create_schedule(
        name=f"job-{len(publisher.sent)}-{tenant}", task="billing.ping", cron="0 * * * *",
        tenant=tenant or None, clock=clock,
    )  # fmt: skip
    occ = api.run_now(schedule.id, clock=clock)
    relay_due(clock=clock, publisher=publisher)
    row = Occurrence.objects.get(pk=occ.id)
    assert row.state == S.ENQUEUED
    return row


def redelivered(tenant: str) -> float:
    return metrics.get_metrics().value("celery_scheduler_redelivered_total", tenant=tenant) or 0


def test_unclaimed_past_the_timeout_is_published_again_with_the_same_id(
    clock: FrozenClock,
) -> None:
    publisher = RecordingPublisher()
    occ = published_once(clock, publisher)

    clock.advance(TIMEOUT - 1)
    assert redelivery.redeliver_lost(clock=clock) == 0  # may just be waiting in the queue
    clock.advance(2)
    assert redelivery.redeliver_lost(clock=clock) == 1
    outbox = OutboxEntry.objects.get(occurrence_id=occ.pk)
    assert (outbox.sent_at, outbox.available_at) == (None, clock.now())
    assert redelivered("default") == 1
    assert redelivery.redeliver_lost(clock=clock) == 0  # re-opened once, not per pass

    relay_due(clock=clock, publisher=publisher)
    assert publisher.task_ids == [str(occ.pk)] * 2
    outbox.refresh_from_db()
    assert (outbox.sent_at, outbox.publish_count) == (clock.now(), 2)
    assert Occurrence.objects.get(pk=occ.pk).state == S.ENQUEUED

    # Both copies arrive (the first was only slow): the claim fences the second.
    first = claim.claim(occ.pk, worker="w1", clock=clock)
    assert first.claimed
    assert claim.claim(occ.pk, worker="w2", clock=clock).outcome is claim.ClaimOutcome.DUPLICATE
    assert first.fencing_token is not None
    finish.complete(occ.pk, first.fencing_token, clock=clock)
    assert claim.claim(occ.pk, worker="w2", clock=clock).outcome is claim.ClaimOutcome.DUPLICATE
    assert Attempt.objects.filter(occurrence_id=occ.pk).count() == 1

    clock.advance(10 * TIMEOUT)
    assert redelivery.redeliver_lost(clock=clock) == 0  # finished: nothing to recover


def test_a_message_waiting_in_a_long_queue_is_copied_at_doubling_intervals(
    clock: FrozenClock,
) -> None:
    """Workers saturated, the message only waits: each copy doubles the wait before the
    next (up to 8 x the timeout), so the copies do not grow the queue they wait in. Before
    the backoff: a copy every timeout (`assert 1 == 0` at the second pass)."""
    publisher = RecordingPublisher()
    occ = published_once(clock, publisher)
    copies_at = []
    for _ in range(60):  # 60 timeouts of a message no worker takes
        clock.advance(TIMEOUT + 1)
        if redelivery.redeliver_lost(clock=clock):
            relay_due(clock=clock, publisher=publisher)
            copies_at.append(clock.now())
    waits = [round((b - a).total_seconds() / (TIMEOUT + 1)) for a, b in pairwise(copies_at)]
    assert waits[:4] == [2, 4, 8, 8]  # in timeouts (each pass one timeout apart)
    assert set(waits[3:]) == {8}  # capped: a lost message is still recovered
    assert publisher.task_ids == [str(occ.pk)] * (1 + len(copies_at))
    assert len(copies_at) == 9  # passes 1, 3, 7, 15, 23, ... 55; without the backoff: 60


def test_copies_a_worker_received_do_not_lengthen_the_wait_for_a_lost_one(
    clock: FrozenClock,
) -> None:
    """A worker that defers an occurrence (no concurrency slot yet), retries it or loses
    its lease sends it back through the outbox: those publishes reached a worker, so they
    say nothing of a long queue. The chaos soak lost a message the broker dropped after
    three such publishes: it counted as lost only 8 timeouts later, after the run ended
    (before: `assert 0 == 1`)."""
    publisher = RecordingPublisher()
    occ = published_once(clock, publisher)
    for _ in range(3):  # received and sent back each time
        clock.advance(2)
        finish.republish(occ, clock.now())
        relay_due(clock=clock, publisher=publisher)
    assert publisher.task_ids == [str(occ.pk)] * 4
    # The broker loses the last copy (a Redis restart): one timeout, as for a first publish.
    clock.advance(TIMEOUT + 1)
    assert redelivery.redeliver_lost(clock=clock) == 1


def test_only_sent_unclaimed_enqueued_occurrences_are_redelivered(
    clock: FrozenClock, tenant: Any
) -> None:
    publisher = RecordingPublisher()
    lost = published_once(clock, publisher, tenant="acme")
    running = published_once(clock, publisher, tenant="acme")
    succeeded = published_once(clock, publisher, tenant="acme")
    deferred = published_once(clock, publisher, tenant="acme")
    retrying = published_once(clock, publisher, tenant="acme")
    running_claim = claim.claim(running.pk, worker="w", clock=clock, lease=timedelta(hours=1))
    done = claim.claim(succeeded.pk, worker="w", clock=clock)
    assert running_claim.claimed
    assert done.fencing_token is not None
    finish.complete(succeeded.pk, done.fencing_token, clock=clock)
    # Waiting for a slot / behind a running one: back in the outbox, not "sent".
    finish.republish(deferred, clock.now() + timedelta(seconds=1))
    retry = claim.claim(retrying.pk, worker="w", clock=clock)
    assert retry.fencing_token is not None
    finish.fail(retrying.pk, retry.fencing_token, "boom", retry_at=NOW + timedelta(hours=2),
                clock=clock)  # fmt: skip
    clock.advance(TIMEOUT / 2)
    recent = published_once(clock, publisher, tenant="acme")

    clock.advance(TIMEOUT / 2 + 1)
    assert redelivery.redeliver_lost(clock=clock) == 1
    unsent = OutboxEntry.objects.filter(sent_at__isnull=True)
    reopened = set(unsent.values_list("occurrence_id", flat=True))
    assert lost.pk in reopened
    assert recent.pk not in reopened
    assert Occurrence.objects.get(pk=running.pk).state == S.RUNNING
    assert redelivered("acme") == 1


def test_two_beats_redeliver_a_lost_message_once(clock: FrozenClock) -> None:
    """Beat B read the candidates before beat A re-opened and the relay re-sent them."""
    publisher = RecordingPublisher()
    occ = published_once(clock, publisher)
    clock.advance(TIMEOUT + 1)
    seen_by_b = redelivery.find_lost(clock.now(), timedelta(seconds=TIMEOUT), limit=10)
    assert [lost.occurrence_id for lost in seen_by_b] == [occ.pk]

    assert redelivery.redeliver_lost(clock=clock) == 1  # beat A
    assert redelivery.reopen(seen_by_b, clock.now()) == []  # B: not re-opened twice
    relay_due(clock=clock, publisher=publisher)
    clock.advance(1)
    assert redelivery.reopen(seen_by_b, clock.now()) == []  # nor after the re-send
    assert publisher.task_ids == [str(occ.pk)] * 2
    assert OutboxEntry.objects.get(occurrence_id=occ.pk).publish_count == 2
    assert redelivered("default") == 1


def test_a_zero_timeout_turns_redelivery_off(clock: FrozenClock, settings: Any) -> None:
    settings.CELERY_SCHEDULER = {"redelivery_timeout_seconds": 0}
    published_once(clock, RecordingPublisher())
    clock.advance(365 * 24 * 3600)
    assert redelivery.redeliver_lost(clock=clock) == 0


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("redelivery-test", set_as_current=False)
    yield app
    app.close()


def test_beat_redelivers_a_message_the_broker_lost(app: Celery, clock: FrozenClock) -> None:
    publisher = RecordingPublisher()
    schedule = api.create_schedule(name="n", task="billing.ping", cron="0 * * * *", clock=clock)
    occ = api.run_now(schedule.id, clock=clock)
    beat = DatabaseScheduler(app=app, clock=clock, publisher=publisher, use_shard_leases=False)
    beat.tick()
    assert publisher.task_ids == [str(occ.id)]
    # The broker lost it (FLUSHDB): nothing ever claims it.
    for _ in range(3):
        clock.advance(TIMEOUT / 2 + 1)
        beat._next_poll = 0.0  # poll now rather than at the next poll interval
        beat.tick()
    assert publisher.task_ids == [str(occ.id)] * 2  # once more, same id
    assert Occurrence.objects.get(pk=occ.id).state == S.ENQUEUED
    beat.close()


def test_the_wrapper_task_acks_late_and_requeues_on_a_lost_worker() -> None:
    """A worker that dies before the claim gives the message back instead of dropping it."""
    assert run_occurrence.acks_late is True
    assert run_occurrence.reject_on_worker_lost is True


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_passes_reopen_each_lost_message_once(clock: FrozenClock) -> None:
    """Two beats' passes at once, on real concurrent PostgreSQL connections."""
    import threading

    from django.db import connection

    publisher = RecordingPublisher()
    for _ in range(20):
        published_once(clock, publisher)
    clock.advance(TIMEOUT + 1)
    barrier = threading.Barrier(2)
    results: list[int] = []
    errors: list[BaseException] = []

    def beat() -> None:
        try:
            seen = redelivery.find_lost(clock.now(), timedelta(seconds=TIMEOUT), limit=100)
            assert len(seen) == 20
            barrier.wait(timeout=10)  # both read every row before either re-opens one
            results.append(len(redelivery.reopen(seen, clock.now())))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=beat) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors, errors
    assert sum(results) == 20, results
    relay_due(clock=clock, publisher=publisher)
    assert set(OutboxEntry.objects.values_list("publish_count", flat=True)) == {2}


@pytest.mark.postgres
def test_the_pass_reads_the_outbox_only_in_the_slots_of_its_rows(clock: FrozenClock) -> None:
    """Each lookup of a lost row names its time: on the partitioned history it reads the
    slots its rows fall in, not every slot's index (the pass runs every 30 s on every
    beat). Before, the outbox was looked up by occurrence id alone."""
    partitions.ensure(clock.now(), width=timedelta(days=1), ahead=1, behind=3, wait=True)
    table = OutboxEntry._meta.db_table
    past = {p.name for p in partitions.partitions(table) if p.end and p.end < clock.now()}
    assert len(past) >= 3
    published_once(clock, RecordingPublisher())
    clock.advance(TIMEOUT + 1)
    with CaptureQueriesContext(connection) as captured:
        assert redelivery.redeliver_lost(clock=clock) == 1
    statements = [q["sql"] for q in captured.captured_queries if f'"{table}"' in q["sql"]]
    assert len(statements) >= 3  # the lookup, the re-open's lock and its update
    with connection.cursor() as cur:
        for sql in statements:
            cur.execute(f"EXPLAIN {sql}")
            plan = "\n".join(row[0] for row in cur.fetchall())
            assert not [name for name in past if name in plan], (sql, plan)
