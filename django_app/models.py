"""Schedule, Occurrence, Attempt and OutboxEntry are separate, as the spec requires.

The database enforces what must hold (unique occurrence keys, one outbox row per
occurrence, valid enum values, per-tenant idempotency keys); Python validation only
gives nicer messages. State changes are conditional UPDATEs in the packages that own them
(``django_app.schedules``, ``django_app.materialize``, ``django_app.relay``, ``django_app.worker``),
written by :mod:`django_app.querysets` (the managers, and ``transition()``).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from celery_scheduler.core.enums import (
    AttemptOutcome,
    DstFold,
    DstGap,
    MisfirePolicy,
    OccurrenceState,
    OverlapPolicy,
    ScheduleKind,
    ScheduleState,
)
from django_app.compat import PostgresBrinIndex, PostgresPartialIndex, check_constraint, db_default
from django_app.querysets import (
    OccurrenceQuerySet,
    OutboxQuerySet,
    PartitionKeyQuerySet,
    ScheduleQuerySet,
    fill_partition_key,
)


def _choices(enum: type) -> list[tuple[str, str]]:
    return [(m.value, m.value.replace("_", " ").title()) for m in enum]  # type: ignore[attr-defined]


def _in_enum(field: str, enum: type) -> Q:
    return Q(**{f"{field}__in": [m.value for m in enum]})  # type: ignore[attr-defined]


#: The condition of the occurrence's indexes by state: every state but the one most rows end in.
NOT_SUCCEEDED = ~Q(state=OccurrenceState.SUCCEEDED.value)


class Tenant(models.Model):
    """A customer of the scheduler with its own quotas and relay weight."""

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200, blank=True)
    max_schedules = models.PositiveIntegerField(null=True, blank=True)
    max_trigger_rate = models.PositiveIntegerField(
        null=True, blank=True, help_text=_("Occurrences per second the relay publishes at most.")
    )
    max_running = models.PositiveIntegerField(
        null=True, blank=True, help_text=_("Occurrences RUNNING at once across all workers.")
    )
    catchup_rate = models.PositiveIntegerField(
        null=True, blank=True, help_text=_("Catch-up occurrences released per minute at most.")
    )
    relay_weight = models.PositiveSmallIntegerField(
        default=1, help_text=_("Share of relay capacity under contention.")
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class TenantBudget(models.Model):
    """A tenant's rate budget of one kind, shared by every shard, beat and relay process.

    ``trigger`` (``Tenant.max_trigger_rate``): a token bucket; ``tokens`` is what was left at
    ``at``, refilled at the rate per second since then (at most one second of burst).
    ``catchup`` (``Tenant.catchup_rate``): ``at`` is the tenant's next free release slot for
    a late occurrence (``tokens`` unused). Read and written under a row lock by
    :mod:`django_app.tenancy.budget`, one statement for every tenant of a batch.
    """

    TRIGGER = "trigger"
    CATCHUP = "catchup"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="budgets")
    kind = models.CharField(max_length=16, choices=[(TRIGGER, "Trigger"), (CATCHUP, "Catch-up")])
    tokens = models.FloatField(default=0.0)
    at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "kind"], name="tenant_budget_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.kind}"


class TenantMembership(models.Model):
    """Ties a staff user to the one tenant whose schedules they may see and change."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="scheduler_membership"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="members")

    def __str__(self) -> str:
        return f"{self.user} @ {self.tenant}"


