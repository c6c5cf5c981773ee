"""Recover occurrences whose message the broker lost: publish them again under the same id.

An occurrence is ENQUEUED once the broker accepted its message, and leaves that state only
when a worker claims it. If it is still ENQUEUED ``redelivery_timeout_seconds`` after its
last publish (the outbox row's ``sent_at``), the message is presumed lost (Redis restarted
without persistence, the queue was purged, a worker died between receiving and claiming)
and :func:`redeliver_lost` re-opens its outbox row (``sent_at = NULL``, due now): the relay
publishes it again, same occurrence id, and counts ``redelivered_total{tenant}``.

**Backoff.** A message can also just be waiting behind a long queue (workers down or
saturated): a copy every timeout would then grow the very queue it waits in (a chaos run
saw more re-publishes than deliveries, and fresh work stuck behind the copies:
bench/README.md, "Figures that were in code comments").
So each publish of the same occurrence since a worker last received it (a worker that
defers, retries or loses the lease of an occurrence sends it back with the count at zero)
doubles the wait before it counts as lost:
``timeout`` after the first publish, ``2 x timeout`` after the second, up to
``2 ** MAX_BACKOFF_DOUBLINGS x timeout``: a lost message is still recovered, a slow one
costs a few copies, not one per timeout.

Why this is safe:

- a message that was only slow, not lost, arrives next to its copy; the claim (one row
  lock, fencing token, "RUNNING under a live lease or finished is a duplicate") lets exactly
  one copy run the body;
- several beats run the pass at once: each re-open is ``UPDATE outbox ... WHERE id = %s
  AND sent_at = <the sent_at it read>``, so one beat wins and the others change nothing,
  also after the relay re-sent it (a new ``sent_at``);
- the occurrence row is locked (``SKIP LOCKED``) and re-checked ENQUEUED in the same
  transaction, so a worker claiming it right now is never raced (it is skipped, not waited
  for).

Cheap when nothing is lost: the scan goes through the ``(state, scheduled_for)`` index over
ENQUEUED occurrences scheduled before the cutoff (a publish never precedes its
``scheduled_for``), which are only the queue's backlog.
"""

from __future__ import annotations

import collections
import functools
import logging
import operator
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.db.models import Q

from celery_scheduler.core.clock import SYSTEM_CLOCK, Clock
from celery_scheduler.core.enums import OccurrenceState as S
from django_app import conf, observe
from django_app.models import Occurrence, OutboxEntry

logger = logging.getLogger(__name__)
#: The wait before a message counts as lost doubles per publish, at most this many times.
MAX_BACKOFF_DOUBLINGS = 3


@dataclass(frozen=True, slots=True)
class LostMessage:
    """An outbox row as the scan read it (``sent_at`` is the re-open's condition)."""

    outbox_id: int
    occurrence_id: uuid.UUID
    sent_at: datetime
    tenant: str
    #: The occurrence's time, the history's partition key: the re-open reads one slot.
    scheduled_for: datetime


def configured_timeout(settings: conf.SchedulerSettings) -> timedelta | None:
    """``redelivery_timeout_seconds`` as a timedelta; None when redelivery is off (0)."""
    seconds = settings.redelivery_timeout_seconds
    return timedelta(seconds=seconds) if seconds > 0 else None


def lost_after(timeout: timedelta, publish_count: int) -> timedelta:
    """How long after its last publish a message published ``publish_count`` times is lost."""
    return timeout * 2 ** min(max(publish_count - 1, 0), MAX_BACKOFF_DOUBLINGS)


