"""One form for a schedule, saved through the lifecycle API.

Unlike django-celery-beat there are no separate crontab/interval objects to create first:
the kind picks which trigger field applies, and the preview panel shows what it means.
"""

from __future__ import annotations

import functools
import json
from typing import Any, ClassVar
from zoneinfo import available_timezones

from django import forms
from django.forms.fields import InvalidJSONInput
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from celery_scheduler import api, errors
from celery_scheduler.core.enums import DstFold, DstGap, ScheduleKind
from django_app.admin import bridge
from django_app.admin.tenancy import sees_all_tenants, tenant_of
from django_app.models import Schedule
from django_app.schedules.validation import registered_task_names

HELP_TEXTS = {
    "name": _("A label for people; it does not need to be unique."),
    "kind": _("Cron follows the wall clock of the time zone; interval is elapsed time."),
    "cron": _(
        "Five fields: minute hour day-of-month month day-of-week, e.g. "
        "<code>30 2 * * *</code> or <code>0 9 * * mon-fri</code>."
    ),
    "timezone": _("IANA zone the cron is read in, e.g. Europe/Berlin. Start typing to search."),
    "dst_gap": _(
        "A wall time the spring-forward change removes (02:30 on the night clocks jump from "
        "02:00 to 03:00): Skip it, or Shift it to the first instant after the gap."
    ),
    "dst_fold": _(
        "A wall time the fall-back change repeats (01:30 twice): run it at the First "
        "instant, the Second, or Both. The preview marks the runs this changes."
    ),
    "interval_seconds": _("Seconds between runs, counted from the start time (or creation)."),
    "run_at": _("The single time a one-off schedule fires."),
    "start_at": _("No run before this time (optional)."),
    "end_at": _("No run after this time (optional)."),
    "task": _("A task registered in the Celery app."),
    "args": _('Positional arguments as a JSON list, e.g. <code>["acme", 3]</code>.'),
    "kwargs": _('Keyword arguments as a JSON object, e.g. <code>{"period": "2026-03"}</code>.'),
    "queue": _("Celery queue; empty uses the task's normal routing."),
    "priority": _("0-255; higher goes first when several runs are due at once."),
    "misfire_policy": _(
        "After downtime: Skip marks runs later than max lateness as missed; Fire once runs "
        "only the latest missed one; Catch up runs at most the catch-up cap of them."
    ),
    "max_lateness_seconds": _("A run later than this (seconds) counts as missed."),
    "catchup_cap": _("Most missed runs that Catch up will still fire."),
    "overlap_policy": _(
        "When the previous run is still going: Allow runs both; Skip if running marks the "
        "new one skipped; Queue one holds at most one waiting run."
    ),
    "flexible_window_seconds": _(
        "Spread each run over this many seconds (same offset on every retry); 0 = exact time."
    ),
    "concurrency_limit": _("Most runs of this schedule (or group) at once, cluster-wide."),
    "concurrency_group": _(
        "Schedules of this tenant sharing a group name share the concurrency limit."
    ),
    "max_attempts": _("Tries per run before it is dead-lettered (empty = default)."),
    "deadline_seconds": _("Give up retrying this long after the scheduled time."),
}


@functools.cache
def zone_names() -> tuple[str, ...]:
    return tuple(sorted(z for z in available_timezones() if "/" in z or z == "UTC"))


class TimezoneWidget(forms.TextInput):
    """A text input backed by a datalist of IANA zones: searchable, no framework needed."""

    template_name = "django_app/widgets/timezone.html"

    def get_context(self, name: str, value: Any, attrs: dict[str, Any] | None) -> dict[str, Any]:
        context = super().get_context(name, value, attrs)
        context["zones"] = zone_names()
        context["widget"]["attrs"]["list"] = f"{context['widget']['attrs']['id']}-zones"
        return context