class Schedule(models.Model):
    """What should happen in the future. Versioned: each change bumps ``version``."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index of its own: a composite index leads with it (see Meta), and every index is
    # written on each insert (and each non-HOT update) of a row.
    tenant = models.ForeignKey(
        Tenant, on_delete=models.PROTECT, related_name="schedules", db_index=False
    )
    name = models.CharField(max_length=200)
    task = models.CharField(max_length=200, help_text=_("A task registered in the Celery app."))
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
    queue = models.CharField(max_length=200, blank=True, default="")
    priority = models.PositiveSmallIntegerField(default=0)

    kind = models.CharField(max_length=16, choices=_choices(ScheduleKind))
    cron = models.CharField(max_length=200, blank=True, default="")
    timezone = models.CharField(max_length=64, default="UTC")
    #: A cron's DST policy (celery_scheduler.core.timemath): a wall time the spring-forward
    #: gap removes, one the fall-back repeats. Intervals and one-offs keep the defaults.
    dst_gap = models.CharField(
        max_length=8, choices=_choices(DstGap), default=DstGap.SKIP.value,
        **db_default(DstGap.SKIP.value),
    )  # fmt: skip
    dst_fold = models.CharField(
        max_length=8, choices=_choices(DstFold), default=DstFold.FIRST.value,
        **db_default(DstFold.FIRST.value),
    )  # fmt: skip
    interval_seconds = models.PositiveIntegerField(null=True, blank=True)
    run_at = models.DateTimeField(null=True, blank=True)
    start_at = models.DateTimeField(null=True, blank=True)
    end_at = models.DateTimeField(null=True, blank=True)

    version = models.PositiveIntegerField(default=1)
    state = models.CharField(
        max_length=16, choices=_choices(ScheduleState), default=ScheduleState.ACTIVE.value
    )
    # The durable cursor (``next_run_at``) lives in ScheduleCursor, a narrow row of its own:
    # it moves on every plan, and a move here would rewrite every index of this wide row.
    shard = models.PositiveIntegerField(default=0)
    #: Why the materializer parked this schedule (state PARKED) and when; cleared on un-park.
    parked_reason = models.CharField(max_length=500, blank=True, default="")
    parked_at = models.DateTimeField(null=True, blank=True)
    #: Why the schedule is PAUSED: the operator's note, or the automatic reason
    #: (``pause_after_failures``); cleared on resume.
    pause_reason = models.CharField(max_length=500, blank=True, default="")
    paused_at = models.DateTimeField(null=True, blank=True)

    #: Limited runs: the schedule COMPLETES once ``runs_count`` reaches it (NULL: unlimited).
    max_runs = models.PositiveIntegerField(null=True, blank=True)
    #: Scheduled (not manual) occurrences claimed for their first attempt: retries of one
    #: occurrence are one run. Counted under the schedule row lock in the claim.
    runs_count = models.PositiveIntegerField(default=0)
    #: Pause by itself after this many consecutive DEAD occurrences (NULL: never).
    pause_after_failures = models.PositiveIntegerField(null=True, blank=True)
    consecutive_failures = models.PositiveIntegerField(default=0)
    #: Fire times (UTC ISO strings) the operator skipped; each survives version changes.
    skip_times = models.JSONField(default=list, blank=True)

    misfire_policy = models.CharField(
        max_length=16, choices=_choices(MisfirePolicy), default=MisfirePolicy.SKIP.value
    )
    max_lateness_seconds = models.PositiveIntegerField(default=300)
    catchup_cap = models.PositiveIntegerField(default=10)
    overlap_policy = models.CharField(
        max_length=16, choices=_choices(OverlapPolicy), default=OverlapPolicy.ALLOW.value
    )
    flexible_window_seconds = models.PositiveIntegerField(default=0)
    concurrency_limit = models.PositiveIntegerField(null=True, blank=True)
    concurrency_group = models.CharField(max_length=200, blank=True, default="")
    max_attempts = models.PositiveIntegerField(null=True, blank=True)
    deadline_seconds = models.PositiveIntegerField(null=True, blank=True)

    idempotency_key = models.CharField(max_length=200, null=True, blank=True)
    #: Hash of the create arguments, to tell a replayed create from a conflicting one.
    content_hash = models.CharField(max_length=64, blank=True, default="")
    source = models.CharField(max_length=32, default="api")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = ScheduleQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="schedule_tenant_idempotency_key_uniq",
            ),
            check_constraint(condition=_in_enum("kind", ScheduleKind), name="schedule_kind_valid"),
            check_constraint(
                condition=_in_enum("state", ScheduleState), name="schedule_state_valid"
            ),
            check_constraint(
                condition=_in_enum("misfire_policy", MisfirePolicy), name="schedule_misfire_valid"
            ),
            check_constraint(
                condition=_in_enum("overlap_policy", OverlapPolicy), name="schedule_overlap_valid"
            ),
            check_constraint(condition=_in_enum("dst_gap", DstGap), name="schedule_dst_gap_valid"),
            check_constraint(
                condition=_in_enum("dst_fold", DstFold), name="schedule_dst_fold_valid"
            ),
            check_constraint(
                condition=(
                    Q(kind=ScheduleKind.CRON.value) & ~Q(cron="")
                    | Q(kind=ScheduleKind.INTERVAL.value, interval_seconds__gt=0)
                    | Q(kind=ScheduleKind.ONE_OFF.value, run_at__isnull=False)
                ),
                name="schedule_trigger_matches_kind",
            ),
            check_constraint(condition=Q(version__gte=1), name="schedule_version_positive"),
        ]
        indexes = [
            models.Index(fields=["tenant", "state"], name="schedule_tenant_state"),
            # list_schedules' keyset pagination: (created_at, id) order, per tenant or not.
            models.Index(fields=["created_at", "id"], name="schedule_keyset"),
            models.Index(fields=["tenant", "created_at", "id"], name="schedule_tenant_keyset"),
            # The admin list's default order (name, then id in the same direction), and its
            # task filter's loose index scan, across tenants and within one.
            models.Index(fields=["name", "id"], name="schedule_admin_name"),
            models.Index(fields=["task"], name="schedule_task"),
            models.Index(fields=["tenant", "task"], name="schedule_tenant_task"),
            # A tenant user's list in the same order; the list sorted by state, and the
            # overview's count per state.
            models.Index(fields=["tenant", "name", "id"], name="schedule_tenant_name"),
            models.Index(fields=["state", "id"], name="schedule_admin_state"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind} v{self.version})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Saves the row, then its cursor row when a column the cursor copies may have
        changed (``shard``, ``version``, ``state``) or ``next_run_at`` was set."""
        fields = kwargs.get("update_fields")
        new = self._state.adding
        super().save(*args, **kwargs)
        if new or fields is None or _PENDING_CURSOR in self.__dict__ or set(fields) & CURSOR_COPIES:
            write_cursor(self, new=new)

    def refresh_from_db(self, *args: Any, **kwargs: Any) -> None:
        self.__dict__.pop(_PENDING_CURSOR, None)
        super().refresh_from_db(*args, **kwargs)

    @property
    def next_run_at(self) -> datetime | None:
        """The cursor (:class:`ScheduleCursor`): the next scheduled_for not yet materialized
        (UTC). NULL when no future fire time exists or the schedule ended."""
        if _PENDING_CURSOR in self.__dict__:
            return self.__dict__[_PENDING_CURSOR]
        if self._state.adding:
            return None
        try:
            return self.cursor.next_run_at
        except ScheduleCursor.DoesNotExist:
            return None

    @next_run_at.setter
    def next_run_at(self, value: datetime | None) -> None:
        # Written to the cursor row by the next save() (Schedule(next_run_at=...) too).
        self.__dict__[_PENDING_CURSOR] = value


