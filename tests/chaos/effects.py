"""The append-only effect log the judge trusts, in a schema of its own (``chaos``).

The scheduler never reads or writes it. The chaos task inserts one row per business effect
inside ``@idempotent_task``'s transaction, so an effect and its idempotency record commit
together or not at all: a SIGKILL or a terminated connection cannot leave half an effect.
``cured`` holds the (schedule, scheduled_for) pairs the driver fixed before replaying them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

SCHEMA = "chaos"

DDL = f"""
CREATE SCHEMA IF NOT EXISTS {SCHEMA};
CREATE TABLE IF NOT EXISTS {SCHEMA}.effect (
    id bigserial PRIMARY KEY,
    occurrence_id uuid NOT NULL,
    schedule_id uuid NOT NULL,
    version integer NOT NULL,
    scheduled_for timestamptz NOT NULL,
    label text NOT NULL,
    tenant text NOT NULL,
    delivered_at timestamptz,
    started_at timestamptz NOT NULL,
    ended_at timestamptz NOT NULL,
    pid integer NOT NULL,
    committed_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS {SCHEMA}.cured (
    schedule_id uuid NOT NULL,
    scheduled_for timestamptz NOT NULL,
    PRIMARY KEY (schedule_id, scheduled_for)
);
"""


@dataclass(frozen=True, kw_only=True)
class Effect:
    occurrence_id: str
    schedule_id: str
    version: int
    scheduled_for: datetime
    label: str
    tenant: str
    delivered_at: datetime | None
    started_at: datetime
    ended_at: datetime
    pid: int

    def brief(self) -> str:
        return (
            f"effect occ={self.occurrence_id} v{self.version} for={self.scheduled_for:%H:%M:%S.%f}"
            f" delivered={_t(self.delivered_at)} ran={_t(self.started_at)}..{_t(self.ended_at)}"
            f" pid={self.pid}"
        )


def _t(value: datetime | None) -> str:
    return "-" if value is None else f"{value:%H:%M:%S.%f}"[:-3]


def create(cursor: Any) -> None:
    cursor.execute(DDL)


def read(cursor: Any) -> list[Effect]:
    cursor.execute(
        f"SELECT occurrence_id, schedule_id, version, scheduled_for, label, tenant, delivered_at,"
        f" started_at, ended_at, pid FROM {SCHEMA}.effect ORDER BY id"
    )
    return [
        Effect(
            occurrence_id=str(r[0]),
            schedule_id=str(r[1]),
            version=r[2],
            scheduled_for=r[3],
            label=r[4],
            tenant=r[5],
            delivered_at=r[6],
            started_at=r[7],
            ended_at=r[8],
            pid=r[9],
        )
        for r in cursor.fetchall()
    ]
