"""Request and response shapes. Requests are only typed here (strings, integers, JSON,
aware datetimes); every rule about their values is ``celery_scheduler.api``'s, which
answers a ``ValidationError`` naming the field. Response serializers exist for the OpenAPI
schema: the views answer ``celery_scheduler.api_types.as_json`` of the API's results.

``null`` is taken (``allow_null``) where the Python API takes None for the same argument,
and passed on as None, so it means there what None means: the default, no limit, no key.
Where the API needs a value (a schedule's name and task, a backfill's range, a slug),
null is refused with the field's name."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils.dateparse import parse_datetime
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from celery_scheduler.core.enums import DstFold, DstGap, MisfirePolicy, OverlapPolicy, ScheduleState


class AwareDateTimeField(serializers.DateTimeField):
    """ISO 8601 with an offset (``...Z`` or ``+02:00``): a naive time is refused, not guessed."""

    def to_internal_value(self, value: Any) -> datetime:
        try:
            parsed = parse_datetime(value) if isinstance(value, str) else None
        except ValueError:  # well formed but impossible: February 30, hour 25, +24:00
            parsed = None
        if parsed is None:
            self.fail("invalid", format="ISO 8601 with a UTC offset, e.g. 2026-01-31T02:00:00Z")
        assert parsed is not None
        if parsed.tzinfo is None:
            raise serializers.ValidationError("needs a UTC offset (e.g. Z or +02:00)")
        return parsed


class Text(serializers.CharField):
    """A JSON string, as sent: a number or boolean is refused, not turned into text."""

    default_error_messages = {"invalid": "Not a valid string."}

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class Boolean(serializers.BooleanField):
    """A JSON boolean, as sent: ``"false"``, ``""`` or ``0`` are refused, not read as one
    (the Python API takes a bool only where a value cancels schedules: ``prune``)."""

    default_error_messages = {"invalid": "Must be true or false (a JSON boolean)."}

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid")
        return data


def _text(**kw: Any) -> Text:
    return Text(required=False, allow_blank=True, trim_whitespace=False, **kw)


def _int(**kw: Any) -> serializers.IntegerField:
    return serializers.IntegerField(required=False, **kw)


def _choice(enum: Any, **kw: Any) -> serializers.ChoiceField:
    return serializers.ChoiceField(choices=[m.value for m in enum], required=False, **kw)


class Strict(serializers.Serializer):
    """Unknown keys are a 400 naming them (a typo must not be silently ignored)."""

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(self.initial_data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError({unknown[0]: "unknown field"})
        return attrs

    def given(self) -> dict[str, Any]:
        """The validated fields the client sent (absent ones keep the API's defaults)."""
        return dict(self.validated_data)

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        for name, field in fields.items():
            # DRF's "This field may not be null." names no field, and a 400's `detail`
            # stands for the first of them: say which, and why it needs a value.
            why = "it is required" if field.required else "leave it out to keep its value"
            field.error_messages["null"] = f"{name} cannot be null: {why}"
        return fields


class ScheduleFieldsMixin(Strict):
    # Each takes null, as create_schedule and update_schedule take None: the default (in an
    # update too, where null sets the default back and a field left out keeps its value).
    # A comment, not a docstring: drf-spectacular would describe the subclasses with it.
    cron = _text(allow_null=True, help_text="Five-field cron or a macro, read in `timezone`.")
    timezone = _text(allow_null=True)
    dst_gap = _choice(
        DstGap, allow_null=True,
        help_text="Cron only: a wall time the spring-forward gap removes is SKIPped "
        "(default) or SHIFTed to the first instant after the gap.",
    )  # fmt: skip
    dst_fold = _choice(
        DstFold, allow_null=True,
        help_text="Cron only: a wall time the fall-back repeats runs at its FIRST instant "
        "(default), its SECOND, or BOTH.",
    )  # fmt: skip
    interval = _int(allow_null=True, help_text="Seconds between runs (fixed rate from start_at).")
    run_at = AwareDateTimeField(required=False, allow_null=True, help_text="One-off instant.")
    args = serializers.JSONField(
        required=False, allow_null=True, help_text="JSON list of task arguments."
    )
    kwargs = serializers.JSONField(
        required=False, allow_null=True, help_text="JSON object of task kwargs."
    )
    queue = _text(allow_null=True)
    priority = _int(allow_null=True)
    misfire_policy = _choice(MisfirePolicy, allow_null=True)
    max_lateness = _int(allow_null=True)
    catchup_cap = _int(allow_null=True)
    overlap_policy = _choice(OverlapPolicy, allow_null=True)
    flexible_window = _int(allow_null=True)
    concurrency_limit = _int(allow_null=True)
    concurrency_group = _text(allow_null=True)
    max_attempts = _int(allow_null=True)
    deadline = _int(allow_null=True)
    start_at = AwareDateTimeField(required=False, allow_null=True)
    end_at = AwareDateTimeField(required=False, allow_null=True)
    max_runs = _int(allow_null=True, help_text="Complete after this many runs.")
    pause_after_failures = _int(allow_null=True)
    tags = serializers.DictField(child=_text(), required=False, allow_null=True)


def _reason() -> Text:
    return _text(
        allow_null=True, help_text="Why, for the audit trail (the actor is the token or user)."
    )


class ScheduleCreate(ScheduleFieldsMixin):
    name = Text(trim_whitespace=False)
    task = Text(trim_whitespace=False)
    tenant = _text(
        allow_null=True, help_text="Tenant slug (superusers; a token always uses its own)."
    )
    idempotency_key = _text(
        allow_null=True, help_text="The same key returns the same schedule (409 if reused)."
    )
    reason = _reason()


class ScheduleItem(ScheduleFieldsMixin):
    """One item of a bulk create or a sync: a create's fields but tenant and reason."""

    name = Text(trim_whitespace=False)
    task = Text(trim_whitespace=False)
    idempotency_key = _text(
        allow_null=True, help_text="Required in a sync: it matches the schedule."
    )


#: Items per bulk create or sync request (a bigger load: several requests, or the Python API).
MAX_ITEMS = 10_000


class BulkCreateRequest(Strict):
    items = serializers.ListField(
        child=serializers.DictField(), max_length=MAX_ITEMS,
        help_text=f"Up to {MAX_ITEMS:,} schedules (the fields of a create, without tenant).",
    )  # fmt: skip
    tenant = _text(
        allow_null=True, help_text="Tenant slug (superusers; a token always uses its own)."
    )
    reason = _reason()


class SyncRequest(BulkCreateRequest):
    prune = Boolean(
        required=False, allow_null=True,
        help_text="Cancel sync-made schedules whose key is not in items.",
    )  # fmt: skip


class ScheduleUpdate(ScheduleFieldsMixin):
    name = _text()
    task = _text()
    expected_version = _int(
        min_value=1, allow_null=True,
        help_text="Apply only if the schedule is still at this version (409).",
    )  # fmt: skip
    reason = _reason()


class EmptyRequest(Strict):
    pass


class ReasonRequest(Strict):
    reason = _reason()


class PauseRequest(ReasonRequest):
    note = _text(allow_null=True, help_text="Kept as the pause reason until resume.")


class RunNowRequest(ReasonRequest):
    idempotency_key = _text(allow_null=True, help_text="The same key returns the same manual run.")


class SkipRequest(ReasonRequest):
    scheduled_for = AwareDateTimeField(
        required=False, allow_null=True, help_text="Default: the next one."
    )
    note = _text(allow_null=True)


class BackfillRequest(ReasonRequest):
    start = AwareDateTimeField()
    end = AwareDateTimeField()
    overlap_policy = _choice(OverlapPolicy, allow_null=True)


class FilterFields(Strict):
    tenant = _text()
    state = _choice(ScheduleState)
    task = _text()
    tag = serializers.ListField(
        child=_text(), required=False, help_text="'key=value' or 'key'; repeat to AND."
    )
    name_contains = _text()
    next_run_before = AwareDateTimeField(required=False)
    next_run_after = AwareDateTimeField(required=False)


class ListQuery(FilterFields):
    limit = _int(min_value=1, max_value=1000)
    cursor = _text(help_text="`next_cursor` of the previous page.")


class BulkRequest(FilterFields):
    note = _text(allow_null=True, help_text="Pause note (bulk pause only).")
    reason = _reason()

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        # In a body a filter may be null: no filter, as None is to the bulk calls. (The same
        # fields in a query string, ListQuery, never see a null: not nullable there.)
        for field in fields.values():
            field.allow_null = True
        return fields


class DescribeQuery(Strict):
    next_count = _int()
    last_count = _int()


class OccurrenceQuery(Strict):
    limit = _int(min_value=1, max_value=1000)
    cursor = _text()


class TenantCreate(Strict):
    slug = Text(trim_whitespace=False)
    name = _text(allow_null=True)
    max_schedules = _int(allow_null=True)
    max_trigger_rate = _int(allow_null=True)
    max_running = _int(allow_null=True)
    catchup_rate = _int(allow_null=True)
    relay_weight = _int(allow_null=True)


class TenantUpdate(TenantCreate):
    slug = _text(read_only=True)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        # read_only would drop it silently: a client renaming a tenant must hear it did not.
        if "slug" in self.initial_data:
            raise serializers.ValidationError({"slug": "a tenant's slug cannot be changed"})
        return super().validate(attrs)


# Responses (documentation of the JSON the views answer).


#: DRF's error tree of a request that failed its typing: every refused field by name, with
#: its messages, or (a field with parts: ``tags``, a body's ``items[3]``, a list's ``1``)
#: the same tree of its parts. Recursive, so a named component that refers to itself.
FIELD_ERRORS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Every refused field by name: its messages, or for a field with parts "
    "(`tags`, `items[3]`, a list's index) the same object for its parts.",
    "additionalProperties": {
        "oneOf": [
            {"type": "array", "items": {"type": "string"}},
            {"$ref": "#/components/schemas/FieldErrors"},
        ]
    },
}


