"""History: occurrences and their attempts, read-only; dead letters with a replay action.

Occurrences are facts written by the scheduler and the workers, so the admin never edits
or deletes them. The only write is a replay of a DEAD occurrence, through the API.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.text import smart_split, unescape_string_literal
from django.utils.translation import gettext_lazy as _
from django.views.decorators.http import require_POST

from celery_scheduler.core.enums import OccurrenceState
from django_app.admin import actions, display, scale
from django_app.admin.tenancy import TenantScopedAdmin, scope
from django_app.models import Attempt, Occurrence, Schedule
from django_app.schedules.reads import BACKFILL_REASON

#: Quick views above the occurrence list: (label, state filter or None for all).
TABS = (
    (_("All"), None),
    (_("Dead letters"), OccurrenceState.DEAD.value),
    (_("Running"), OccurrenceState.RUNNING.value),
    (_("Retry wait"), OccurrenceState.RETRY_WAIT.value),
    (_("Missed"), OccurrenceState.MISSED.value),
)


#: A search term naming at most this many schedules looks their occurrences up by id.
MAX_NAMED_SCHEDULES = 1000

#: Tabs whose rows carry an error worth a column.
ERROR_TABS = (OccurrenceState.DEAD.value, OccurrenceState.RETRY_WAIT.value)


class ReadOnlyMixin:
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class AttemptInline(ReadOnlyMixin, admin.TabularInline):
    model = Attempt
    extra = 0
    fields = (
        "number",
        "outcome",
        "fencing_token",
        "worker",
        "started_column",
        "finished_column",
        "short_error",
    )
    readonly_fields = fields

    @admin.display(description=_("Started at"))
    def started_column(self, obj: Attempt) -> str:
        return display.instant(obj.started_at)

    @admin.display(description=_("Finished at"))
    def finished_column(self, obj: Attempt) -> str:
        return display.instant(obj.finished_at)

    show_change_link = True
    ordering = ("number",)

    @admin.display(description=_("Error"))
    def short_error(self, obj: Attempt) -> str:
        first = (obj.error or "").strip().splitlines()
        return first[-1][:120] if first else "—"


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def page_title(obj: Occurrence) -> str:
    """An occurrence as its page names it: schedule, local time to the second, and why it ran.

    For example ``nightly invoices at 2026-03-01 02:00:00 CET (run now)``.
    """
    schedule = obj.schedule
    zone = display.zone_or_utc(schedule.timezone)
    when = obj.scheduled_for.astimezone(zone)
    title = f"{schedule.name} at {when:%Y-%m-%d %H:%M:%S} {when.tzname() or schedule.timezone}"
    if obj.reason == BACKFILL_REASON:
        return f"{title} ({_('backfill')})"
    if obj.manual:
        return f"{title} ({_('run now')})"
    return title


@admin.register(Occurrence)
class OccurrenceAdmin(ReadOnlyMixin, TenantScopedAdmin):
    change_list_template = "admin/django_app/occurrence/change_list.html"
    change_form_template = "admin/django_app/occurrence/change_form.html"
    list_display = (
        "short_id",
        "schedule_link",
        "state_column",
        "scheduled_column",
        "lag_column",
        "attempts_column",
        "error_column",
        "tenant_column",
    )
    list_filter = ("state", "manual", "tenant")
    search_fields = ("=id", "schedule__name", "schedule__task")
    list_select_related = ("schedule", "tenant")
    # Drilled down by its bounds only: {% bounded_date_hierarchy %} in the list template.
    date_hierarchy = "scheduled_for"
    # Only columns with an index to sort by: (scheduled_for, id) and the primary key.
    sortable_by = ("short_id", "scheduled_column")
    inlines = (AttemptInline,)
    actions = ("replay_selected",)
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "task_id_column",
                    "schedule_link",
                    "task_column",
                    "args_block",
                    "kwargs_block",
                    "state_column",
                    "trigger_column",
                    "reason",
                )
            },
        ),
        (
            _("Timing"),
            {
                "fields": (
                    "scheduled_column",
                    "available_column",
                    "enqueued_column",
                    "started_column",
                    "finished_column",
                    "duration_column",
                    "retry_column",
                    "lag_column",
                )
            },
        ),
        (
            _("Execution"),
            {
                "fields": (
                    "attempt_count",
                    "fencing_token",
                    "lease_owner",
                    "lease_expires_column",
                    "last_error_block",
                    "result",
                )
            },
        ),
    )
    readonly_fields = (
        *("task_id_column", "schedule_link", "task_column", "args_block", "kwargs_block"),
        "state_column",
        *("trigger_column", "reason", "scheduled_column", "available_column", "enqueued_column"),
        *("started_column", "finished_column", "duration_column", "retry_column", "lag_column"),
        *("attempt_count", "fencing_token", "lease_owner", "lease_expires_column"),
        *("last_error_block", "result"),
    )

    def get_list_display(self, request: HttpRequest) -> Any:
        # The error is what a dead-letter or retry view is for; elsewhere it is mostly empty
        # and only takes width (the list must read at 1,400 px).
        columns = list(super().get_list_display(request))
        if request.GET.get("state__exact") in ERROR_TABS:
            columns.remove("lag_column")  # how late it was sent matters less than why it failed
        else:
            columns.remove("error_column")
        return columns

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        """``search_fields`` as Django reads them, with the schedule terms as a semi-join.

        Django would OR ``occurrence.id = term`` with ``schedule.name ILIKE`` over a join of
        every occurrence; here each term first finds the schedules it names (a scan of the
        schedules, not of the occurrences), then their occurrences through the
        (schedule, scheduled_for) index. At most one query more, whatever the rows.
        """
        by_schedule = Q()  # terms that can only match the schedule: one lookup for all
        for bit in smart_split(search_term):
            if bit.startswith(('"', "'")) and bit[0] == bit[-1]:
                bit = unescape_string_literal(bit)
            names = Q(name__icontains=bit) | Q(task__icontains=bit)
            try:
                occurrence_id = uuid.UUID(bit)
            except ValueError:
                by_schedule &= names
                continue
            also_named = Schedule.objects.filter(names).values("pk")
            queryset = queryset.filter(Q(pk=occurrence_id) | Q(schedule_id__in=also_named))
        if by_schedule:
            # Only the user's schedules can own their occurrences; any order: no sort.
            named = scope(request, Schedule.objects.filter(by_schedule)).order_by()
            # A few named schedules: their ids, so the database walks their occurrences by
            # index instead of hashing the term's schedules against every occurrence.
            ids = list(named.values_list("pk", flat=True)[: MAX_NAMED_SCHEDULES + 1])
            few = len(ids) <= MAX_NAMED_SCHEDULES
            queryset = queryset.filter(schedule_id__in=ids if few else named.values("pk"))
        return queryset, False

    def has_replay_permission(self, request: HttpRequest) -> bool:
        # Replay is the one write on occurrences; it needs the model's change permission
        # even though the admin form itself is read-only.
        return request.user.has_perm("django_app.change_occurrence")

    @admin.action(description=_("Replay selected dead occurrences"), permissions=["replay"])
    def replay_selected(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        actions.replay(request, queryset)

    def get_urls(self) -> list[URLPattern]:
        return [
            path(
                "<path:object_id>/replay/",
                self.admin_site.admin_view(require_POST(self.replay_view)),
                name="django_app_occurrence_replay",
            ),
            *super().get_urls(),
        ]

    def replay_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The Replay button on a dead occurrence's page (same API call as the list action)."""
        occurrence = self.get_object(request, object_id)  # 404 outside the user's tenant
        if not self.has_replay_permission(request):
            raise PermissionDenied
        actions.replay(request, [occurrence])
        return HttpResponseRedirect(
            reverse("admin:django_app_occurrence_change", args=[occurrence.pk])
        )

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Any = None,
    ) -> HttpResponse:
        if (
            obj is not None
            and obj.state == OccurrenceState.DEAD.value
            and self.has_replay_permission(request)
        ):
            context["replay_url"] = reverse("admin:django_app_occurrence_replay", args=[obj.pk])
        if obj is not None:
            # Django's subtitle (the <h2> and the <title>) is str(obj): a UUID, a state and a
            # raw ISO timestamp. Say what ran when instead.
            context["subtitle"] = page_title(obj)
        return super().render_change_form(request, context, add, change, form_url, obj)

    # --- columns and read-only blocks ---------------------------------------------------

    @admin.display(description=_("Occurrence"), ordering="id")
    def short_id(self, obj: Occurrence) -> str:
        tag = self.manual_column(obj)
        return format_html('<code title="{}">{}</code> {}', obj.pk, str(obj.pk)[:8], tag)

    @admin.display(description=_("Schedule"), ordering="schedule__name")
    def schedule_link(self, obj: Occurrence) -> str:
        url = reverse("admin:django_app_schedule_change", args=[obj.schedule_id])
        return format_html(
            '<a href="{}">{}</a> <small>v{}</small>', url, obj.schedule.name, obj.schedule_version
        )

    @admin.display(description=_("Occurrence id = Celery task id"))
    def task_id_column(self, obj: Occurrence) -> str:
        # Every delivery of the occurrence carries its id as the Celery task id, so this is
        # what AsyncResult, Flower and the worker log name the run by.
        return format_html('<code class="cs-mono">{}</code>', obj.pk)

    @admin.display(description=_("Task"))
    def task_column(self, obj: Occurrence) -> str:
        return format_html('<code class="cs-mono">{}</code>', obj.schedule.task)

    @admin.display(description=_("Args"))
    def args_block(self, obj: Occurrence) -> str:
        return format_html('<code class="cs-mono">{}</code>', _json(obj.schedule.args))

    @admin.display(description=_("Kwargs"))
    def kwargs_block(self, obj: Occurrence) -> str:
        return format_html('<code class="cs-mono">{}</code>', _json(obj.schedule.kwargs))

    @admin.display(description=_("State"), ordering="state")
    def state_column(self, obj: Occurrence) -> str:
        return display.badge(obj.state)

    @admin.display(description=_("Run"), ordering="manual")
    def manual_column(self, obj: Occurrence) -> str:
        # "Scheduled" is the ordinary case: only a manual run is worth a mark.
        if obj.reason == BACKFILL_REASON:
            return format_html('<span class="cs-tag cs-backfill">{}</span>', _("backfill"))
        if obj.manual:
            return format_html('<span class="cs-tag">{}</span>', _("manual"))
        return ""

    @admin.display(description=_("Attempts"), ordering="attempt_count")
    def attempts_column(self, obj: Occurrence) -> int:
        return obj.attempt_count

    @admin.display(description=_("Triggered by"))
    def trigger_column(self, obj: Occurrence) -> str:
        if obj.reason == BACKFILL_REASON:
            return str(_("a backfill (manual)"))
        return str(_("run now (manual)") if obj.manual else _("the schedule"))

    @admin.display(description=_("Error"))
    def error_column(self, obj: Occurrence) -> str:
        lines = (obj.last_error or "").strip().splitlines()
        if not lines:
            return ""
        return format_html(
            '<span class="cs-error-line" title="{}">{}</span>', obj.last_error, lines[-1][:100]
        )

    @admin.display(description=_("Scheduled for"), ordering="scheduled_for")
    def scheduled_column(self, obj: Occurrence) -> str:
        return display.local_and_utc(obj.scheduled_for, obj.schedule.timezone, seconds=True)

    @admin.display(description=_("Available at"))
    def available_column(self, obj: Occurrence) -> str:
        return display.instant(obj.available_at)

    @admin.display(description=_("Enqueued at"))
    def enqueued_column(self, obj: Occurrence) -> str:
        return display.instant(obj.enqueued_at)

    @admin.display(description=_("Started at"))
    def started_column(self, obj: Occurrence) -> str:
        return display.instant(obj.started_at)

    @admin.display(description=_("Finished at"))
    def finished_column(self, obj: Occurrence) -> str:
        return display.instant(obj.finished_at)

    @admin.display(description=_("Duration"))
    def duration_column(self, obj: Occurrence) -> str:
        if obj.started_at is None or obj.finished_at is None:
            return "—"
        return display.fmt_seconds((obj.finished_at - obj.started_at).total_seconds())

    @admin.display(description=_("Retry at"))
    def retry_column(self, obj: Occurrence) -> str:
        return display.instant(obj.retry_at)

    @admin.display(description=_("Lease expires at"))
    def lease_expires_column(self, obj: Occurrence) -> str:
        return display.instant(obj.lease_expires_at)

    @admin.display(description=_("Lag"))
    def lag_column(self, obj: Occurrence) -> str:
        return display.run_lag(obj.lag_seconds, obj.reason)

    @admin.display(description=_("Tenant"), ordering="tenant__slug")
    def tenant_column(self, obj: Occurrence) -> str:
        return obj.tenant.slug

    @admin.display(description=_("Last error"))
    def last_error_block(self, obj: Occurrence) -> str:
        if not obj.last_error:
            return "—"
        return format_html('<pre class="cs-error">{}</pre>', obj.last_error)

    def changelist_extra_context(self, request: HttpRequest) -> dict[str, Any]:
        base = reverse("admin:django_app_occurrence_changelist")
        keep = {k: str(v) for k, v in request.GET.items() if k == "schedule"}
        current = request.GET.get("state__exact")
        scoped = self.get_queryset(request)
        tabs = [
            (
                label,
                base
                + (
                    "?" + urlencode({**keep, **({"state__exact": state} if state else {})})
                    if keep or state
                    else ""
                ),
                state == current,
                scale.count_label(scoped.filter(state=state)) if state else None,
            )
            for label, state in TABS
        ]
        title: Any = (
            _("Dead letters") if current == OccurrenceState.DEAD.value else _("Occurrences")
        )
        schedule = None
        schedule_id = _uuid_or_none(keep.get("schedule"))
        if schedule_id is not None:
            schedule = Schedule.objects.filter(
                pk__in=scoped.values("schedule_id"), pk=schedule_id
            ).first()
            if schedule is not None:
                title = format_html("{} of “{}”", title, schedule.name)
        # A malformed ?schedule= gets no title here; the list itself answers 400 for it.
        return {"tabs": tabs, "title": title, "for_schedule": schedule}


