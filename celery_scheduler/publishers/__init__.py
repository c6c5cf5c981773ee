"""The Publisher port: how the relay hands occurrences to a broker.

The relay knows only this module. A publisher receives a batch of
:class:`OccurrenceMessage` values and either gets every one of them accepted by the
broker or raises :class:`celery_scheduler.errors.CoordinationUnavailable`; the relay
marks the outbox rows sent only after ``publish`` returned, so a failure (or a crash)
means the same occurrence ids are published again later, never that one is lost.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

#: The wrapper task every occurrence is published as (registered by django_app.tasks).
RUN_OCCURRENCE_TASK = "celery_scheduler.run_occurrence"

#: Message header names; a consumer can recognise a scheduled delivery without the body.
HEADER_OCCURRENCE_ID = "scheduler_occurrence_id"
HEADER_SCHEDULE_ID = "scheduler_schedule_id"
HEADER_SCHEDULE_VERSION = "scheduler_schedule_version"
HEADER_SCHEDULED_FOR = "scheduler_scheduled_for"
HEADER_TENANT = "scheduler_tenant"
#: Present (True) on operator-made occurrences: "run now" and backfills.
HEADER_MANUAL = "scheduler_manual"


def iso_utc(instant: datetime) -> str:
    """``2026-03-01T12:00:00.000000Z``: one fixed format so equal instants compare equal."""
    if instant.tzinfo is None:
        raise ValueError(f"expected a timezone-aware datetime, got naive {instant!r}")
    return instant.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True, kw_only=True)
class OccurrenceMessage:
    """Everything a publisher needs to send one occurrence; built by the relay.

    ``queue`` is the schedule's explicit queue or ``""`` (the publisher then routes by
    the real task name, as Celery would for a direct call of that task).
    """

    occurrence_id: str
    schedule_id: str
    schedule_version: int
    scheduled_for: datetime
    tenant: str
    task: str
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    queue: str = ""
    priority: int = 0
    #: Attempts already made (Celery's ``retries`` header): a scheduler retry of a run
    #: shows ``retries: 1`` in ``task-received``, as ``task.retry()`` would.
    retries: int = 0
    #: An operator's occurrence ("run now", backfill), not one of the schedule's triggers.
    manual: bool = False

    @classmethod
    def from_occurrence(cls, occurrence: Any, schedule: Any, *, tenant: str) -> OccurrenceMessage:
        """Build from an Occurrence and its Schedule (ORM objects or look-alikes)."""
        return cls(
            occurrence_id=str(occurrence.id),
            schedule_id=str(schedule.id),
            schedule_version=int(occurrence.schedule_version),
            scheduled_for=occurrence.scheduled_for,
            tenant=tenant,
            task=schedule.task,
            args=tuple(schedule.args or ()),
            kwargs=dict(schedule.kwargs or {}),
            queue=schedule.queue or "",
            priority=int(schedule.priority or 0),
            retries=int(getattr(occurrence, "attempt_count", 0) or 0),
            manual=bool(getattr(occurrence, "manual", False)),
        )

    @property
    def task_id(self) -> str:
        """The Celery task id: the occurrence id, so every duplicate is recognisable."""
        return self.occurrence_id

    def task_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``celery_scheduler.run_occurrence``."""
        return {
            "occurrence_id": self.occurrence_id,
            "schedule_id": self.schedule_id,
            "schedule_version": self.schedule_version,
            "scheduled_for": iso_utc(self.scheduled_for),
            "task": self.task,
            "args": list(self.args),
            "kwargs": dict(self.kwargs),
        }

    def headers(self) -> dict[str, Any]:
        headers: dict[str, Any] = {
            HEADER_OCCURRENCE_ID: self.occurrence_id,
            HEADER_SCHEDULE_ID: self.schedule_id,
            HEADER_SCHEDULE_VERSION: self.schedule_version,
            HEADER_SCHEDULED_FOR: iso_utc(self.scheduled_for),
            HEADER_TENANT: self.tenant,
        }
        if self.manual:
            headers[HEADER_MANUAL] = True
        return headers