class ArgumentsJSONField(forms.JSONField):
    """A JSON field whose parser cannot crash the page: ``json.loads`` recurses, and a
    deeply nested list ("[[[[...") raised RecursionError (HTTP 500) instead of a form error."""

    def to_python(self, value: Any) -> Any:
        try:
            parsed = super().to_python(value)
        except RecursionError:
            raise forms.ValidationError(
                _("The JSON is nested too deeply."), code="invalid", params={"value": value}
            ) from None
        try:
            # An escaped lone surrogate ("\ud800") parses to a str no database can store:
            # refused here, as the HTTP API does, instead of failing the save (HTTP 500).
            json.dumps(parsed, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise forms.ValidationError(
                _(
                    "The JSON holds a lone surrogate (an escaped \\ud800-\\udfff alone): "
                    "not valid text."
                ),
                code="invalid",
                params={"value": value},
            ) from None
        except (RecursionError, ValueError):
            pass  # the API's checks name these (depth, NaN) with their own messages
        return parsed

    def bound_data(self, data: Any, initial: Any) -> Any:
        try:
            bound = super().bound_data(data, initial)
            # Shown back re-encoded with ensure_ascii=False: a lone surrogate would fail
            # the page's UTF-8 encoding (HTTP 500), so such input is shown as typed.
            json.dumps(bound, ensure_ascii=False).encode("utf-8")
        except (RecursionError, UnicodeEncodeError):
            return InvalidJSONInput(data)  # shown back as typed, like any invalid JSON
        except ValueError:
            pass
        return bound


class ScheduleForm(forms.ModelForm):
    """Saving the form calls ``create_schedule`` / ``update_schedule``; their validation
    errors land on the field they name."""

    #: Set by ScheduleAdmin.get_form: tenancy and the task list depend on who asks.
    request: ClassVar[HttpRequest | None] = None

    kind = forms.ChoiceField(
        choices=[
            (ScheduleKind.CRON.value, _("Cron expression")),
            (ScheduleKind.INTERVAL.value, _("Every N seconds")),
            (ScheduleKind.ONE_OFF.value, _("Once")),
        ],
        initial=ScheduleKind.CRON.value,
        widget=forms.RadioSelect(attrs={"class": "cs-kind"}),
        help_text=HELP_TEXTS["kind"],
    )
    task = forms.ChoiceField(help_text=HELP_TEXTS["task"])
    args = ArgumentsJSONField(required=False, initial=list, help_text=HELP_TEXTS["args"])
    kwargs = ArgumentsJSONField(required=False, initial=dict, help_text=HELP_TEXTS["kwargs"])
    #: The version the change page was loaded at: a save made against an older version
    #: than the current one is refused instead of overwriting someone else's change.
    loaded_version = forms.IntegerField(required=False, widget=forms.HiddenInput, label="")

    class Meta:
        model = Schedule
        fields = ("name", "tenant", "kind", *bridge.API_FIELDS)
        help_texts = HELP_TEXTS
        labels = {
            "cron": _("Cron expression"),
            "timezone": _("Time zone"),
            "dst_gap": _("Missing wall time (DST gap)"),
            "dst_fold": _("Repeated wall time (DST fold)"),
            "interval_seconds": _("Interval (seconds)"),
            "run_at": _("Run at"),
            "max_lateness_seconds": _("Max lateness (s)"),
            "flexible_window_seconds": _("Flexible window (s)"),
            "deadline_seconds": _("Deadline (s)"),
        }
        widgets = {
            "timezone": TimezoneWidget(attrs={"autocomplete": "off", "spellcheck": "false"}),
            "cron": forms.TextInput(
                attrs={"class": "cs-mono", "autocomplete": "off", "spellcheck": "false"}
            ),
            "args": forms.Textarea(attrs={"rows": 2, "class": "cs-mono"}),
            "kwargs": forms.Textarea(attrs={"rows": 2, "class": "cs-mono"}),
        }

    class Media:
        css = {"all": ("django_app/admin.css",)}
        js = ("django_app/schedule_form.js",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lifecycle_result: Any = None
        for name in ("args", "kwargs"):
            self.fields[name].widget.attrs.update({"rows": 2, "class": "cs-mono"})
        self.fields["task"].choices = self._task_choices()  # type: ignore[attr-defined]
        if not self.instance._state.adding:
            self.fields["loaded_version"].initial = self.instance.version
        for name, default in (("dst_gap", DstGap.SKIP), ("dst_fold", DstFold.FIRST)):
            if name not in self.fields:  # read-only for a view-only user
                continue
            # Absent from a POST (a script written before the field existed) means no
            # change: the stored policy on an edit, the default on a create.
            stored = None if self.instance._state.adding else getattr(self.instance, name)
            self.fields[name].required = False
            self.fields[name].empty_value = stored or default.value  # type: ignore[attr-defined]
        if "tenant" in self.fields:
            self.fields["tenant"].required = False
            self.fields["tenant"].empty_label = _("(default tenant)")  # type: ignore[attr-defined]

    def _task_choices(self) -> list[tuple[str, str]]:
        names = list(registered_task_names())
        current = self.initial.get("task")
        if current and current not in names:
            # Keep an existing schedule editable even if its task left the registry; the
            # API will say so on save.
            names.insert(0, current)
        return [("", "---------"), *((n, n) for n in names)]

    def clean_args(self) -> Any:
        value = self.cleaned_data.get("args")
        if value in (None, ""):
            return []
        if not isinstance(value, list):
            raise forms.ValidationError(_('Enter a JSON list, e.g. ["a", 1].'))
        return value

    def clean_kwargs(self) -> Any:
        value = self.cleaned_data.get("kwargs")
        if value in (None, ""):
            return {}
        if not isinstance(value, dict):
            raise forms.ValidationError(_('Enter a JSON object, e.g. {"key": "value"}.'))
        return value

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        kind = cleaned.get("kind")
        required = {
            ScheduleKind.CRON.value: "cron",
            ScheduleKind.INTERVAL.value: "interval_seconds",
            ScheduleKind.ONE_OFF.value: "run_at",
        }.get(str(kind))
        # "Missing" is None or "": an interval of 0 is a bad interval (the API says so on
        # the field), not a missing one.
        if required and cleaned.get(required) in (None, "") and required not in self.errors:
            self.add_error(required, _("Required for this kind of schedule."))
        return cleaned

    def _post_clean(self) -> None:
        # The admin view runs validation and saving inside one transaction; calling the API
        # here is what lets its errors (task registry, quotas, policy limits) appear on the
        # fields instead of as a 500 after the form already said "valid".
        if self.errors:
            return

        try:
            if self.instance._state.adding:
                self.instance = api.create_schedule(
                    tenant=self._tenant(), actor=bridge.actor(self.request),
                    **bridge.api_values(self.cleaned_data),
                )  # fmt: skip
            else:
                changed = set(self.changed_data) & {*bridge.API_FIELDS, "kind"}
                if changed:
                    values = bridge.api_values(self.cleaned_data, changed)
                    self.lifecycle_result = api.update_schedule(
                        self.instance.pk,
                        expected_version=self.cleaned_data.get("loaded_version"),
                        actor=bridge.actor(self.request),
                        **values,
                    )
                    self.instance = self.lifecycle_result.schedule
        except errors.ValidationError as exc:
            field = bridge.form_field_for(exc.field, set(self.fields))
            self.add_error(field, str(exc))
        except errors.SchedulerError as exc:
            self.add_error(None, str(exc))

    def _tenant(self) -> Any:
        request = self.request
        if request is None or sees_all_tenants(request):
            return self.cleaned_data.get("tenant")
        return tenant_of(request)
