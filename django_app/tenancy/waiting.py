"""Waiting lines: occurrences that wait for a slot get it oldest ``scheduled_for`` first.

A *line* is the set of unclaimed occurrences of one tenant that wait for one resource: the
slots of a concurrency key (a named group, or a schedule's own cap, ``schedule:<pk>``) or
the tenant's ``max_running``. Membership is the ``reason`` the deferral wrote (exactly for a
key's slots; the ``"tenant <slug>: "`` prefix for the tenant), so no column or index is
added: the line is read through ``occurrence_tenant_state_time`` (tenant, state,
scheduled_for), oldest first, and a waiter's reason is cleared when it starts.

**Order.** A claim that needs the resource first asks whether an older waiter of its line
exists ((scheduled_for, id) before its own); if so it waits even when a slot is free, so a
waiter is never passed by a later one of its line. The question is asked under the lock
that serializes the resource's claims (the key's slot rows, the tenant row), and Django
runs PostgreSQL and MySQL/MariaDB at READ COMMITTED (SQLite takes the write lock at BEGIN
IMMEDIATE): a waiter's deferral that committed before the lock was taken is seen.

**Cost.** Only the head of a line polls (republished every ``defer``, one second by
default). A waiter behind it is *parked*: republished after :data:`PARK`, and woken
(its outbox row made due now) when it becomes the head: by the claim that takes a slot
(it wakes the next waiter, which then polls while it runs), by a worker releasing a slot
(:func:`django_app.worker.finish.complete` and the other releases wake the key's oldest
waiter, so the hand-over does not wait for a poll; a tenant's ``max_running`` hand-over
does: up to ``defer``), and by any claim that finds an older waiter (it wakes the oldest,
so a head invalidated by a pause or an update does not leave the line parked), and by
whatever takes a waiter out of its line without running it (a pause, cancel, update or
skip; a claim that cancels it for max_runs or skips it for overlap):
:func:`wake_after_leaving` wakes the oldest left once that commits. ``N``
waiters on one key therefore cost about ``60 + N * 60 / PARK`` publishes a minute instead
of ``60 * N`` (bench/README.md, "Waiting in order").

A head whose message was published more than :data:`LOST_AFTER` ago and not claimed since
(the broker lost it, a worker died holding it) is republished by the next claim that finds
it ahead: the line must not stall behind a message nobody will deliver.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial

from django.db import DatabaseError, transaction
from django.db.models import Q

from django_app.models import Occurrence, OutboxEntry
from django_app.querysets import OccurrenceQuerySet

logger = logging.getLogger(__name__)

#: How long a waiter behind the head of its line stays in the outbox before it asks again.
PARK = timedelta(minutes=5)
#: A head's message unclaimed this long after its publish is presumed lost: publish again.
LOST_AFTER = timedelta(seconds=5)


def slot_reason(key: str) -> str:
    """The reason of an occurrence waiting for a slot of ``key`` (its line's name)."""
    return f"waiting for a concurrency slot of {key}"


def tenant_prefix(slug: str) -> str:
    """Every reason of an occurrence waiting for its tenant's ``max_running`` starts so."""
    return f"tenant {slug}: "


_SLOT_REASON = re.compile(re.escape(slot_reason("")) + r".+\Z", re.DOTALL)
_TENANT_REASON = re.compile(r"tenant (?P<slug>[^\s:]+): ")


@dataclass(frozen=True, kw_only=True)
class Line:
    tenant_id: int
    reason: str
    by_prefix: bool = False

    @classmethod
    def for_slots(cls, tenant_id: int, key: str) -> Line:
        return cls(tenant_id=tenant_id, reason=slot_reason(key))

    @classmethod
    def for_tenant(cls, tenant_id: int, slug: str) -> Line:
        return cls(tenant_id=tenant_id, reason=tenant_prefix(slug), by_prefix=True)

    @classmethod
    def of_waiter(cls, tenant_id: int, reason: str) -> Line | None:
        """The line an unclaimed occurrence with this ``reason`` waits in, if any."""
        if _SLOT_REASON.match(reason):
            return cls(tenant_id=tenant_id, reason=reason)
        tenant = _TENANT_REASON.match(reason)
        return cls.for_tenant(tenant_id, tenant["slug"]) if tenant else None

    def waiters(self) -> OccurrenceQuerySet:
        named = Q(reason__startswith=self.reason) if self.by_prefix else Q(reason=self.reason)
        return Occurrence.objects.unclaimed().filter(named, tenant_id=self.tenant_id)

    def ahead_of(self, occ: Occurrence) -> bool:
        """Whether an older waiter ((scheduled_for, id) before ``occ``'s) is in the line."""
        older = Q(scheduled_for__lt=occ.scheduled_for) | Q(
            scheduled_for=occ.scheduled_for, id__lt=occ.pk
        )
        return self.waiters().filter(older).exclude(pk=occ.pk).exists()

    def wake_oldest(
        self,
        now: datetime,
        *,
        besides: uuid.UUID | None = None,
        unless_due_within: timedelta = timedelta(seconds=1),
    ) -> int:
        """Make the oldest waiter other than ``besides`` ask now if it is parked or lost.

        One read and one conditional UPDATE of its outbox row: a head already due within
        ``unless_due_within`` (a claim's wake: it polls anyway), or whose message is out
        and recent, is left alone (0 rows). A released slot wakes with 0: ask now.
        """
        waiters = self.waiters() if besides is None else self.waiters().exclude(pk=besides)
        head = waiters.order_by("scheduled_for", "id").values_list("pk", flat=True).first()
        if head is None:
            return 0
        parked = Q(sent_at__isnull=True, available_at__gt=now + unless_due_within)
        lost = Q(sent_at__lt=now - LOST_AFTER)
        due = OutboxEntry.objects.filter(parked | lost, occurrence_id=head)
        return due.update(
            sent_at=None, available_at=now, claimed_by="", claim_expires_at=None, publish_count=0
        )


@dataclass(kw_only=True)
class Place:
    """One occurrence's place in one line, asked at most once per claim."""

    line: Line
    occ: Occurrence
    _behind: bool | None = field(default=None, init=False)

    def behind(self) -> bool:
        if self._behind is None:
            self._behind = self.line.ahead_of(self.occ)
        return self._behind

    @property
    def asked(self) -> bool:
        return self._behind is not None

    @property
    def asked_and_behind(self) -> bool:
        return bool(self._behind)


def wake_after_leaving(left: Iterable[tuple[int, str]], now: datetime) -> None:
    """Waiters left their lines without a claim (a pause, cancel, update or skip canceled
    them; ``left``: their tenant and reason, read before): once the caller's transaction
    commits, each line's oldest waiter is made to ask now. The head that left polled for
    its line; the next one may be parked for :data:`PARK`.

    After the commit, one statement per line on its own: a claim of that waiter may hold
    its row while it waits for the caller's rows (to wake the head it still sees), and
    waking inside the caller's transaction would close a cycle.
    """
    lines = {line for t, r in left if (line := Line.of_waiter(t, r)) is not None}
    for line in lines:
        transaction.on_commit(partial(_wake_after_commit, line, now))


def _wake_after_commit(line: Line, now: datetime) -> None:
    # The caller's work is committed: a failure here must not be reported as its failure
    # (a pause answering 500, a claim read as "nothing claimed"). Unwoken, the waiter asks
    # at the end of its park, or when the next claim of its line finds it ahead.
    try:
        line.wake_oldest(now, unless_due_within=timedelta(0))
    except DatabaseError as exc:
        logger.warning(
            "waiting line %r of tenant %s not woken: %s", line.reason, line.tenant_id, exc
        )