def _uuid_or_none(text: str | None) -> uuid.UUID | None:
    try:
        return uuid.UUID(text) if text else None
    except ValueError:
        return None


@admin.register(Attempt)
class AttemptAdmin(ReadOnlyMixin, TenantScopedAdmin):
    tenant_lookup = "occurrence__tenant"
    list_display = ("__str__", "outcome", "fencing_token", "worker", "started_at", "finished_at")
    list_filter = ("outcome",)
    search_fields = ("=occurrence__id", "worker")
    list_select_related = ("occurrence",)
    fields = (
        "occurrence_link",
        "number",
        "outcome",
        "fencing_token",
        "worker",
        "started_at",
        "heartbeat_at",
        "finished_at",
        "error_block",
        "result",
    )
    readonly_fields = fields

    def has_module_permission(self, request: HttpRequest) -> bool:
        return False  # reached from an occurrence, not from the sidebar

    @admin.display(description=_("Occurrence"))
    def occurrence_link(self, obj: Attempt) -> str:
        url = reverse("admin:django_app_occurrence_change", args=[obj.occurrence_id])
        return format_html('<a href="{}">{}</a>', url, obj.occurrence_id)

    @admin.display(description=_("Error"))
    def error_block(self, obj: Attempt) -> str:
        if not obj.error:
            return "—"
        return format_html('<pre class="cs-error">{}</pre>', obj.error)