#: Where a ``next_run_at`` set on an instance waits for its save.
_PENDING_CURSOR = "_pending_next_run_at"
#: Schedule columns the cursor row carries a copy of (the materializer reads and checks
#: them without touching the schedule row).
CURSOR_COPIES = frozenset({"shard", "version", "state"})


class ScheduleCursor(models.Model):
    """The schedule's durable cursor, one narrow row per schedule (created with it).

    ``next_run_at`` moves on every plan. On the schedule row it was indexed, so each move
    was a non-HOT update that wrote a new entry in every one of that row's indexes; here a
    move writes this small row and its three index entries. ``shard``, ``version`` and
    ``active`` (state is ACTIVE) are copies the schedule's writers keep in step (``save()``,
    ``ScheduleQuerySet.update``/``bulk_create``, the PostgreSQL create function): the due
    query reads only this table's index, and the cursor move's condition checks only this
    row, so a concurrent lifecycle call (which locks this row with the schedule's) is seen.
    """

    schedule = models.OneToOneField(
        Schedule, on_delete=models.CASCADE, primary_key=True, related_name="cursor"
    )
    shard = models.PositiveIntegerField(default=0)
    version = models.PositiveIntegerField(default=1)
    active = models.BooleanField(default=True)
    next_run_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            # The materializer's hot path: due schedules of a shard, in time order; only
            # ACTIVE ones (a paused schedule keeps its cursor and is never due).
            models.Index(
                fields=["shard", "next_run_at"],
                condition=Q(active=True),
                name="schedule_cursor_due",
            ),
            # list_schedules(next_run_before/after=...) and the admin's "Next run" order:
            # a range of cursors in any state.
            models.Index(fields=["next_run_at"], name="schedule_cursor_next_run"),
        ]

    def __str__(self) -> str:
        return f"{self.schedule_id} -> {self.next_run_at}"