@extend_schema_field(FIELD_ERRORS_SCHEMA, component_name="FieldErrors")
class FieldErrors(serializers.DictField):
    pass


class Error(serializers.Serializer):
    error = serializers.CharField()
    detail = serializers.CharField()
    field = serializers.CharField(allow_null=True)
    # Named like Serializer.fields, which it does not replace: DRF's metaclass takes declared
    # fields out of the class body.
    fields = FieldErrors(  # type: ignore[assignment]
        required=False,
        help_text="On a 400 `validation_error` of the request's typing (a wrong type, an "
        "unknown field): every refused field, where `field` names the first. The API's own "
        "checks refuse one field at a time and leave it out.",
    )


class ScheduleSummary(serializers.Serializer):
    id = serializers.UUIDField()
    tenant = serializers.CharField()
    name = serializers.CharField()
    task = serializers.CharField()
    kind = serializers.CharField()
    cron = serializers.CharField()
    timezone = serializers.CharField()
    dst_gap = serializers.CharField(help_text="SKIP or SHIFT (cron DST policy).")
    dst_fold = serializers.CharField(help_text="FIRST, SECOND or BOTH (cron DST policy).")
    interval_seconds = serializers.IntegerField(allow_null=True)
    run_at = serializers.DateTimeField(allow_null=True)
    state = serializers.CharField()
    state_reason = serializers.CharField()
    version = serializers.IntegerField()
    next_run_at = serializers.DateTimeField(allow_null=True)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    tags = serializers.DictField(child=serializers.CharField())
    max_runs = serializers.IntegerField(allow_null=True)
    remaining_runs = serializers.IntegerField(allow_null=True)


