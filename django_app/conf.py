"""Every setting this app reads, with its default, in one place.

Settings are read on each access (not cached at import) so tests can override them.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings


@dataclass(frozen=True, kw_only=True)
class SchedulerSettings:
    #: Logical shards (schedules store their shard: after lowering it, run `manage.py reshard`;
    #: beat refuses to start until then). Keep it well above
    #: the number of beat nodes so shards can be balanced.
    shard_count: int = 64
    #: How far ahead the materializer creates occurrences under a light load (seconds).
    horizon_seconds: int = 60
    #: How far ahead it may reach when much is due: beat sizes the horizon from the
    #: schedules due before this bound and the materializing rate it measured
    #: (celery_scheduler.core.lead), so 500,000 crons due at one instant are planned minutes
    #: ahead while an everyday load keeps ``horizon_seconds`` (seconds).
    max_horizon_seconds: int = 900
    #: Rows per materializer/relay batch.
    batch_size: int = 500
    #: Lease duration for shard leases (seconds).
    lease_seconds: int = 30
    #: A relay's claim on an outbox row lapses this long after the row's time, and a relay
    #: transaction left idle this long is ended by PostgreSQL (its row locks released): a
    #: stalled beat (SIGSTOP, swapping, a frozen VM) holds strict work at most about this
    #: long before another beat publishes it (seconds).
    claim_grace_seconds: float = 2.0
    #: Every broker round trip of the beat (connect, declare, push) gives up after this; the
    #: batch stays unsent and is retried (seconds).
    publish_timeout_seconds: float = 5.0
    #: Lease duration for an occurrence claimed by a worker; renewed by heartbeat (seconds).
    occurrence_lease_seconds: int = 300
    #: An occurrence still ENQUEUED (never claimed) this long after its message was published
    #: had that message lost by the broker (restart without persistence, purged queue, worker
    #: killed before its claim): beat publishes it again under the same id. Keep it above the
    #: longest time a message may legitimately wait in the queue: an early re-publish is
    #: harmless (the claim fences the copy) but costs a message. 0 turns redelivery off.
    redelivery_timeout_seconds: int = 600
    #: Default tenant slug for schedules created without one (and for static beat entries).
    default_tenant: str = "default"
    #: Defaults applied when a schedule does not set them: the misfire threshold (seconds),
    default_max_lateness_seconds: int = 300
    #: the ``CATCH_UP`` cap (late fire times run after downtime, at most),
    default_catchup_cap: int = 10
    #: MISSED rows the materializer records per schedule per pass after downtime. Older late
    #: fire times are jumped over (the report counts the jump; no row each), so a long outage never
    #: floods the database with history.
    max_missed_per_pass: int = 1000
    #: Attempts of an occurrence before it goes DEAD, when its schedule sets none.
    default_max_attempts: int = 5
    #: Hard limits that validation enforces ("absurd" values are rejected): the widest
    #: flexible window (seconds),
    max_flexible_window_seconds: int = 24 * 3600
    #: the largest ``CATCH_UP`` cap,
    max_catchup_cap: int = 10_000
    #: the largest misfire threshold (seconds).
    max_lateness_limit_seconds: int = 30 * 24 * 3600
    #: Largest args + kwargs of a schedule, in bytes of compact JSON. They are sent in every
    #: message of every fire (and held by the burst relay), so big data belongs elsewhere.
    max_arguments_bytes: int = 64 * 1024
    #: Check the task name against the Celery app's registry at create/update.
    validate_task_names: bool = True
    #: Materialize a batch of due schedules in one transaction with set-based SQL
    #: (django_app.materialize.set_based) instead of one transaction per schedule. ``"auto"``
    #: (default): on for PostgreSQL, off elsewhere; True/1 forces it where it applies
    #: (PostgreSQL only: elsewhere the per-schedule path always runs); False/0 pins the
    #: per-schedule path. Read with :func:`bulk_materialize_enabled`.
    bulk_materialize: bool | int | str = "auto"
    #: Schedules per set-based materializer transaction.
    bulk_batch_size: int = 5000
    #: Beat uses django_app.relay.burst.BurstRelay: claims and prepares rows due within
    #: ``burst_lookahead_seconds``, locks them ``burst_hold_seconds`` before their time,
    #: publishes them pipelined at their time and marks them sent in bulk. ``"auto"``
    #: (default): on for PostgreSQL with a ``redis://``/``rediss://`` broker or an
    #: ``amqp://``/``pyamqp://``/``amqps://`` one (RabbitMQ), where a pipelined fast
    #: publisher applies (one broker URL, not a failover list); elsewhere the
    #: LookaheadRelay; True/1 forces it on PostgreSQL with any broker; False/0 pins the
    #: LookaheadRelay. Read with :func:`burst_relay_enabled`.
    burst_relay: bool | int | str = "auto"
    #: How far ahead the burst relay claims and prepares under a light load: the floor of
    #: its sized window (seconds).
    burst_lookahead_seconds: int = 30
    #: The burst relay's lookahead grows from ``burst_lookahead_seconds`` up to this when
    #: many rows are due, sized from the unsent rows within it and the claim + prepare rate
    #: it measured, so a large burst is prepared before its instant (seconds).
    burst_max_lookahead_seconds: int = 600
    #: How long before its time the burst relay locks a prepared row (seconds).
    burst_hold_seconds: int = 1
    #: Rows one burst relay holds prepared at most (more wait for a later claim, or go
    #: through the general relay once due). A held row costs about its message's size
    #: (~2 KB for a small task: ~1 GB at this bound), so this bounds the beat's memory.
    burst_max_rows: int = 500_000
    #: Beat and each worker serve /metrics, /healthz, /readyz and /status on this port
    #: (``None``: not served). The ``CELERY_SCHEDULER_METRICS_PORT`` environment variable wins.
    metrics_port: int | None = None
    #: Address the metrics server binds (``CELERY_SCHEDULER_METRICS_ADDR`` wins): all
    #: interfaces, so Prometheus and the kubelet can reach it in a pod.
    metrics_addr: str = "0.0.0.0"
    #: Requests each API token (or staff session) may make to the HTTP API, in DRF's rate
    #: form ("600/min", "20/s"); ``None``: not throttled. Over it: 429 with Retry-After.
    #: Counted in Django's default cache (per process with the local-memory cache).
    http_rate: str | None = None
    #: PostgreSQL: migration 0020 partitions a fresh install's history tables (occurrence,
    #: attempt, outbox) by time. False leaves them plain (``manage.py partitions convert``
    #: partitions them later, populated or not); read when that migration runs.
    partitioned_history: bool = True
    #: PostgreSQL: the width of one partition of the occurrence, attempt and outbox tables
    #: (hours; a divisor or multiple of 24 keeps slots on UTC midnights). Slots are aligned on
    #: the Unix epoch, so changing it leaves existing partitions as they are
    #: (docs/howto/retention-and-scale.md).
    partition_width_hours: int = 24
    #: PostgreSQL: how many slots after the current one the beats keep created (they check
    #: every few minutes; ``manage.py partitions ensure`` does the same once).
    partitions_ahead: int = 3
    #: PostgreSQL: beats drop whole partition slots that ended more than this many days ago
    #: (``None``: they never do; ``manage.py partitions drop`` still can). A slot holding rows
    #: retention must keep (unfinished, DEAD, unsent, a skip marker ahead of a cursor) is
    #: left in place and reported (docs/explanation/retention.md).
    partition_retention_days: int | None = None

    def __post_init__(self) -> None:
        # The beats act on these unattended (a retention of 0 or less would drop today's
        # history every round; a width of 0 divides by zero): refused where they are read.
        lowest = {"partition_width_hours": 1, "partitions_ahead": 0, "partition_retention_days": 1}
        for name, low in lowest.items():
            value = getattr(self, name)
            if value is None and name == "partition_retention_days":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(
                    f"CELERY_SCHEDULER[{name!r}] must be a whole number of at least {low}"
                    f"{' (or None)' if name == 'partition_retention_days' else ''}; got {value!r}"
                )


_FIELDS = SchedulerSettings.__dataclass_fields__


def get() -> SchedulerSettings:
    """Current settings: ``CELERY_SCHEDULER = {"horizon_seconds": 30, ...}`` in Django settings."""
    overrides = dict(getattr(settings, "CELERY_SCHEDULER", {}) or {})
    unknown = sorted(set(overrides) - set(_FIELDS))
    if unknown:
        raise ValueError(f"Unknown CELERY_SCHEDULER setting(s) {unknown}; known: {sorted(_FIELDS)}")
    return SchedulerSettings(**overrides)


def _switch(name: str, value: object, *, auto: bool) -> bool:
    """A tri-state setting: ``"auto"`` -> ``auto``; booleans and 0/1 as given."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return auto
    if isinstance(value, bool | int):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in {"0", "1", "true", "false"}:
        return value.strip().lower() in {"1", "true"}
    raise ValueError(f"CELERY_SCHEDULER[{name!r}] must be 'auto', true or false; got {value!r}")


def bulk_materialize_enabled(vendor: str, settings: SchedulerSettings | None = None) -> bool:
    """Whether the set-based materializer runs on a database of ``vendor`` (``settings``:
    the value the caller read; default: read now)."""
    if vendor != "postgresql":
        return False
    return _switch("bulk_materialize", (settings or get()).bulk_materialize, auto=True)


def burst_relay_enabled(
    vendor: str, broker_url: object, settings: SchedulerSettings | None = None
) -> bool:
    """Whether beat relays through BurstRelay (database ``vendor``, the app's broker URL;
    ``settings``: the value the caller read, default: read now)."""
    if vendor != "postgresql":
        return False
    fast = (
        isinstance(broker_url, str)
        and broker_url.startswith(("redis://", "rediss://", "amqp://", "pyamqp://", "amqps://"))
        and ";" not in broker_url  # a failover list: kombu picks the server
    )
    return _switch("burst_relay", (settings or get()).burst_relay, auto=fast)