def cursor_values(schedule: Schedule) -> dict[str, Any]:
    """The cursor row's columns for ``schedule`` as it is in memory."""
    return {
        "shard": schedule.shard,
        "version": schedule.version,
        "active": schedule.state == ScheduleState.ACTIVE.value,
        "next_run_at": schedule.next_run_at,
    }


def write_cursor(schedule: Schedule, *, new: bool = False) -> None:
    """Insert (``new``: the schedule was just inserted) or update ``schedule``'s cursor row
    from the instance; caches it on it."""
    values = cursor_values(schedule)
    schedule.__dict__.pop(_PENDING_CURSOR, None)
    if new:
        ScheduleCursor.objects.create(schedule_id=schedule.pk, **values)
    elif not ScheduleCursor.objects.filter(pk=schedule.pk).update(**values):
        ScheduleCursor.objects.create(schedule_id=schedule.pk, **values)
    Schedule.cursor.related.set_cached_value(
        schedule, ScheduleCursor(schedule_id=schedule.pk, **values)
    )


class ScheduleTag(models.Model):
    """A free-form key/value label on a schedule; filters are always within its tenant."""

    # Indexed by a composite index that leads with it (Meta): no index of its own.
    schedule = models.ForeignKey(
        Schedule, on_delete=models.CASCADE, related_name="tags", db_index=False
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    key = models.CharField(max_length=100)
    value = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        ordering = ["key"]
        constraints = [
            models.UniqueConstraint(fields=["schedule", "key"], name="schedule_tag_key_uniq"),
        ]
        indexes = [
            models.Index(fields=["tenant", "key", "value"], name="schedule_tag_lookup"),
        ]

    def __str__(self) -> str:
        return f"{self.key}={self.value}"


class ScheduleVersion(models.Model):
    """The timing of one version of a schedule and the interval in which it was live.

    Written by the lifecycle API on create/update/pause/resume/cancel. The reconciler
    recomputes expected occurrences from these rows alone: a version is expected to fire
    in ``[valid_from, valid_to)``; pause and cancel close the interval, resume opens a new
    row for the (bumped) version.
    """

    # Indexed by a composite index that leads with it (Meta): no index of its own.
    schedule = models.ForeignKey(
        Schedule, on_delete=models.CASCADE, related_name="versions", db_index=False
    )
    version = models.PositiveIntegerField()
    kind = models.CharField(max_length=16, choices=_choices(ScheduleKind))
    cron = models.CharField(max_length=200, blank=True, default="")
    timezone = models.CharField(max_length=64, default="UTC")
    dst_gap = models.CharField(
        max_length=8, choices=_choices(DstGap), default=DstGap.SKIP.value,
        **db_default(DstGap.SKIP.value),
    )  # fmt: skip
    dst_fold = models.CharField(
        max_length=8, choices=_choices(DstFold), default=DstFold.FIRST.value,
        **db_default(DstFold.FIRST.value),
    )  # fmt: skip
    interval_seconds = models.PositiveIntegerField(null=True, blank=True)
    run_at = models.DateTimeField(null=True, blank=True)
    start_at = models.DateTimeField(null=True, blank=True)
    end_at = models.DateTimeField(null=True, blank=True)
    valid_from = models.DateTimeField()
    valid_to = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["schedule", "version"]
        constraints = [
            models.UniqueConstraint(fields=["schedule", "version"], name="schedule_version_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.schedule_id} v{self.version}"


class Occurrence(models.Model):
    """One scheduled time of one schedule version.

    ``id`` is ``celery_scheduler.core.ids.occurrence_id(schedule, version, scheduled_for)``
    and is the Celery task id of every message published for it.
    """

    id = models.UUIDField(primary_key=True, editable=False)
    # Indexed by a composite index that leads with it (Meta): no index of its own.
    schedule = models.ForeignKey(
        Schedule, on_delete=models.PROTECT, related_name="occurrences", db_index=False
    )
    schedule_version = models.PositiveIntegerField()
    tenant = models.ForeignKey(
        Tenant, on_delete=models.PROTECT, related_name="occurrences", db_index=False
    )
    scheduled_for = models.DateTimeField()
    available_at = models.DateTimeField()
    state = models.CharField(
        max_length=16,
        choices=_choices(OccurrenceState),
        default=OccurrenceState.SCHEDULED.value,
    )
    #: True for "run now" and backfill occurrences created by an operator.
    manual = models.BooleanField(default=False)
    #: The overlap policy this occurrence is claimed under, when not the schedule's (a
    #: backfill's ``overlap_policy``); empty: the schedule's.
    overlap_policy = models.CharField(
        max_length=16, blank=True, default="", choices=_choices(OverlapPolicy)
    )
    attempt_count = models.PositiveIntegerField(default=0)
    #: Fencing generation of the current claim; only ever grows.
    fencing_token = models.BigIntegerField(default=0)
    lease_owner = models.CharField(max_length=200, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    enqueued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    retry_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    result = models.JSONField(null=True, blank=True)
    #: Why the occurrence reached its state when no worker put it there (MISSED, CANCELED...).
    reason = models.CharField(max_length=200, blank=True, default="")

    objects = OccurrenceQuerySet.as_manager()

    class Meta:
        ordering = ["-scheduled_for"]
        constraints = [
            models.UniqueConstraint(
                fields=["schedule", "schedule_version", "scheduled_for"],
                name="occurrence_schedule_version_time_uniq",
            ),
            check_constraint(
                condition=_in_enum("state", OccurrenceState), name="occurrence_state_valid"
            ),
        ]
        indexes = [
            # The three indexes by state leave SUCCEEDED rows out on PostgreSQL (migration
            # 0026): the run path reads them for the other states only (overlap, running
            # counts, waiting lines, the reaper, DEAD counts), and a completion then writes
            # three index entries fewer. SUCCEEDED rows are found by time and schedule.
            PostgresPartialIndex(
                fields=["schedule", "state"],
                condition=NOT_SUCCEEDED,
                name="occurrence_schedule_state",
            ),
            PostgresPartialIndex(
                fields=["state", "scheduled_for"],
                condition=NOT_SUCCEEDED,
                name="occurrence_state_time",
            ),
            # Per tenant and state (running counts), and in time (the overview's day counts).
            PostgresPartialIndex(
                fields=["tenant", "state", "scheduled_for"],
                condition=NOT_SUCCEEDED,
                name="occurrence_tenant_state_time",
            ),
            # The reconciler's window read: one chunk of schedules, a time range, in order.
            models.Index(fields=["schedule", "scheduled_for"], name="occurrence_schedule_time"),
            # The admin list: newest first (id breaks ties in the same direction), and its
            # "manual" filter, which is rare among millions of scheduled runs.
            models.Index(fields=["scheduled_for", "id"], name="occurrence_admin_time"),
            models.Index(
                fields=["scheduled_for"], condition=Q(manual=True), name="occurrence_manual_time"
            ),
            # A tenant user's list, newest first; the overview's oldest pending occurrence.
            models.Index(fields=["tenant", "scheduled_for", "id"], name="occurrence_tenant_time"),
            models.Index(
                fields=["available_at"],
                condition=Q(state__in=["SCHEDULED", "ENQUEUED", "RETRY_WAIT"]),
                name="occurrence_pending_due",
            ),
            # The overview's lag samples: the newest enqueued occurrences, without stepping
            # over the planned ones that are not sent yet.
            models.Index(
                fields=["scheduled_for"],
                condition=Q(enqueued_at__isnull=False),
                name="occurrence_enqueued_time",
            ),
            models.Index(
                fields=["tenant", "scheduled_for"],
                condition=Q(enqueued_at__isnull=False),
                name="occurrence_tenant_enqueued",
            ),
            # Rows tried more than once (migration 0029): with the rows not SUCCEEDED, the
            # only ones that can hold a failed attempt; the admin list's last failure.
            models.Index(
                fields=["schedule", "scheduled_for"],
                condition=Q(attempt_count__gt=1),
                name="occurrence_retried",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.state} @ {self.scheduled_for.isoformat()}"

    @property
    def lag_seconds(self) -> float | None:
        """schedule_lag = enqueued_at - scheduled_for."""
        if self.enqueued_at is None:
            return None
        return (self.enqueued_at - self.scheduled_for).total_seconds()


class SkippedSpan(models.Model):
    """Late fire times a materializer pass jumped over without a row each, on purpose.

    After an outage with more late fire times than ``max_missed_per_pass`` the misfire policy
    records the newest ones (MISSED, or fired) and jumps over the older ones. This row, written
    in the same transaction as the cursor move, says which: the fire times of
    ``schedule_version`` in ``[first_at, resume_at)``. The reconciler reports them as
    ``skipped_by_policy`` instead of ABSENT.
    """

    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="skipped_spans")
    schedule_version = models.PositiveIntegerField()
    first_at = models.DateTimeField()
    resume_at = models.DateTimeField()
    recorded_at = models.DateTimeField()
    reason = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        ordering = ["schedule", "first_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["schedule", "schedule_version", "first_at"], name="skipped_span_uniq"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.schedule_id} v{self.schedule_version} [{self.first_at}, {self.resume_at})"


class PrunedHistory(models.Model):
    """What retention took of a schedule's history, as much as backfill needs of it: every
    occurrence of the schedule it ever deleted had its ``scheduled_for`` in
    ``[first, through]``; ``ran`` and ``backfilled`` are the ``scheduled_for`` of those that
    backfill's rule leaves out (:mod:`django_app.schedules.backfill`): ``ran``, a row of a
    schedule version in a state that ran or may run (SUCCEEDED, DEAD, ...), ``backfilled``,
    a backfill row (version 0) in any state. The deleted rows that are neither (MISSED,
    CANCELED, SKIPPED_OVERLAP of a version) count for backfill as if absent: it runs those
    times. ``passed_over`` keeps those of them a new version must not plan again (MISSED,
    SKIPPED_OVERLAP, CANCELED after a claim: :data:`django_app.schedules.replan.TAKEN`),
    which a re-plan reads with ``ran`` and ``backfilled``. All three are sets in the compact
    text form of :mod:`celery_scheduler.core.timeset`; ``passed_over`` is kept from
    migration 0030 on.

    ``[unknown_from, unknown_through]``: the span pruned before these sets were kept
    (migration 0024), where backfill cannot tell and refuses (``HistoryPruned``); NULL on
    an install that never pruned before it.

    Written by :func:`django_app.operations.retention.record_pruned` in the transaction that
    deletes the rows (a prune batch, a dropped partition). Never aged out.
    """

    # No database foreign key: checking one would take a share lock on the schedule row from
    # inside a prune batch that holds occurrence locks, and a replay (schedule, then
    # occurrence) would deadlock with it. Django still deletes the row with its schedule.
    schedule = models.OneToOneField(
        Schedule, on_delete=models.CASCADE, primary_key=True, related_name="+", db_constraint=False
    )
    first = models.DateTimeField()
    through = models.DateTimeField()
    ran = models.TextField(blank=True, default="")
    backfilled = models.TextField(blank=True, default="")
    passed_over = models.TextField(blank=True, default="")
    unknown_from = models.DateTimeField(null=True, blank=True)
    unknown_through = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.schedule_id} pruned [{self.first}, {self.through}]"


class ManualRunKey(models.Model):
    """One ``run_now(idempotency_key=K)``: the occurrence it created, kept after retention
    prunes that occurrence, so K never creates a second run.

    ``occurrence_id`` is ``manual_occurrence_id(schedule, K)``, written with the occurrence.
    ``state`` and ``finished_at`` are empty while the occurrence exists; retention copies
    them here when it deletes it (:func:`django_app.operations.retention.record_pruned`),
    and run now answers a repeated K from this row. Never aged out (one narrow row per
    keyed run, deleted with its schedule).
    """

    occurrence_id = models.UUIDField(primary_key=True)
    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="+")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    schedule_version = models.PositiveIntegerField()
    scheduled_for = models.DateTimeField()
    state = models.CharField(max_length=16, blank=True, default="")
    finished_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return str(self.occurrence_id)


class PartitionKeyMixin(models.Model):
    """The occurrence's ``scheduled_for``, copied onto its attempts and outbox row.

    On PostgreSQL the three tables are range-partitioned by it (django_app.db.partitions),
    so one day's occurrences, attempts and outbox rows live in one partition each and
    retention drops them together. It never changes after the row is written."""

    #: The occurrence's ``scheduled_for`` (the partition key on PostgreSQL).
    scheduled_for = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        fill_partition_key([self])
        super().save(*args, **kwargs)


class Attempt(PartitionKeyMixin):
    """One delivery/processing try of an occurrence, under one fencing token."""

    # No database foreign key: on PostgreSQL the occurrence table is partitioned and its
    # unique key is (id, scheduled_for). Deletes cascade in the ORM, and retention deletes
    # an occurrence's attempts with it.
    occurrence = models.ForeignKey(
        Occurrence, on_delete=models.CASCADE, related_name="attempts", db_constraint=False
    )
    number = models.PositiveIntegerField()
    fencing_token = models.BigIntegerField()
    worker = models.CharField(max_length=200, blank=True, default="")
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(
        max_length=16, choices=_choices(AttemptOutcome), default=AttemptOutcome.RUNNING.value
    )
    error = models.TextField(blank=True, default="")
    result = models.JSONField(null=True, blank=True)

    objects = PartitionKeyQuerySet.as_manager()

    class Meta:
        ordering = ["occurrence", "number"]
        constraints = [
            models.UniqueConstraint(fields=["occurrence", "number"], name="attempt_number_uniq"),
            models.UniqueConstraint(
                fields=["occurrence", "fencing_token"], name="attempt_fencing_uniq"
            ),
            check_constraint(
                condition=_in_enum("outcome", AttemptOutcome), name="attempt_outcome_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"attempt {self.number} of {self.occurrence_id} ({self.outcome})"


class OutboxEntry(PartitionKeyMixin):
    """A message to publish for one occurrence, written in the materializing transaction.

    ``sent_at`` is set only after the broker accepted the message (at-least-once).
    """

    # No database foreign key, as Attempt.occurrence. Unique per occurrence: on PostgreSQL
    # (occurrence, scheduled_for), the partitioned form of the same promise.
    occurrence = models.OneToOneField(
        Occurrence, on_delete=models.CASCADE, related_name="outbox", db_constraint=False
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    shard = models.PositiveIntegerField(default=0)
    available_at = models.DateTimeField()
    priority = models.PositiveSmallIntegerField(default=0)
    sent_at = models.DateTimeField(null=True, blank=True)
    #: Publishes since a worker last received the message (a worker sending it back, by a
    #: deferral, a retry or a lost lease, starts it over): the redelivery backoff's count.
    publish_count = models.PositiveIntegerField(default=0)
    #: Relay claim (for databases without SKIP LOCKED, and to hold rows in a dispatcher).
    claimed_by = models.CharField(max_length=200, blank=True, default="")
    claim_expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = OutboxQuerySet.as_manager()

    class Meta:
        verbose_name_plural = "outbox entries"
        indexes = [
            models.Index(
                fields=["available_at"],
                condition=Q(sent_at__isnull=True),
                name="outbox_due",
            ),
            models.Index(
                fields=["shard", "available_at"],
                condition=Q(sent_at__isnull=True),
                name="outbox_due_by_shard",
            ),
            # The tenants list's "published in the last minute" (sent_at in the last 60 s).
            # BRIN on PostgreSQL: a summary per range of pages, which a mark writes only when
            # it widens its range's (sent_at grows with the pages the rows were planned into),
            # instead of a B-tree entry per publish; without it that count read every outbox
            # row ever kept.
            PostgresBrinIndex(fields=["sent_at"], name="outbox_sent_at"),
        ]

    def __str__(self) -> str:
        return f"outbox {self.occurrence_id} (sent={self.sent_at is not None})"


class ShardLease(models.Model):
    """Ownership of one logical shard by one beat node, with a fencing generation."""

    shard = models.PositiveIntegerField(primary_key=True)
    owner = models.CharField(max_length=200, blank=True, default="")
    expires_at = models.DateTimeField(null=True, blank=True)
    fencing_token = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"shard {self.shard} -> {self.owner or '-'} (gen {self.fencing_token})"


class BeatNode(models.Model):
    """A beat node's heartbeat: the live-node count sets each node's fair share of shards."""

    name = models.CharField(max_length=200, primary_key=True)
    last_seen = models.DateTimeField()
    #: When the beat loop last finished a step (the liveness probe's signal). ``last_seen``
    #: is also renewed by the lease keeper thread, so it can advance while the loop is stuck.
    progress_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name} (seen {self.last_seen.isoformat()})"


class ConcurrencySlot(models.Model):
    """One of C slots of a concurrency key (a schedule or a named group) of one tenant.

    Group names are chosen by tenants, so the tenant is part of the key: two tenants that
    both call their group ``reports`` have two groups.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=200)
    slot = models.PositiveIntegerField()
    owner = models.CharField(max_length=200, blank=True, default="")
    occurrence_id = models.UUIDField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    fencing_token = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "key", "slot"], name="concurrency_slot_tenant_uniq"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}:{self.key}[{self.slot}] -> {self.owner or '-'}"


class IdempotencyRecord(models.Model):
    """The business key of an effect done by an ``@idempotent_task`` and its stored result.

    Keys are namespaced by tenant and task name: the same key string in another tenant or
    another task is another effect. ``tenant`` is NULL in the default namespace (a task run
    outside the scheduler). Two partial unique indexes, because NULLs never collide in a
    plain one on PostgreSQL.
    """

    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, null=True, blank=True, related_name="+"
    )
    key = models.CharField(max_length=255)
    task_name = models.CharField(max_length=200)
    occurrence_id = models.UUIDField(null=True, blank=True)
    task_id = models.CharField(max_length=255, blank=True, default="")
    result = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "task_name", "key"],
                condition=Q(tenant__isnull=False),
                name="idempotency_tenant_task_key_uniq",
            ),
            models.UniqueConstraint(
                fields=["task_name", "key"],
                condition=Q(tenant__isnull=True),
                name="idempotency_default_task_key_uniq",
            ),
        ]

    def __str__(self) -> str:
        return self.key


class SchedulerOverview(Schedule):
    """No data of its own: the admin index's entry for the scheduler overview page.

    Django's admin index lists models only, so this proxy gives the overview a row there,
    beside Schedules and Occurrences (its changelist redirects to the overview).
    """

    class Meta:
        proxy = True
        verbose_name = _("overview")
        verbose_name_plural = _("overview")


class AuditEntry(models.Model):
    """Who changed what through the API, and why, when the caller says.

    Written right after each lifecycle call made through ``celery_scheduler.api`` (create,
    update, pause, resume, cancel, run now, replay); ``actor`` and ``reason`` are what the
    caller passed (empty when it passed nothing). The admin also writes Django's own admin
    log for the actions it takes.
    """

    at = models.DateTimeField()
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    # Indexed by a composite index that leads with it (Meta): no index of its own.
    schedule = models.ForeignKey(
        Schedule,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="audit_entries",
        db_index=False,
    )
    occurrence_id = models.UUIDField(null=True, blank=True)
    action = models.CharField(max_length=32)
    actor = models.CharField(max_length=200, blank=True, default="")
    reason = models.TextField(blank=True, default="")
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        indexes = [models.Index(fields=["schedule", "at"], name="audit_schedule_time")]
        verbose_name_plural = _("audit entries")

    def __str__(self) -> str:
        who = self.actor or "api"
        return f"{self.at:%Y-%m-%d %H:%M:%S} {who}: {self.action}"


class ApiToken(models.Model):
    """A tenant's HTTP API token: only a SHA-256 of the secret is stored.

    The token a client sends is ``<prefix>.<secret>``; ``prefix`` (public, unique) finds the
    row, and the secret's digest is compared in constant time. A revoked token stays for
    audit (``revoked_at``) and never authenticates again.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=200, blank=True, default="")
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    digest = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["tenant", "created_at"]
        verbose_name = _("API token")

    def __str__(self) -> str:
        return f"{self.prefix} ({self.tenant_id}{', revoked' if self.revoked_at else ''})"
