"""Tenant rates hold for the tenant, across shards and beat processes (issue 9, hole 4).

Two real ``celery beat`` processes share four shards of one PostgreSQL database and one
Redis broker. Two tenants:

- ``rated`` has ``max_trigger_rate`` R: a stream of pre-materialized rows comes due at ten
  a second on every shard (the burst relay claims them ahead; those already due when the
  beats start are a backlog for the polling path). Whatever the relay and however many
  processes publish, the tenant's messages are accepted at most R a second (plus the
  one-second burst the bucket holds).
- ``catchy`` has ``catchup_rate`` C (per minute) and a backlog of late CATCH_UP fire times
  on every shard. The releases (``available_at`` of the late occurrences) are spaced at
  least 60 / C seconds apart for the tenant as a whole, and the publishes follow them.

Both are measured over sliding windows long enough that a per-process or per-shard budget
shows as a multiple of the rate. Run with the burst relay and the set-based materializer
(the PostgreSQL + Redis defaults), and with the lookahead relay and the per-schedule
materializer.
"""

from __future__ import annotations

import itertools
import time
import uuid
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from celery_scheduler.core.clock import SYSTEM_CLOCK
from celery_scheduler.core.enums import OccurrenceState
from django_app.models import Occurrence, OutboxEntry, Schedule, Tenant
from tests.acceptance import support

pytestmark = [
    pytest.mark.concurrent_db,
    pytest.mark.redis,
    pytest.mark.acceptance,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(300),
]

BEATS = 2
SHARDS = 4
#: ``rated``: messages a second; its rows come due at STREAM_RATE a second for STREAM_SECONDS.
RATE = 2
STREAM_RATE = 10
STREAM_SECONDS = 40
#: ``catchy``: late occurrences released per minute; late fire times per schedule.
CATCHUP_RATE = 30
CATCHUP_SCHEDULES = 8
CATCHUP_CAP = 5
#: How long the publishes are observed once the first one landed.
OBSERVE = 36.0
WINDOW = 10.0


def max_in_window(times: list[datetime], window: float) -> int:
    """The most ``times`` that fall in any half-open window of ``window`` seconds."""
    ordered = sorted(times)
    best, lo = 0, 0
    for hi, at in enumerate(ordered):
        while (at - ordered[lo]).total_seconds() >= window:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def seed_stream(tenant: Tenant, start: datetime) -> None:
    """Occurrences + outbox rows due from ``start`` at STREAM_RATE a second, on every shard."""
    schedules = [
        Schedule.objects.create(  # type: ignore[misc]  # next_run_at: a property
            tenant=tenant,
            name=f"stream-{shard}",
            task="billing.ping",
            kind="CRON",
            cron="0 0 1 1 *",
            shard=shard,
            next_run_at=None,
        )
        for shard in range(SHARDS)
    ]
    count = STREAM_RATE * STREAM_SECONDS
    occurrences = Occurrence.objects.bulk_create(
        Occurrence(
            id=uuid.uuid4(),
            schedule=schedules[i % SHARDS],
            schedule_version=1,
            tenant=tenant,
            scheduled_for=start + timedelta(seconds=i / STREAM_RATE),
            available_at=start + timedelta(seconds=i / STREAM_RATE),
            state=OccurrenceState.SCHEDULED.value,
        )
        for i in range(count)
    )
    OutboxEntry.objects.bulk_create(
        OutboxEntry(occurrence=o, tenant=tenant, shard=i % SHARDS, available_at=o.available_at)
        for i, o in enumerate(occurrences)
    )


def seed_backlog(tenant: Tenant, now: datetime) -> None:
    """Per-minute CATCH_UP schedules, ten minutes behind, spread over the shards."""
    behind = now.replace(second=0, microsecond=0) - timedelta(minutes=10)
    for i in range(CATCHUP_SCHEDULES):
        Schedule.objects.create(  # type: ignore[misc]  # next_run_at: a property
            tenant=tenant, name=f"late-{i}", task="billing.ping", kind="CRON",
            cron="* * * * *", shard=i % SHARDS, next_run_at=behind,
            misfire_policy="CATCH_UP", catchup_cap=CATCHUP_CAP, max_lateness_seconds=1,
        )  # fmt: skip


@pytest.fixture
def env(redis_url: str, request: pytest.FixtureRequest) -> dict[str, str]:
    burst, bulk = request.param
    return support.process_env(
        redis_url,
        CELERY_SCHEDULER_SHARDS=str(SHARDS),
        CELERY_SCHEDULER_BURST_RELAY=burst,
        CELERY_SCHEDULER_BULK_MATERIALIZE=bulk,
        PYTHONPATH=str(support.ROOT),
    )


