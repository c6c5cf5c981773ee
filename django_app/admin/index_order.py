"""The order the admin index and sidebar list the scheduler's models in: the daily path first.

Django sorts an app's models alphabetically, which put Schedules 5th of 7 behind API tokens,
Attempts and Audit entries. The order here follows what an operator opens most: schedules,
their occurrences (history and dead letters), the overview, then tenancy and tokens. Models
not named keep their alphabetical place after these; other apps are left as Django sorts them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib.admin import AdminSite
from django.http import HttpRequest

#: Model names (``_meta.model_name``) of this app, in the order the index lists them.
MODEL_ORDER = (
    "schedule",
    "occurrence",
    "scheduleroverview",
    "attempt",
    "tenant",
    "tenantmembership",
    "apitoken",
    "auditentry",
)
APP_LABEL = "django_app"


def ordered(app_list: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``app_list`` (as ``AdminSite.get_app_list`` returns it) with this app's models in order."""
    rank = {name: i for i, name in enumerate(MODEL_ORDER)}
    for app in app_list:
        if app.get("app_label") == APP_LABEL:
            # sort() is stable: unnamed models keep Django's alphabetical order, last.
            app["models"].sort(key=lambda m: rank.get(m["object_name"].lower(), len(rank)))
    return app_list


def install(site: AdminSite) -> None:
    """Make ``site`` list this app's models in :data:`MODEL_ORDER` (idempotent).

    Called from ``AppConfig.ready()`` for the site the ModelAdmins are registered on. The
    bound method is wrapped on that one instance: the user's own AdminSite subclass, if any,
    keeps its behaviour and gains only this order.
    """
    current: Callable[..., list[dict[str, Any]]] = site.get_app_list
    if getattr(current, "_cs_ordered", False):
        return

    def get_app_list(request: HttpRequest, app_label: str | None = None) -> list[dict[str, Any]]:
        return ordered(current(request, app_label))

    get_app_list._cs_ordered = True  # type: ignore[attr-defined]
    site.get_app_list = get_app_list  # type: ignore[method-assign]