def find_lost(
    now: datetime, timeout: timedelta, *, limit: int, chunk: int = 2000
) -> list[LostMessage]:
    """Up to ``limit`` ENQUEUED occurrences last published before ``now - timeout``, the
    timeout doubled for each earlier publish (:func:`lost_after`).

    Walks the ENQUEUED occurrences scheduled before the cutoff (a publish never precedes
    its ``scheduled_for``) through the ``(state, scheduled_for)`` index in keyset chunks,
    oldest first, and looks up their outbox rows by occurrence id within the chunk's span
    of times (the partition key: the slots the chunk falls in, not every slot's index):
    the cost follows the old backlog, never the history (a single join let the planner
    scan the whole outbox).
    """
    cutoff = now - timeout
    found: list[LostMessage] = []
    after: tuple[datetime, uuid.UUID] | None = None
    while len(found) < limit:
        page = Occurrence.objects.filter(state=S.ENQUEUED.value, scheduled_for__lt=cutoff)
        if after is not None:
            page = page.filter(
                Q(scheduled_for__gt=after[0]) | Q(scheduled_for=after[0], pk__gt=after[1])
            )
        keys = list(page.order_by("scheduled_for", "pk").values_list("scheduled_for", "pk")[:chunk])
        if not keys:
            break
        after = keys[-1]
        rows = OutboxEntry.objects.filter(
            occurrence_id__in=[pk for _, pk in keys],
            scheduled_for__gte=keys[0][0],
            scheduled_for__lte=after[0],
            sent_at__lt=cutoff,
        ).values_list(
            "id", "occurrence_id", "sent_at", "tenant__slug", "publish_count", "scheduled_for"
        )
        # sent_at is never NULL here (filtered on), which the row type does not know.
        found += [
            LostMessage(pk, occ, sent_at, tenant, scheduled_for)
            for pk, occ, sent_at, tenant, published, scheduled_for in rows
            if sent_at is not None and sent_at < now - lost_after(timeout, published)
        ]
        if len(keys) < chunk:
            break
    found.sort(key=lambda message: message.sent_at)  # the longest-lost first
    return found[:limit]


def reopen(lost: list[LostMessage], now: datetime) -> list[LostMessage]:
    """Re-open each row that is still as read and whose occurrence is still ENQUEUED.

    One transaction for the batch. Returns the rows this call re-opened (another beat's
    pass, a claim or a re-send since the scan leaves a row alone).
    """
    if not lost:
        return []
    skip_locked = connection.features.has_select_for_update_skip_locked
    with transaction.atomic():
        still = Occurrence.objects.filter(
            pk__in=[m.occurrence_id for m in lost],
            scheduled_for__range=_span(lost),
            state=S.ENQUEUED.value,
        )
        if skip_locked:  # a worker claiming one right now holds its lock: leave it be
            still = still.select_for_update(skip_locked=True)
        live = set(still.values_list("pk", flat=True))
        candidates = [m for m in lost if m.occurrence_id in live]
        if not candidates:
            return []
        # Each row only as it was read: the condition is on the locked row itself, so a
        # concurrent re-open (or a re-send) that committed first makes it match nothing.
        as_read = functools.reduce(
            operator.or_,
            (
                Q(pk=m.outbox_id, scheduled_for=m.scheduled_for, sent_at=m.sent_at)
                for m in candidates
            ),
        )
        mine = set(
            OutboxEntry.objects.select_for_update().filter(as_read).values_list("pk", flat=True)
        )
        OutboxEntry.objects.filter(pk__in=mine, scheduled_for__range=_span(candidates)).update(
            sent_at=None, available_at=now, claimed_by="", claim_expires_at=None
        )
    return [m for m in candidates if m.outbox_id in mine]


def _span(messages: list[LostMessage]) -> tuple[datetime, datetime]:
    """The messages' earliest and latest time: the history slots their rows are in."""
    times = [m.scheduled_for for m in messages]
    return min(times), max(times)


def redeliver_lost(
    *, clock: Clock | None = None, limit: int | None = None, timeout: timedelta | None = None
) -> int:
    """One pass: re-open up to ``limit`` lost messages for the relay; returns how many.

    Beat passes both (from the settings it read for its step); a direct call (a shell, a
    test) may leave them out: ``timeout`` then defaults to the ``redelivery_timeout_seconds``
    setting (0: do nothing), ``limit`` to ``batch_size``, read once here.
    """
    if not timeout or not limit:  # (a zero is "not given", as it always was)
        settings = conf.get()
        timeout = timeout or configured_timeout(settings)
        limit = limit or settings.batch_size
    if timeout is None:
        return 0
    now = (clock or SYSTEM_CLOCK).now()
    lost = find_lost(now, timeout, limit=limit)
    if not lost:
        return 0
    reopened = reopen(lost, now)
    per_tenant = collections.Counter(message.tenant for message in reopened)
    observe.redelivered(per_tenant)
    if reopened:
        logger.warning(
            "re-publishing %d occurrence(s) never claimed %ss after their publish (message "
            "lost by the broker?), same ids: %s%s",
            len(reopened),
            int(timeout.total_seconds()),
            ", ".join(str(m.occurrence_id) for m in reopened[:5]),
            " ..." if len(reopened) > 5 else "",
            extra={"event": "redelivered", "count": len(reopened)},
        )
    return len(reopened)
