"""Deterministic identities: occurrence ids, shards and flexible-window offsets.

Every node computes the same values from the same inputs, which is what lets the
database unique constraint (not coordination) decide who materialized an occurrence,
and what gives a flexible occurrence the same ``available_at`` after retries/failover.
"""

from __future__ import annotations

import functools
import hashlib
import uuid
from datetime import UTC, datetime, timedelta

#: Namespace for occurrence ids (uuid5). Changing it would re-key every occurrence.
OCCURRENCE_NAMESPACE = uuid.UUID("6f1c4a52-8a43-4d0e-9a51-2f8f0a4f5c11")


@functools.lru_cache(maxsize=1024)
def _utc_iso(instant: datetime) -> str:
    # Cached: a planning batch names the same few instants for thousands of schedules.
    if instant.tzinfo is None:
        raise ValueError(f"scheduled_for must be timezone-aware, got naive {instant!r}")
    return instant.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def occurrence_id(schedule_id: uuid.UUID | str, version: int, scheduled_for: datetime) -> uuid.UUID:
    """The id of the occurrence of ``schedule_id`` at ``version`` for ``scheduled_for``.

    It is also the Celery task id of every message for that occurrence, so any
    duplicate delivery is recognisable by id alone.
    """
    sid = schedule_id if isinstance(schedule_id, uuid.UUID) else uuid.UUID(str(schedule_id))
    name = f"{sid}/{int(version)}/{_utc_iso(scheduled_for)}"
    return uuid.uuid5(OCCURRENCE_NAMESPACE, name)


def manual_occurrence_id(schedule_id: uuid.UUID | str, idempotency_key: str) -> uuid.UUID:
    """The id of the "run now" occurrence of ``schedule_id`` asked for with ``idempotency_key``.

    Independent of the version and the time, so a repeated request (a double click, a
    retried API call) finds the occurrence the first one created.
    """
    name = f"{uuid.UUID(str(schedule_id))}/run-now/{idempotency_key}"
    return uuid.uuid5(OCCURRENCE_NAMESPACE, name)


def _stable_hash(value: str) -> int:
    # Python's hash() is salted per process; shards must agree across processes.
    return int.from_bytes(hashlib.blake2b(value.encode(), digest_size=8).digest(), "big")


def shard_for(schedule_id: uuid.UUID | str, shard_count: int) -> int:
    """Logical shard of a schedule: ``hash(schedule_id) mod shard_count``."""
    if shard_count < 1:
        raise ValueError(f"shard_count must be >= 1, got {shard_count}")
    return _stable_hash(str(uuid.UUID(str(schedule_id)))) % shard_count


def window_offset(occ_id: uuid.UUID | str, window_seconds: int) -> timedelta:
    """Deterministic jitter inside a flexible window: ``hash(occurrence_id) mod window``."""
    if window_seconds <= 0:
        return timedelta(0)
    return timedelta(seconds=_stable_hash(str(occ_id)) % window_seconds)


def available_at(occ_id: uuid.UUID | str, scheduled_for: datetime, window_seconds: int) -> datetime:
    return scheduled_for + window_offset(occ_id, window_seconds)
