"""Pause / resume / cancel / run now / replay: call the API, report what really happened.

Each verb is applied to every selected object on its own, so one schedule in the wrong
state does not hide what happened to the others; the messages say both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from django.contrib import messages
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from celery_scheduler import api, errors
from celery_scheduler.core import ids
from django_app.admin import bridge
from django_app.compat import log_change
from django_app.models import ManualRunKey, Occurrence, Schedule

#: verb -> (API function name, past tense for messages)
SCHEDULE_VERBS: dict[str, tuple[str, str]] = {
    "pause": ("pause_schedule", "paused"),
    "resume": ("resume_schedule", "resumed"),
    "cancel": ("cancel_schedule", "canceled"),
}


def audit(request: HttpRequest, obj: Any, message: str) -> None:
    """Write what a user did to Django's admin log (History), as the change form does."""
    user_id = getattr(request.user, "pk", None)
    if user_id is None:
        return
    log_change(user_id, obj, message)


def _api() -> Any:
    return api


def apply_lifecycle(
    request: HttpRequest, schedules: Iterable[Schedule], verb: str, *, note: str = ""
) -> int:
    """Call the API ``verb`` on each schedule; one summary message plus one per failure.

    ``note`` goes to ``pause_schedule`` (the pause reason) and is ignored by other verbs.
    """
    func_name, past = SCHEDULE_VERBS[verb]
    func: Callable[..., Any] = getattr(_api(), func_name)
    extra = {"note": note} if verb == "pause" and note else {}
    done: list[tuple[Schedule, Any]] = []
    for schedule in schedules:
        try:
            result = func(schedule.pk, actor=bridge.actor(request), **extra)
            done.append((schedule, result))
            audit(request, schedule, f"{past.capitalize()}: {_describe(result)}")
        except errors.SchedulerError as exc:
            messages.warning(
                request,
                format_html(_("Could not {} “{}”: {}"), verb, schedule.name, str(exc)),
            )
    if done:
        details = "; ".join(_describe(r) for _, r in done)
        summary = ngettext(
            "%(count)d schedule %(past)s", "%(count)d schedules %(past)s", len(done)
        ) % {"count": len(done), "past": past}
        messages.success(request, f"{summary}: {details}")
    return len(done)


def _describe(result: Any) -> str:
    describe = getattr(result, "describe", None)
    return str(describe()) if callable(describe) else _("done")


def run_now(
    request: HttpRequest, schedules: Iterable[Schedule], *, submission: str | None = None
) -> int:
    """Create one manual occurrence per schedule (the relay publishes it; never apply_async).

    ``submission`` is the key of the page the request came from: the same page submitted
    twice finds the occurrences the first submission created and runs nothing again.
    """
    created: list[tuple[Schedule, Occurrence]] = []
    repeated: list[tuple[Schedule, Occurrence]] = []
    key = f"admin:{submission}" if submission and submission.strip() else None
    for schedule in schedules:
        known = key is not None and _already_run(schedule, key)
        try:
            occurrence = _api().run_now(
                schedule.pk, actor=bridge.actor(request), idempotency_key=key
            )
        except errors.SchedulerError as exc:
            messages.warning(
                request, format_html(_("Could not run “{}” now: {}"), schedule.name, str(exc))
            )
            continue
        if known:
            repeated.append((schedule, occurrence))
            continue
        created.append((schedule, occurrence))
        audit(request, schedule, f"Run now: manual occurrence {occurrence.pk}")
    if repeated:
        messages.info(
            request,
            format_html(
                "{}: {}",
                _("Already queued by this submission, not run again"),
                _links(repeated),
            ),
        )
    if created:
        summary = ngettext(
            "Queued %(count)d manual run", "Queued %(count)d manual runs", len(created)
        ) % {"count": len(created)}
        messages.success(request, format_html("{}: {}", summary, _links(created)))
    return len(created)


def _already_run(schedule: Schedule, key: str) -> bool:
    # The key's record, not the occurrence: retention may have pruned that.
    return ManualRunKey.objects.filter(pk=ids.manual_occurrence_id(schedule.pk, key)).exists()


def _links(runs: list[tuple[Schedule, Occurrence]]) -> str:
    return format_html_join(
        ", ",
        '“{}” → <a href="{}">occurrence {}</a>',
        (
            (s.name, reverse("admin:django_app_occurrence_change", args=[o.pk]), str(o.pk)[:8])
            for s, o in runs
        ),
    )


def replay(request: HttpRequest, occurrences: Iterable[Occurrence]) -> int:
    """Replay DEAD occurrences under their own id (the API refuses any other state)."""
    replayed: list[Occurrence] = []
    for occurrence in occurrences:
        try:
            replayed.append(_api().replay_occurrence(occurrence.pk, actor=bridge.actor(request)))
            audit(request, occurrence.schedule, f"Replayed DEAD occurrence {occurrence.pk}")
        except errors.SchedulerError as exc:
            messages.warning(
                request,
                format_html(_("Could not replay {}: {}"), str(occurrence.pk)[:8], str(exc)),
            )
    if replayed:
        ids = ", ".join(str(o.pk)[:8] for o in replayed)
        messages.success(
            request,
            ngettext(
                "Replayed %(count)d occurrence under its own id (%(ids)s); it is %(state)s now.",
                "Replayed %(count)d occurrences under their own ids (%(ids)s); "
                "they are %(state)s now.",
                len(replayed),
            )
            % {
                "count": len(replayed),
                "ids": ids,
                "state": ", ".join(sorted({o.state for o in replayed})),
            },
        )
    return len(replayed)