@pytest.mark.parametrize(
    "env",
    [
        # PostgreSQL's own paths: elsewhere the switches fall back to the portable ones,
        # which the second case runs.
        pytest.param(("1", "1"), marks=pytest.mark.postgres),
        ("0", "0"),
    ],
    ids=["burst-relay+bulk-materializer", "lookahead-relay+per-schedule"],
    indirect=True,
)
def test_rates_hold_for_the_tenant_across_shards_and_processes(
    env: dict[str, str], tmp_path: Path
) -> None:
    rated = Tenant.objects.create(slug="rated", max_trigger_rate=RATE)
    catchy = Tenant.objects.create(slug="catchy", catchup_rate=CATCHUP_RATE)
    now = SYSTEM_CLOCK.now()
    seed_stream(rated, now + timedelta(seconds=10))
    seed_backlog(catchy, now)
    logs = [tmp_path / f"beat{n}.log" for n in range(BEATS)]
    processes = [support.start_beat(env, log) for log in logs]
    with support.running(*processes):
        sent = Occurrence.objects.filter(enqueued_at__isnull=False)
        first = support.wait_until(
            lambda: sent.filter(tenant=rated).order_by("enqueued_at").first(),
            timeout=90,
            what="the first publish of the rated tenant",
        )
        # Observe from the first publish on, long enough for several windows.
        deadline = first.enqueued_at + timedelta(seconds=OBSERVE)
        while SYSTEM_CLOCK.now() < deadline:
            for process, log in zip(processes, logs, strict=True):
                assert process.poll() is None, f"a beat died:\n{support.tail(log)}"
            time.sleep(0.5)
        # (Both filters exclude a NULL enqueued_at; ``is not None`` only says so to mypy.)
        rated_times = [
            t
            for t in sent.filter(tenant=rated, enqueued_at__lte=deadline).values_list(
                "enqueued_at", flat=True
            )
            if t is not None
        ]
        late = Occurrence.objects.filter(
            tenant=catchy,
            # Late when the beats materialized them (they start after ``now``).
            scheduled_for__lte=now,
            state__in=[OccurrenceState.SCHEDULED.value, OccurrenceState.ENQUEUED.value],
        )
        releases = sorted(late.values_list("available_at", flat=True))
        catchy_times = [
            t
            for t in late.filter(enqueued_at__isnull=False).values_list("enqueued_at", flat=True)
            if t is not None
        ]
        nodes = set(
            OutboxEntry.objects.filter(tenant=rated, sent_at__isnull=False).values_list(
                "claimed_by", flat=True
            )
        )
    beats = {n.split("/")[0] for n in nodes if n.startswith("beat@")}
    span = (max(rated_times) - min(rated_times)).total_seconds()
    busiest = max_in_window(rated_times, WINDOW)
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(releases)]
    catchy_busiest = max_in_window(catchy_times, 20.0)
    print(
        f"\nrated (R={RATE}/s): {len(rated_times)} published in {span:.1f}s by "
        f"{len(beats)} beat(s), busiest {WINDOW:g}s window "
        f"{busiest}; catchy (C={CATCHUP_RATE}/min): {len(releases)} late releases, smallest "
        f"gap {min(gaps, default=0):.3f}s, busiest 20s window {catchy_busiest}"
    )
    # The relays really competed for the tenant's rows (else this proves nothing).
    assert len(rated_times) >= RATE * OBSERVE * 0.6
    # At most R a second over the window, plus the one-second burst the bucket holds and
    # one second for a wave's publish after its tokens were taken.
    assert busiest <= RATE * (WINDOW + 1) + RATE
    assert len(rated_times) <= RATE * (span + 1) + RATE
    # Catch-up: one release per 60 / C seconds for the tenant, whatever shard or beat.
    # (CATCHUP_CAP each, or one fewer if a minute began before the beats' first pass.)
    assert len(releases) >= CATCHUP_SCHEDULES * (CATCHUP_CAP - 1)
    assert min(gaps) >= 60 / CATCHUP_RATE - 0.001
    # The publishes follow the slots: a 20 s window spans at most 11 slots (both ends), and
    # one more if a publish lagged its slot by over a slot (a loaded machine).
    assert catchy_busiest <= 20 * CATCHUP_RATE / 60 + 2
