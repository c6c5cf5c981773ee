"""Deterministic per-fire-time behaviour of the chaos task, shared with the judge (pure).

Both sides hash the fire time in one canonical form, whether they hold the message's ISO
string (``...Z``) or a datetime.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime


def _canonical(scheduled_for: str | datetime) -> str:
    if isinstance(scheduled_for, str):
        scheduled_for = datetime.fromisoformat(scheduled_for.replace("Z", "+00:00"))
    return scheduled_for.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _hash(schedule_id: str, scheduled_for: str | datetime, salt: str) -> int:
    text = f"{schedule_id}/{_canonical(scheduled_for)}/{salt}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=4).digest(), "big")


def is_poisoned(schedule_id: str, scheduled_for: str | datetime) -> bool:
    """A deterministic third of a poison schedule's fire times fail until cured."""
    return _hash(schedule_id, scheduled_for, "poison") % 3 == 0


def runs_long(schedule_id: str, scheduled_for: str | datetime) -> bool:
    """One fire time in five of a schedule with a ``long`` duration takes that long."""
    return _hash(schedule_id, scheduled_for, "long") % 5 == 0
