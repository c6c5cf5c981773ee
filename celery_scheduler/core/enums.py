"""Policy and state vocabularies shared by every layer (stored as these string values)."""

from __future__ import annotations

from enum import StrEnum


class ScheduleKind(StrEnum):
    CRON = "CRON"
    INTERVAL = "INTERVAL"
    ONE_OFF = "ONE_OFF"


class ScheduleState(StrEnum):
    ACTIVE = "ACTIVE"
    PAUSED = "PAUSED"
    CANCELED = "CANCELED"
    COMPLETED = "COMPLETED"
    #: The stored timing cannot be planned (e.g. a zone the zone database dropped): the
    #: materializer skips it until resume/update gives it a valid timing again.
    PARKED = "PARKED"


class MisfirePolicy(StrEnum):
    """What to do with fire times found in the past after downtime."""

    SKIP = "SKIP"  # late beyond max_lateness -> MISSED; within it -> fire
    FIRE_ONCE = "FIRE_ONCE"  # fire only the latest missed one, mark the rest MISSED
    CATCH_UP = "CATCH_UP"  # fire at most catchup_cap of them (the latest), mark the rest MISSED


class OverlapPolicy(StrEnum):
    ALLOW = "ALLOW"
    SKIP_IF_RUNNING = "SKIP_IF_RUNNING"
    QUEUE_ONE = "QUEUE_ONE"


class OccurrenceState(StrEnum):
    SCHEDULED = "SCHEDULED"
    ENQUEUED = "ENQUEUED"
    RUNNING = "RUNNING"
    RETRY_WAIT = "RETRY_WAIT"
    SUCCEEDED = "SUCCEEDED"
    DEAD = "DEAD"
    MISSED = "MISSED"
    CANCELED = "CANCELED"
    SKIPPED_OVERLAP = "SKIPPED_OVERLAP"


class AttemptOutcome(StrEnum):
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"  # permanent failure: occurrence went DEAD
    RETRY = "RETRY"  # transient failure: a new attempt follows
    LOST = "LOST"  # lease expired; a newer attempt took over
    STALE = "STALE"  # schedule version changed or occurrence canceled before the body ran


class DstGap(StrEnum):
    """What a cron does with a local wall time that does not exist (spring forward)."""

    SKIP = "SKIP"  # no run for that wall time (the default, and the contract before 0018)
    SHIFT = "SHIFT"  # one run at the first existing instant after the gap


class DstFold(StrEnum):
    """What a cron does with a local wall time that happens twice (fall back)."""

    FIRST = "FIRST"  # one run, at the earlier instant (the default)
    SECOND = "SECOND"  # one run, at the later instant
    BOTH = "BOTH"  # two runs, one at each instant