class SchedulePage(serializers.Serializer):
    items = ScheduleSummary(many=True)
    next_cursor = serializers.CharField(allow_null=True)


class FireTime(serializers.Serializer):
    utc = serializers.DateTimeField()
    local = serializers.DateTimeField()
    note = serializers.CharField()


class OccurrenceSummary(serializers.Serializer):
    id = serializers.UUIDField()
    scheduled_for = serializers.DateTimeField()
    version = serializers.IntegerField()
    state = serializers.CharField()
    origin = serializers.CharField()
    attempts = serializers.IntegerField()
    lag_seconds = serializers.FloatField(allow_null=True)
    enqueued_at = serializers.DateTimeField(allow_null=True)
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    reason = serializers.CharField()
    last_error = serializers.CharField()
    task_id = serializers.CharField(
        help_text="The Celery task id of every delivery of this occurrence (AsyncResult, Flower)."
    )


class OccurrencePage(serializers.Serializer):
    items = OccurrenceSummary(many=True)
    next_cursor = serializers.CharField(allow_null=True)


class Counters(serializers.Serializer):
    runs = serializers.IntegerField()
    succeeded = serializers.IntegerField()
    failures = serializers.IntegerField()
    dead = serializers.IntegerField()
    missed = serializers.IntegerField()
    skipped_overlap = serializers.IntegerField()
    skipped = serializers.IntegerField()
    canceled = serializers.IntegerField()
    pending = serializers.IntegerField()


