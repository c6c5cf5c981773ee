"""One behaviour suite over every relay: what a user is promised holds on each path.

The beat runs one of two relays: the **burst relay** (the default on PostgreSQL with a Redis
or RabbitMQ broker: claims and prepares ahead, publishes each wave at its instant) and the
**lookahead relay** (everywhere else: SQLite, MySQL/MariaDB, other brokers). Every test
below runs against each relay of the ``relay`` fixture (``tests/contracts.py``), through the
interface the beat loop uses (``poll``, ``publish_held``, ``next_due_at``), on a frozen clock:

- each row is published once and never before its time;
- a crash between the publish and the mark publishes the same ids again, and marks once;
- a cancel committed before the wave is held is never published;
- a cancel racing a wave that is publishing waits for it, then nothing more goes out;
- under contention, each tenant's share of the publish order follows its ``relay_weight``;
- a tenant's trigger rate holds: never more than its bucket allows, the rest later;
- the SLO metrics (``published_total``, ``schedule_lag_seconds``) are observed.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import pytest
from django.db import connection

from celery_scheduler import api, metrics
from celery_scheduler.core.clock import FrozenClock, SystemClock
from celery_scheduler.core.enums import OccurrenceState
from celery_scheduler.errors import CoordinationUnavailable
from celery_scheduler.publishers import OccurrenceMessage, RecordingPublisher
from django_app.models import Occurrence, OutboxEntry, Schedule, Tenant
from django_app.relay.batch import RelayReport
from django_app.worker import finish
from tests.contracts import RelayFactory

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
pytestmark = pytest.mark.django_db(transaction=True)


class Relay(Protocol):
    """What the beat loop calls on a relay (both relays provide it)."""

    token: str

    def poll(self) -> RelayReport: ...
    def publish_held(self) -> RelayReport: ...
    def next_due_at(self) -> datetime | None: ...


class TimedPublisher(RecordingPublisher):
    """Records the clock's time of every publish call; can block inside one."""

    def __init__(self, clock: FrozenClock, gate: threading.Event | None = None) -> None:
        super().__init__()
        self.clock = clock
        self.calls: list[tuple[datetime, float, list[OccurrenceMessage]]] = []
        self.entered = threading.Event()
        self.gate = gate

    def publish(self, messages: Sequence[OccurrenceMessage]) -> None:
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(30)
        super().publish(messages)
        self.calls.append((self.clock.now(), time.monotonic(), list(messages)))


def seed(tenant: Tenant, at: datetime, count: int) -> Schedule:
    """``count`` due occurrences of one schedule of ``tenant`` at ``at``, with outbox rows
    (bulk: the fairness test needs 100,000)."""
    schedule = Schedule.objects.create(
        tenant=tenant, name=f"s-{uuid.uuid4().hex[:8]}", task="billing.ping", kind="CRON",
        cron="* * * * *",
    )  # fmt: skip
    occurrences = Occurrence.objects.bulk_create(
        (
            Occurrence(
                id=uuid.uuid4(),
                schedule=schedule,
                schedule_version=1,
                tenant=tenant,
                # Distinct times for the (schedule, version, time) key; the row is due at ``at``.
                scheduled_for=at - timedelta(microseconds=i),
                available_at=at,
                state=OccurrenceState.SCHEDULED.value,
                created_at=NOW - timedelta(minutes=1),
            )
            for i in range(count)
        ),
        batch_size=10_000,
    )
    OutboxEntry.objects.bulk_create(
        (OutboxEntry(occurrence=o, tenant=tenant, available_at=at) for o in occurrences),
        batch_size=10_000,
    )
    return schedule


def unsent() -> int:
    return OutboxEntry.objects.filter(sent_at__isnull=True).count()


def drive(relay: Relay, clock: FrozenClock, *, until: datetime, step: float = 0.25) -> None:
    """The beat loop's part on a frozen clock: poll, publish each held wave at its time,
    step the clock; until nothing is left unsent or the clock passed ``until``."""
    while clock.now() <= until:
        relay.poll()
        while (at := relay.next_due_at()) is not None and at <= until:
            clock.set(max(at, clock.now()))
            relay.publish_held()
        if unsent() == 0:
            return
        clock.advance(step)


def tenant(slug: str, **fields: Any) -> Tenant:
    return Tenant.objects.create(slug=slug, **fields)


