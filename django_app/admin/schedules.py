"""The Schedule admin: one form, a list that shows the truth, lifecycle actions."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ActionForm
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db.models import CharField, Exists, OuterRef, QuerySet, Value
from django.db.models.functions import Concat
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.utils.dateparse import parse_datetime
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.translation import gettext_lazy as _
from django.views.decorators.http import require_POST

from celery_scheduler.core import timemath
from celery_scheduler.core.enums import OccurrenceState, ScheduleState
from django_app.admin import actions, display, scale, schedule_summary, views
from django_app.admin.forms import ScheduleForm
from django_app.admin.tenancy import (
    TenantScopedAdmin,
    has_scope,
    scope,
    sees_all_tenants,
    shows_tenants,
    tenant_of,
)
from django_app.models import Occurrence, Schedule, ScheduleTag

#: Which per-object buttons make sense in which state.
BUTTONS = {
    ScheduleState.ACTIVE.value: ("pause", "cancel", "run_now"),
    ScheduleState.PAUSED.value: ("resume", "cancel", "run_now"),
    ScheduleState.CANCELED.value: (),
    ScheduleState.COMPLETED.value: ("run_now",),
    # Resume un-parks once the timing can be planned (else it says why); edit to fix it.
    ScheduleState.PARKED.value: ("resume", "cancel", "run_now"),
}
BUTTON_LABELS = {
    "pause": _("Pause"),
    "resume": _("Resume"),
    "cancel": _("Cancel schedule"),
    "run_now": _("Run now"),
}


def new_submission_key() -> str:
    return uuid.uuid4().hex


class SubmissionActionForm(ActionForm):
    """The action bar with a key per rendered page: submitting it twice (a double click,
    a resent POST) runs "run now" once (``actions.run_now``)."""

    idempotency_key = forms.CharField(
        required=False, widget=forms.HiddenInput, label="", initial=new_submission_key
    )


#: Task names offered by the task filter at most (search by task finds the others).
MAX_TASK_CHOICES = 200


class TaskFilter(admin.SimpleListFilter):
    title = _("task")
    parameter_name = "task"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        # A loose index scan over (tenant, task) or (task): one probe per name, where a
        # DISTINCT would read every schedule.
        if sees_all_tenants(request):
            where: dict[str, Any] = {}
        elif (tenant := tenant_of(request)) is not None:
            where = {"tenant_id": tenant.pk}
        else:
            return []
        tasks = scale.distinct_values(Schedule, "task", where=where, limit=MAX_TASK_CHOICES)
        return [(t, t) for t in sorted(tasks)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(task=self.value()) if self.value() else queryset


class TagFilter(admin.SimpleListFilter):
    """Filter by one ``key=value`` tag among the schedules the user may see."""

    title = _("tag")
    parameter_name = "tag"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        # A tag's tenant is its schedule's: scope the tags directly (the (tenant, key, value)
        # index), not through a semi-join over every visible schedule.
        pairs = (
            scope(request, ScheduleTag.objects.all())
            .values_list("key", "value")
            .distinct()
            .order_by("key", "value")[:200]
        )
        return [(f"{k}={v}", f"{k}={v}") for k, v in pairs]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if not self.value():
            return queryset
        key, _sep, value = str(self.value()).partition("=")
        return queryset.filter(
            Exists(ScheduleTag.objects.filter(schedule=OuterRef("pk"), key=key, value=value))
        )


#: A search matching at most this many schedules sorts its matches (see get_ordering).
SORT_MATCHES_UP_TO = 200_000
#: Request attribute: the exact number of schedules the list's search matched.
MATCHES_ATTR = "_cs_schedule_search_matches"


class ScheduleChangeList(scale.ScaleChangeList):
    """Attaches each row's run summary, fetched once for the whole page."""

    def get_ordering(self, request: HttpRequest, queryset: QuerySet[Any]) -> list[Any]:
        ordering: list[Any] = super().get_ordering(request, queryset)
        if self.query and ordering and ordering[0] in ("name", "-name"):
            # Django orders before it searches: count the matches here (bounded), and hand
            # the count to the paginator (ScheduleAdmin.get_paginator) instead of a second
            # scan.
            searched, _dup = self.model_admin.get_search_results(request, queryset, self.query)
            matches, few = scale.capped_count(searched, SORT_MATCHES_UP_TO)
            if few:
                setattr(request, MATCHES_ATTR, matches)
        else:
            few = False
        if few:
            # A search with few matches: sort them (found by the trigram indexes) rather than
            # walk the name index testing every schedule until a page of matches turns up,
            # which reads most of the table when the matches sort late. ``name || ''``
            # sorts as ``name`` but no index offers that order. Many matches: the walk finds
            # a page soon, and sorting them all would cost more.
            key = Concat("name", Value(""), output_field=CharField())
            ordering[0] = key.desc() if ordering[0].startswith("-") else key.asc()
        return ordering

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        summaries = schedule_summary.summarize(self.result_list)
        for schedule in self.result_list:
            schedule.run_summary = summaries.get(schedule.pk, schedule_summary.RowSummary())


