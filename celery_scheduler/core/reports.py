"""Counting reports that add up field by field (one materializer pass + the next, ...)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Self


class Summable:
    """Mixin for a dataclass whose fields are all counts: ``a + b`` adds each field."""

    def __add__(self, other: Self) -> Self:
        values: dict[str, Any] = {
            f.name: getattr(self, f.name) + getattr(other, f.name)
            for f in fields(self)  # type: ignore[arg-type]
        }
        return type(self)(**values)


@dataclass(frozen=True, kw_only=True)
class RelayReport(Summable):
    """Counts from one relay call.

    ``claimed``: outbox rows taken into a publishing transaction. ``published``: messages
    the broker accepted. ``marked``: outbox rows marked sent after publishing. ``dropped``:
    rows closed without publishing because the occurrence was no longer publishable
    (``invalidated`` of them were CANCELED here for an old schedule version).
    ``locked``: rows left for a later pass because their occurrence row was locked.
    ``held``: rows claimed ahead into the dispatcher. ``released``: held claims given back.
    ``throttled``: rows left for a later pass by their tenant's trigger rate.
    """

    claimed: int = 0
    published: int = 0
    marked: int = 0
    dropped: int = 0
    invalidated: int = 0
    locked: int = 0
    held: int = 0
    released: int = 0
    throttled: int = 0


@dataclass(frozen=True, kw_only=True)
class MaterializeReport(Summable):
    """Counts from one :func:`django_app.materialize.per_schedule.materialize_due` call.

    ``occurrences_created``: firing occurrences (with an outbox row) this call committed.
    ``conflicts``: occurrence inserts that hit an existing key (another node made it),
    counted even when the transaction later rolled back. ``missed``: MISSED rows committed.
    ``completed``: schedules moved to COMPLETED. ``stale_cursor``: transactions rolled back
    because the schedule's version, cursor or state changed since it was read.
    ``fenced``: transactions rolled back because the shard lease's fencing token moved on
    (the rest of that shard is skipped). ``history_jumped``: schedules whose oldest late
    fire times were passed over without a row each (more than ``max_missed_per_pass``).
    ``invalid``: schedules whose stored timing no longer validates (e.g. a time zone the
    zone database dropped); ``parked``: those of them this call moved to PARKED (with the
    reason on the row, logged once, counted in ``schedules_parked_total``); the rest proceed.
    """

    schedules_seen: int = 0
    occurrences_created: int = 0
    conflicts: int = 0
    missed: int = 0
    completed: int = 0
    stale_cursor: int = 0
    fenced: int = 0
    history_jumped: int = 0
    invalid: int = 0
    parked: int = 0