def test_each_row_is_published_once_never_before_its_time(relay: RelayFactory) -> None:
    a, b = tenant("a"), tenant("b")
    seed(a, NOW, 40)
    seed(b, NOW, 40)
    seed(a, NOW + timedelta(milliseconds=500), 15)
    seed(b, NOW + timedelta(seconds=3), 10)
    clock = FrozenClock(NOW - timedelta(seconds=10))
    publisher = TimedPublisher(clock)
    running = relay(clock, publisher, "n1")
    drive(running, clock, until=NOW + timedelta(seconds=10))

    due = dict(Occurrence.objects.values_list("id", "available_at"))
    assert Counter(publisher.task_ids) == Counter({str(i): 1 for i in due})
    accepted: dict[str, datetime] = {}
    for at, _, messages in publisher.calls:
        assert all(at >= due[uuid.UUID(m.task_id)] for m in messages)
        accepted.update((m.task_id, at) for m in messages)
    assert publisher.calls[0][0] == NOW  # the first wave goes out at its instant
    assert unsent() == 0
    # Marked with the time the broker accepted each message, once.
    for occ in Occurrence.objects.select_related("outbox"):
        assert occ.state == OccurrenceState.ENQUEUED
        assert occ.enqueued_at == accepted[str(occ.id)]
        assert occ.outbox.sent_at == occ.enqueued_at
        assert occ.outbox.publish_count == 1
    running.poll()  # nothing left, nothing re-published
    assert len(publisher.sent) == len(due)


class _Crash(BaseException):
    """Stands in for SIGKILL at a fault point: nothing after it runs, nothing commits."""


