"""Held-row types and stage timings of :mod:`django_app.relay.burst` (PostgreSQL); its
statements are in :mod:`django_app.relay.queries`."""

from __future__ import annotations

import json
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from celery_scheduler.core.enums import OccurrenceState as S
from celery_scheduler.core.states import PUBLISHABLE, sources_of, state_values

#: The states each set-based transition moves an occurrence from: the transition table's
#: sources, narrowed to what the relay may publish (never a DEAD row a replay re-enqueues).
ENQUEUE_FROM = state_values(sources_of(S.ENQUEUED, within=PUBLISHABLE))
CANCEL_FROM = state_values(sources_of(S.CANCELED, within=PUBLISHABLE))


@dataclass(slots=True)
class HeldRow:
    """One held row: ids for the lock and the mark, and what the push needs.

    A burst holds every row of its window, so nothing else is kept: the fast publisher's
    ``PreparedMessage`` is the payload bytes and a shared list key (the full message is
    dropped after preparing), and equal ``available_at`` values share one object.
    """

    outbox_id: int
    occurrence_id: uuid.UUID
    shard: int
    tenant_id: int
    available_at: datetime
    schedule_version: int  # the schedule's version the message was built from
    prepared: Any  # PreparedMessage (fast publisher) or OccurrenceMessage
    #: The occurrence's time, the history tables' partition key (None: an outbox row from
    #: before it was kept there); equal values share one object, as ``available_at``'s.
    scheduled_for: datetime | None = None


@dataclass(slots=True)
class Wave:
    start: datetime
    rows: list[HeldRow] = field(default_factory=list)
    #: The tenants with rows in the wave (kept while adding rows, not scanned at the hold).
    tenants: set[int] = field(default_factory=set)


def due(row: HeldRow) -> datetime:
    return row.available_at


@dataclass(slots=True)
class BurstStats:
    """Rows and seconds per stage, accumulated over the relay's life (rows/s = ratio)."""

    rows: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def add(self, stage: str, rows: int, started: float) -> None:
        self.rows[stage] += rows
        self.seconds[stage] += time.perf_counter() - started

    def rates(self) -> dict[str, dict[str, float]]:
        return {
            k: {
                "rows": self.rows[k],
                "seconds": round(self.seconds[k], 3),
                "rows_per_s": round(self.rows[k] / self.seconds[k]) if self.seconds[k] else 0,
            }
            for k in self.rows
        }


def decode_json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str | bytes) else value