class ScheduleDescription(serializers.Serializer):
    schedule = ScheduleSummary()
    settings = serializers.DictField()
    current_version = serializers.DictField(allow_null=True)
    paused_at = serializers.DateTimeField(allow_null=True)
    next_fire_times = FireTime(many=True)
    recent = OccurrenceSummary(many=True)
    counters = Counters()
    runs_counted = serializers.IntegerField()
    pause_after_failures = serializers.IntegerField(allow_null=True)
    consecutive_failures = serializers.IntegerField()
    skipped_times = serializers.ListField(child=serializers.DateTimeField())


class LifecycleOutcome(serializers.Serializer):
    schedule_id = serializers.UUIDField()
    version = serializers.IntegerField()
    state = serializers.CharField()
    changed = serializers.BooleanField()
    invalidated = serializers.IntegerField()
    still_running = serializers.ListField(child=serializers.UUIDField())
    message = serializers.CharField()


class SkipOutcome(serializers.Serializer):
    schedule_id = serializers.UUIDField()
    scheduled_for = serializers.DateTimeField()
    occurrence_id = serializers.UUIDField(allow_null=True)
    reason = serializers.CharField()


class BackfillOutcome(serializers.Serializer):
    schedule_id = serializers.UUIDField()
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    fire_times = serializers.IntegerField()
    created = serializers.ListField(child=serializers.UUIDField())
    already_backfilled = serializers.IntegerField()
    already_ran = serializers.IntegerField()
    releases_from = serializers.DateTimeField(allow_null=True)
    releases_until = serializers.DateTimeField(allow_null=True)


class BulkItem(serializers.Serializer):
    schedule_id = serializers.UUIDField()
    name = serializers.CharField()
    outcome = serializers.ChoiceField(choices=["changed", "unchanged", "refused"])
    state = serializers.CharField()
    reason = serializers.CharField()


class BulkOutcome(serializers.Serializer):
    action = serializers.CharField()
    items = BulkItem(many=True)


class BulkCreateOutcome(serializers.Serializer):
    schedule_ids = serializers.ListField(child=serializers.UUIDField())
    created = serializers.IntegerField()
    existing = serializers.IntegerField()


class SyncOutcome(serializers.Serializer):
    created = serializers.ListField(child=serializers.CharField())
    updated = serializers.ListField(child=serializers.CharField())
    unchanged = serializers.ListField(child=serializers.CharField())
    stopped = serializers.ListField(child=serializers.CharField())
    pruned = serializers.ListField(child=serializers.CharField())


class TenantInfo(serializers.Serializer):
    slug = serializers.CharField()
    name = serializers.CharField()
    max_schedules = serializers.IntegerField(allow_null=True)
    max_trigger_rate = serializers.IntegerField(allow_null=True)
    max_running = serializers.IntegerField(allow_null=True)
    catchup_rate = serializers.IntegerField(allow_null=True)
    relay_weight = serializers.IntegerField()
    created_at = serializers.DateTimeField()


class TenantUsage(serializers.Serializer):
    tenant = TenantInfo()
    schedules = serializers.IntegerField()
    running = serializers.IntegerField()
    published_last_minute = serializers.IntegerField()
    catchup_backlog = serializers.IntegerField()
    measured_at = serializers.DateTimeField()