#: How a COMPLETED schedule's last run can end that the state column must not call done.
UNSUCCESSFUL_ENDS = frozenset([OccurrenceState.DEAD.value, OccurrenceState.MISSED.value])


#: The schedule's date-time fields (split date and time widgets in the form).
DATETIME_FIELDS = ("run_at", "start_at", "end_at")


def _aware_or_none(value: Any) -> datetime | None:
    """``value`` as an aware date-time, or None when it is not one (impossible, naive...)."""
    try:
        parsed = parse_datetime(value) if isinstance(value, str) else None
    except ValueError:
        return None
    return parsed if parsed is not None and parsed.tzinfo is not None else None


@admin.register(Schedule)
class ScheduleAdmin(TenantScopedAdmin):
    form = ScheduleForm
    change_form_template = "admin/django_app/schedule/change_form.html"
    change_list_template = "admin/django_app/schedule/change_list.html"
    list_display = (
        "name_column",
        "state_column",
        "timing_column",
        "next_run_column",
        "last_run_column",
        "outcomes_column",
        "tenant_column",
    )
    list_filter = (
        "state",
        "tenant",
        TaskFilter,
        TagFilter,
        "kind",
        "misfire_policy",
        "overlap_policy",
    )
    search_fields = ("name", "task")
    list_per_page = 50
    # Sorting by a column without an index would sort every schedule on each page view.
    sortable_by = ("name_column", "state_column", "next_run_column")
    actions = ("pause_selected", "resume_selected", "cancel_selected", "run_selected_now")
    action_form = SubmissionActionForm
    save_as = False

    # --- queryset, form, permissions -------------------------------------------------------

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).select_related("tenant", "cursor")

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return ScheduleChangeList

    def get_paginator(
        self, request: HttpRequest, queryset: Any, per_page: int, *args: Any, **kwargs: Any
    ) -> Any:
        paginator = super().get_paginator(request, queryset, per_page, *args, **kwargs)
        matches = getattr(request, MATCHES_ATTR, None)
        if matches is not None:
            paginator.__dict__["count"] = matches  # counted exactly by the search's ordering
        return paginator

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        form = super().get_form(request, obj, change=change, **kwargs)
        return type(form.__name__, (form,), {"request": request})

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, Any]:
        """Django takes ``?field=value`` as initial data; the split date-time widgets of
        ``run_at``/``start_at``/``end_at`` cannot render a string (HTTP 500, issue 25), so a
        value there is parsed and kept only if it is a date-time with an offset."""
        initial: dict[str, Any] = dict(super().get_changeform_initial_data(request))
        for name in DATETIME_FIELDS:
            if name in initial:
                parsed = _aware_or_none(initial.pop(name))
                if parsed is not None:
                    initial[name] = parsed
        return initial

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        who = ["name", "task", "args", "kwargs"]
        if shows_tenants(request):
            who.insert(1, "tenant")
        status = (
            ("state_display", "version", "next_run_display", "limits_display", "tags_display",
             "history", "loaded_version")
            if obj
            else ()
        )  # fmt: skip
        return [
            (None, {"fields": [*status]}) if obj else (None, {"fields": []}),
            (_("What runs"), {"fields": who}),
            (
                _("When"),
                {
                    "fields": [
                        "kind",
                        "cron",
                        "timezone",
                        ("dst_gap", "dst_fold"),
                        "interval_seconds",
                        "run_at",
                        ("start_at", "end_at"),
                    ],
                    "classes": ["cs-when"],
                },
            ),
            (
                _("Policies"),
                {
                    "fields": [
                        ("misfire_policy", "max_lateness_seconds", "catchup_cap"),
                        "overlap_policy",
                        "flexible_window_seconds",
                        ("concurrency_limit", "concurrency_group"),
                        ("max_attempts", "deadline_seconds"),
                        ("queue", "priority"),
                    ]
                },
            ),
        ]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = [
            "state_display", "version", "next_run_display", "limits_display", "tags_display",
            "history",
        ]  # fmt: skip
        if obj is not None:
            fields.append("tenant")
        return fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        return has_scope(request) and super().has_add_permission(request)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return has_scope(request) and super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # cancel instead: history stays for audit (occurrences PROTECT it)

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        # The form already saved through the lifecycle API; say what it did.
        result = form.lifecycle_result
        if change and result is not None:
            messages.info(
                request,
                format_html(
                    str(_("“{}” is now version {}: {}.")),
                    obj.name,
                    result.version,
                    result.describe(),
                ),
            )
        elif change:
            messages.info(request, _("Nothing changed, so the version stays the same."))

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        pass  # no related rows are edited here

    # --- list columns -----------------------------------------------------------------------

    @admin.display(description=_("Schedule"), ordering="name")
    def name_column(self, obj: Schedule) -> str:
        return format_html('{}<br><small class="cs-task">{}</small>', obj.name, obj.task)

    @admin.display(description=_("State"), ordering="state")
    def state_column(self, obj: Schedule) -> str:
        # The list has no version column: the state cell carries it.
        return format_html(
            '{}<br><small class="cs-muted" title="{}">v{}</small>',
            self.state_display(obj),
            _("version"),
            obj.version,
        )

    @admin.display(description=_("State"))
    def state_display(self, obj: Schedule) -> str:
        """The state and why (the change page shows the version in its own row)."""
        if obj.state == ScheduleState.PARKED.value:
            # Parked needs an operator: say why right in the list.
            return format_html(
                '{}<br><small class="cs-parked-reason">{}</small>',
                display.badge(obj.state),
                obj.parked_reason,
            )
        if obj.state == ScheduleState.PAUSED.value and obj.pause_reason:
            return format_html(
                '{}<br><small class="cs-pause-reason">{}</small>',
                display.badge(obj.state),
                obj.pause_reason,
            )
        failed = self._completed_badly(obj)
        if failed is not None:
            # "Completed" alone reads as success: a one-off whose only run went DEAD did not.
            return format_html(
                '{}<br><small class="cs-muted">{}</small>',
                display.badge(failed),
                _("schedule completed; its last run did not succeed"),
            )
        return display.badge(obj.state)

    @staticmethod
    def _completed_badly(obj: Schedule) -> str | None:
        """The last run's state (DEAD or MISSED) of a COMPLETED schedule, else None.

        The list reads it from the page's row summary; the change page asks once.
        """
        if obj.state != ScheduleState.COMPLETED.value:
            return None
        summary = getattr(obj, "run_summary", None)
        if summary is not None:
            last = summary.last_state
        else:
            last = (
                Occurrence.objects.filter(schedule=obj, state__in=schedule_summary.FINISHED)
                .order_by("-scheduled_for")
                .values_list("state", flat=True)
                .first()
            )
        return last if last in UNSUCCESSFUL_ENDS else None

    @admin.display(description=_("Limits"))
    def limits_display(self, obj: Schedule) -> str:
        parts = []
        if obj.max_runs is not None:
            left = max(obj.max_runs - obj.runs_count, 0)
            parts.append(f"{obj.runs_count} of {obj.max_runs} runs made, {left} remaining")
        if obj.pause_after_failures is not None:
            parts.append(
                f"pauses after {obj.pause_after_failures} consecutive failures "
                f"(now {obj.consecutive_failures})"
            )
        return "; ".join(parts) or "—"

    @admin.display(description=_("Tags"))
    def tags_display(self, obj: Schedule) -> str:
        pairs = list(obj.tags.values_list("key", "value"))
        if not pairs:
            return "—"
        return format_html_join(" ", '<code class="cs-tag">{}={}</code>', pairs)

    @admin.display(description=_("When"))
    def timing_column(self, obj: Schedule) -> str:
        if obj.kind == "CRON":
            try:
                title = timemath.describe_cron(obj.cron)
            except Exception:
                title = ""
            return format_html(
                '<code class="cs-mono">{}</code> <small>{}</small><br><small>{}</small>',
                obj.cron,
                obj.timezone,
                title,
            )
        if obj.kind == "INTERVAL":
            return display.fmt_interval(obj.interval_seconds)
        return format_html("once at {}", display.local_and_utc(obj.run_at, obj.timezone))

    @admin.display(description=_("Next run"), ordering="cursor__next_run_at")
    def next_run_column(self, obj: Any) -> str:
        # The earliest occurrence still to run; the cursor only when none is planned yet
        # (it is one period past the newest planned occurrence).
        summary = getattr(obj, "run_summary", schedule_summary.RowSummary())
        when = display.local_and_utc(summary.next_pending or obj.next_run_at, obj.timezone)
        if obj.state != ScheduleState.ACTIVE.value and obj.next_run_at is not None:
            # A paused schedule keeps its cursor for the misfire policy; it is not due.
            when = format_html('<span class="cs-held" title="{}">{}</span>', _("on hold"), when)
        return format_html('<span data-column="next-run">{}</span>', when)

    @admin.display(description=_("Last run · lag"))
    def last_run_column(self, obj: Any) -> str:
        summary = getattr(obj, "run_summary", schedule_summary.RowSummary())
        if summary.last_state is None:
            return format_html('<span data-column="last-run">{}</span>', "—")
        url = (
            reverse("admin:django_app_occurrence_changelist")
            + "?"
            + urlencode({"schedule": str(obj.pk)})
        )
        return format_html(
            '<span data-column="last-run"><a href="{}">{}</a> {}<br><small>{}</small></span>',
            url,
            display.badge(summary.last_state),
            display.run_lag(summary.last_lag, summary.last_reason),
            display.local_and_utc(summary.last_scheduled_for, "UTC"),
        )

    @admin.display(description=_("Outcomes"))
    def outcomes_column(self, obj: Any) -> str:
        summary = getattr(obj, "run_summary", schedule_summary.RowSummary())
        return format_html(
            '<span data-column="outcomes"><small>{} {}<br>{} {}</small></span>',
            _("last success"),
            display.ago(summary.last_success),
            _("last failure"),
            display.ago(summary.last_failure),
        )

    @admin.display(description=_("Tenant"), ordering="tenant__slug")
    def tenant_column(self, obj: Schedule) -> str:
        return obj.tenant.slug

    # --- change-page read-only blocks -------------------------------------------------------

    @admin.display(description=_("Next run"))
    def next_run_display(self, obj: Schedule) -> str:
        return display.local_and_utc(obj.next_run_at, obj.timezone)

    @admin.display(description=_("History"))
    def history(self, obj: Schedule) -> str:
        recent = list(Occurrence.objects.filter(schedule=obj).order_by("-scheduled_for")[:5])
        url = (
            reverse("admin:django_app_occurrence_changelist")
            + "?"
            + urlencode({"schedule": str(obj.pk)})
        )
        total = scale.count_label(Occurrence.objects.filter(schedule=obj))
        rows = format_html_join(
            "",
            '<tr><td><a href="{}">{}</a></td><td>{}</td><td>v{}</td><td>{}</td><td>{}</td></tr>',
            (
                (
                    reverse("admin:django_app_occurrence_change", args=[o.pk]),
                    # To the second: an every-10-s schedule's rows differ in seconds only.
                    display.local_and_utc(o.scheduled_for, obj.timezone, seconds=True),
                    display.badge(o.state),
                    o.schedule_version,
                    display.run_lag(o.lag_seconds, o.reason),
                    o.attempt_count,
                )
                for o in recent
            ),
        )
        if not recent:
            return format_html('<span class="cs-muted">{}</span>', _("No occurrences yet."))
        return format_html(
            '<table class="cs-history"><thead><tr><th>{}</th><th>{}</th><th>{}</th><th>{}</th>'
            '<th>{}</th></tr></thead><tbody>{}</tbody></table><a href="{}" class="cs-history-link">'
            "{}</a>",
            _("Scheduled for"),
            _("State"),
            _("Version"),
            _("Lag"),
            _("Attempts"),
            rows,
            url,
            _("All %(n)s occurrences →") % {"n": total},
        )

    # --- actions ----------------------------------------------------------------------------

    @admin.action(description=_("Pause selected schedules"), permissions=["change"])
    def pause_selected(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        actions.apply_lifecycle(request, queryset, "pause")

    @admin.action(description=_("Resume selected schedules"), permissions=["change"])
    def resume_selected(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        actions.apply_lifecycle(request, queryset, "resume")

    @admin.action(description=_("Cancel selected schedules"), permissions=["change"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        actions.apply_lifecycle(request, queryset, "cancel")

    @admin.action(description=_("Run selected schedules now"), permissions=["change"])
    def run_selected_now(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        actions.run_now(request, queryset, submission=request.POST.get("idempotency_key"))

    # --- extra URLs -------------------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [
            path(
                "preview/",
                wrap(lambda request: views.schedule_preview(request, self)),
                name="django_app_schedule_preview",
            ),
            path(
                "overview/",
                wrap(lambda request: views.overview(request, self)),
                name="django_app_overview",
            ),
            path(
                "<path:object_id>/act/<str:verb>/",
                wrap(require_POST(self.act_view)),
                name="django_app_schedule_act",
            ),
            *super().get_urls(),
        ]

    def act_view(self, request: HttpRequest, object_id: str, verb: str) -> HttpResponse:
        """POST one lifecycle verb on one schedule (the buttons on the change page)."""
        schedule = self.get_object(request, object_id)  # 404 outside the user's tenant
        if verb not in BUTTON_LABELS:
            raise PermissionDenied(f"Unknown action {verb!r}.")
        if not self.has_change_permission(request, schedule):
            raise PermissionDenied
        if verb == "run_now":
            actions.run_now(request, [schedule], submission=request.POST.get("idempotency_key"))
        elif verb == "pause":
            note = str(request.POST.get("note", ""))
            actions.apply_lifecycle(request, [schedule], verb, note=note)
        else:
            actions.apply_lifecycle(request, [schedule], verb)
        return HttpResponseRedirect(reverse("admin:django_app_schedule_change", args=[schedule.pk]))

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Any = None,
    ) -> HttpResponse:
        context["preview_url"] = reverse("admin:django_app_schedule_preview")
        context["submission_key"] = new_submission_key()
        context["tenant_name"] = None if sees_all_tenants(request) else tenant_of(request)
        if obj is not None and self.has_change_permission(request, obj):
            context["lifecycle_buttons"] = [
                (
                    verb,
                    BUTTON_LABELS[verb],
                    reverse("admin:django_app_schedule_act", args=[obj.pk, verb]),
                )
                for verb in BUTTONS.get(obj.state, ())
            ]
        return super().render_change_form(request, context, add, change, form_url, obj)

    def changelist_extra_context(self, request: HttpRequest) -> dict[str, Any]:
        return {
            "overview_url": reverse("admin:django_app_overview"),
            "dead_letters_url": reverse("admin:django_app_occurrence_changelist")
            + "?state__exact=DEAD",
        }