@pytest.mark.parametrize("point", ["relay.after_publish", "relay.before_mark"])
def test_a_crash_between_publish_and_mark_republishes_the_same_ids(
    relay: RelayFactory, point: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed(tenant("a"), NOW, 30)
    clock = FrozenClock(NOW - timedelta(seconds=10))
    publisher = TimedPublisher(clock)
    first_relay = relay(clock, publisher, "n1")

    def crash(name: str) -> None:
        if name == point:
            raise _Crash(name)

    monkeypatch.setattr(sys.modules[type(first_relay).__module__], "fault_point", crash)
    with pytest.raises(_Crash):
        drive(first_relay, clock, until=NOW + timedelta(seconds=5))
    first = publisher.task_ids
    assert first  # the broker accepted messages...
    assert unsent() == 30  # ...whose marks died with the transaction

    monkeypatch.undo()
    # A fresh process, after every claim of the dead one expired.
    clock.advance(60)
    drive(relay(clock, publisher, "n2"), clock, until=clock.now() + timedelta(5))
    again = Counter(publisher.task_ids)
    ids = {str(i) for i in Occurrence.objects.values_list("id", flat=True)}
    assert set(again) == ids
    assert all(again[i] == 1 + (i in first) for i in ids)  # the same ids, once more
    assert unsent() == 0
    assert set(OutboxEntry.objects.values_list("publish_count", flat=True)) == {1}


def test_a_cancel_committed_before_the_hold_is_never_published(relay: RelayFactory) -> None:
    a = tenant("a")
    schedules = [seed(a, NOW, 4) for _ in range(5)]
    clock = FrozenClock(NOW - timedelta(seconds=2))
    publisher = TimedPublisher(clock)
    first_relay = relay(clock, publisher, "n1")
    first_relay.poll()  # claimed (and, on the burst relay, prepared) with the old version
    assert OutboxEntry.objects.exclude(claimed_by="").exists()
    for schedule in schedules[:2]:
        api.cancel_schedule(schedule.id, clock=clock)
    drive(first_relay, clock, until=NOW + timedelta(seconds=5))

    canceled = Occurrence.objects.filter(schedule__in=schedules[:2])
    assert not {str(o.id) for o in canceled} & set(publisher.task_ids)
    assert set(canceled.values_list("state", flat=True)) == {OccurrenceState.CANCELED.value}
    kept = Occurrence.objects.filter(schedule__in=schedules[2:]).values_list("id", flat=True)
    assert Counter(publisher.task_ids) == Counter({str(i): 1 for i in kept})


@pytest.mark.concurrent_db
def test_a_cancel_racing_a_publishing_wave_waits_for_it_then_nothing_goes_out(
    relay: RelayFactory,
) -> None:
    a = tenant("a")
    schedules = [seed(a, NOW, 1) for _ in range(10)]
    clock = FrozenClock(NOW - timedelta(seconds=2))
    gate = threading.Event()
    publisher = TimedPublisher(clock, gate)
    first_relay = relay(clock, publisher, "n1")
    failures: list[BaseException] = []
    canceled_at: list[float] = []

    def run(target: Callable[[], object]) -> threading.Thread:
        def body() -> None:
            try:
                target()
            except BaseException as exc:
                failures.append(exc)
            finally:
                connection.close()

        thread = threading.Thread(target=body)
        thread.start()
        return thread

    def cancel() -> None:
        api.cancel_schedule(schedules[0].id, clock=SystemClock())
        canceled_at.append(time.monotonic())

    relaying = run(lambda: drive(first_relay, clock, until=NOW + timedelta(seconds=5)))
    assert publisher.entered.wait(30)  # the relay is inside its publish, holding its locks
    canceling = run(cancel)
    canceling.join(1.0)
    assert canceling.is_alive()  # blocked until the relay commits
    gate.set()
    relaying.join(60)
    canceling.join(60)
    assert not failures, failures
    first = publisher.task_ids
    assert len(first) == 10
    assert all(mono < canceled_at[0] for _, mono, _ in publisher.calls)
    occurrence = Occurrence.objects.get(schedule=schedules[0])
    assert occurrence.state == OccurrenceState.CANCELED  # after it was ENQUEUED
    # Nothing of the canceled schedule goes out afterwards, whichever relay runs.
    later = FrozenClock(NOW + timedelta(minutes=5))
    drive(relay(later, publisher, "n2"), later, until=later.now() + timedelta(5))
    assert publisher.task_ids == first


#: The fairness test's size per relay: the burst relay orders a whole wave at once (the
#: default path at 100,000 rows due at one instant); the lookahead relay computes a window
#: function over every due row per batch of ``batch_size``, so a smaller burst keeps the
#: SQLite and MariaDB runs short while still spanning 40 batches.
FAIR_ROWS = {"burst": 100_000, "lookahead": 20_000}
FAIR_WINDOW = 5_000


def test_tenants_share_every_stretch_of_the_publish_order_by_weight(relay: RelayFactory) -> None:
    """10 tenants of weights 1..10, each with rows in proportion to its weight, all due at
    one instant, seeded tenant after tenant (the worst order for a relay that publishes by
    id): while every tenant has rows left, each stretch of 5,000 consecutive publishes
    gives each tenant its weight's share, within 10 %."""
    weights = {f"t{w:02d}": w for w in range(1, 11)}
    total = sum(weights.values())
    for slug, weight in weights.items():
        seed(tenant(slug, relay_weight=weight), NOW, FAIR_ROWS[relay.kind] * weight // total)
    # A minute ahead, as the beat's lead sizing starts such a burst: one wave.
    clock = FrozenClock(NOW - timedelta(seconds=60))
    publisher = TimedPublisher(clock)
    drive(relay(clock, publisher, "n1"), clock, until=NOW + timedelta(minutes=10))
    order = [m.tenant for m in publisher.sent]
    assert (
        len(order)
        == len(set(publisher.task_ids))
        == sum(FAIR_ROWS[relay.kind] * w // total for w in weights.values())
    )
    # Rows in proportion to the weights: every tenant has rows left until the very end.
    stretches = len(order) // FAIR_WINDOW
    assert stretches >= 3
    for n in range(stretches):
        counts = Counter(order[n * FAIR_WINDOW : (n + 1) * FAIR_WINDOW])
        for slug, weight in weights.items():
            expected = FAIR_WINDOW * weight / total
            assert abs(counts[slug] - expected) <= 0.10 * expected, (n, slug, counts)


def test_a_tenant_trigger_rate_holds_and_the_rest_goes_out_later(relay: RelayFactory) -> None:
    rated = tenant("rated", max_trigger_rate=5)
    free = tenant("free")
    seed(rated, NOW, 20)
    seed(free, NOW, 10)
    clock = FrozenClock(NOW - timedelta(seconds=5))
    publisher = TimedPublisher(clock)
    drive(relay(clock, publisher, "n1"), clock, until=NOW + timedelta(seconds=30))

    assert unsent() == 0
    sent_at = [(at, m.tenant) for at, _, messages in publisher.calls for m in messages]
    assert sorted(t for _, t in sent_at) == ["free"] * 10 + ["rated"] * 20
    assert all(at == NOW for at, t in sent_at if t == "free")  # not held back by the other
    rated_times = sorted(at for at, t in sent_at if t == "rated")
    for n, at in enumerate(rated_times, start=1):
        # A full bucket (one second of burst) at first sight, then 5 tokens a second.
        allowed = 5 + 5 * (at - NOW).total_seconds()
        assert n <= allowed + 1e-9, (n, at)
    assert rated_times[-1] >= NOW + timedelta(seconds=3)


def sample(name: str, **labels: str) -> float | None:
    """A metric's value in this process's registry (None: never set)."""
    return metrics.registry().get_sample_value(f"celery_scheduler_{name}", labels)


def test_only_a_schedules_own_first_publish_is_observed_as_lag(relay: RelayFactory) -> None:
    """A retry's publish after its backoff (and a deferred waiter's, a redelivery's) and a
    backfill's publish of a past time were observed as schedule lag: the lag SLO's p99 (and
    its alert) read every retry's backoff as lateness. They count as published only."""
    metrics.reset()
    acme = tenant("a")
    seed(acme, NOW, 10)
    retried = seed(acme, NOW, 5)
    Occurrence.objects.filter(schedule=retried).update(
        state=OccurrenceState.RETRY_WAIT.value, attempt_count=1, retry_at=NOW,
        enqueued_at=NOW - timedelta(minutes=15),
    )  # fmt: skip
    backfilled = seed(acme, NOW, 5)
    Occurrence.objects.filter(schedule=backfilled).update(manual=True, schedule_version=0)
    clock = FrozenClock(NOW - timedelta(seconds=5))
    drive(relay(clock, RecordingPublisher(), "n1"), clock, until=NOW + timedelta(5))
    assert unsent() == 0

    assert sample("published_total") == 20
    assert sample("schedule_lag_seconds_count", tenant="a") == 10


class RefusingBroker(RecordingPublisher):
    def publish(self, messages: Sequence[OccurrenceMessage]) -> None:
        raise CoordinationUnavailable("broker down")


def test_messages_the_broker_refused_are_counted(relay: RelayFactory) -> None:
    """The burst relay (the default on PostgreSQL with Redis or AMQP) never counted them:
    publish_failures_total read 0 through a whole broker outage."""
    metrics.reset()
    seed(tenant("a"), NOW, 3)
    clock = FrozenClock(NOW - timedelta(seconds=5))
    with pytest.raises(CoordinationUnavailable):
        drive(relay(clock, RefusingBroker(), "n1"), clock, until=NOW + timedelta(5))
    assert sample("publish_failures_total") == 3
    assert unsent() == 3


def test_published_rows_are_counted_and_their_lag_observed(relay: RelayFactory) -> None:
    metrics.reset()
    seed(tenant("a"), NOW, 30)
    seed(tenant("b"), NOW + timedelta(seconds=1), 10)
    # Materialized a minute ahead (``created_at`` is set on insert, so set it here).
    Occurrence.objects.update(created_at=NOW - timedelta(minutes=1))
    clock = FrozenClock(NOW - timedelta(seconds=5))
    drive(relay(clock, RecordingPublisher(), "n1"), clock, until=NOW + timedelta(5))
    assert unsent() == 0

    assert sample("published_total") == 40
    assert sample("schedule_lag_seconds_count", tenant="a") == 30
    assert sample("schedule_lag_seconds_count", tenant="b") == 10
    # Published at their instant on a frozen clock: no lag (scheduled_for is up to 40 us
    # before available_at, see ``seed``).
    assert sample("schedule_lag_seconds_sum", tenant="a") == pytest.approx(0.0, abs=0.01)
    assert sample("state_seconds_count", tenant="a", state="SCHEDULED") == 30
    # Created a minute before its instant (``seed``), enqueued at it.
    assert sample("state_seconds_sum", tenant="a", state="SCHEDULED") == pytest.approx(
        30 * 60.0, abs=30
    )


def test_a_held_row_reopened_for_a_later_time_goes_out_then_not_with_its_wave(
    relay: RelayFactory,
) -> None:
    """While a row waits in its wave, the worker side re-opens it for later (a retry's
    backoff, a deferral: ``sent_at`` NULL, a later ``available_at``, no claim; here the
    same write on a row not yet sent). It goes out at its new time, not with the wave."""
    seed(tenant("a"), NOW, 3)
    clock = FrozenClock(NOW - timedelta(seconds=10))
    publisher = TimedPublisher(clock)
    running = relay(clock, publisher, "n1")
    while running.poll() is not None and running.next_due_at() is None and clock.now() < NOW:
        clock.advance(0.25)  # until the relay holds the wave (each claims ahead its own way)
    assert running.next_due_at() is not None, "the relay never held the wave"
    assert clock.now() < NOW
    reopened = Occurrence.objects.order_by("scheduled_for").first()
    assert reopened is not None
    later = NOW + timedelta(minutes=10)
    finish.republish(reopened, later)
    drive(running, clock, until=NOW)
    assert str(reopened.id) not in publisher.task_ids
    assert len(publisher.sent) == 2
    row = OutboxEntry.objects.get(occurrence=reopened)
    assert (row.sent_at, row.available_at) == (None, later)
    clock.set(later - timedelta(seconds=10))
    drive(running, clock, until=later + timedelta(seconds=1))
    sent_at = [at for at, _, messages in publisher.calls
               for m in messages if m.task_id == str(reopened.id)]  # fmt: skip
    assert sent_at == [later]