class Publisher(Protocol):
    """Sends occurrence messages to the broker.

    Contract: when ``publish`` returns, the broker has accepted every message of the
    batch. On any broker or connection error it raises
    :class:`celery_scheduler.errors.CoordinationUnavailable` (some messages of the batch
    may have been accepted already; the caller re-publishes the whole batch later under
    the same task ids). It never retries forever: the retry policy is bounded.
    """

    def publish(self, messages: Sequence[OccurrenceMessage]) -> None: ...


#: Messages per publish call of a publisher that does not choose (see PreparingPublisher).
PUBLISH_CHUNK = 5_000


class PreparingPublisher(abc.ABC):
    """A publisher that builds the broker's bytes ahead of the instant and sends them later.

    The burst relay's contract with its publisher (:mod:`django_app.relay.burst`):

    - ``prepare(messages)`` runs outside any transaction, minutes before the instant; it
      returns one opaque item per message, in order, and touches no broker state;
    - ``declare(prepared)`` makes the queues the items go to exist (once per queue, before
      the instant; a no-op where the broker needs none);
    - ``publish_prepared(items)`` runs inside the wave's transaction, at the instant, with at
      most ``publish_chunk`` items; when it returns, the broker has accepted (and, on
      RabbitMQ, confirmed) every item; on any error it raises and the relay marks nothing.

    Subclassing is the declaration: the relay asks for no attribute it was not promised.
    Any other :class:`Publisher` takes part through :func:`preparing`.
    """

    #: Items per ``publish_prepared`` call: each call must return well inside the wave
    #: transaction's idle bound (``claim_grace_seconds``).
    publish_chunk: int = PUBLISH_CHUNK

    @abc.abstractmethod
    def publish(self, messages: Sequence[OccurrenceMessage]) -> None:
        """The :class:`Publisher` contract (the polling relay's path)."""

    @abc.abstractmethod
    def prepare(self, messages: Iterable[OccurrenceMessage]) -> Sequence[Any]:
        """The items ``publish_prepared`` sends, one per message, in order."""

    def declare(self, prepared: Sequence[Any]) -> None:
        """Make sure the queues of ``prepared`` exist (default: nothing to declare)."""
        del prepared

    @abc.abstractmethod
    def publish_prepared(self, prepared: Sequence[Any]) -> None:
        """Send prepared items; returns once the broker accepted every one of them."""


class Unprepared(PreparingPublisher):
    """Any :class:`Publisher` as a :class:`PreparingPublisher`: a message is its own item,
    built at publish time (the kombu path, test publishers)."""

    def __init__(self, publisher: Publisher) -> None:
        self.publisher = publisher

    def publish(self, messages: Sequence[OccurrenceMessage]) -> None:
        self.publisher.publish(messages)

    def prepare(self, messages: Iterable[OccurrenceMessage]) -> list[OccurrenceMessage]:
        return list(messages)

    def publish_prepared(self, prepared: Sequence[Any]) -> None:
        self.publisher.publish(prepared)

    def __repr__(self) -> str:
        return f"Unprepared({self.publisher!r})"


def preparing(publisher: Publisher | PreparingPublisher) -> PreparingPublisher:
    """``publisher`` itself if it prepares ahead, else wrapped in :class:`Unprepared`."""
    if isinstance(publisher, PreparingPublisher):
        return publisher
    return Unprepared(publisher)


class RecordingPublisher:
    """An in-memory publisher for tests: records what was sent, can be told to fail."""

    def __init__(self) -> None:
        self.sent: list[OccurrenceMessage] = []
        self.fail_with: BaseException | None = None
        self._lock = threading.Lock()

    def publish(self, messages: Sequence[OccurrenceMessage]) -> None:
        if self.fail_with is not None:
            raise self.fail_with
        with self._lock:
            self.sent.extend(messages)

    @property
    def task_ids(self) -> list[str]:
        with self._lock:
            return [m.task_id for m in self.sent]


REDIS_SCHEMES = ("redis://", "rediss://")
AMQP_SCHEMES = ("amqp://", "pyamqp://", "amqps://")
