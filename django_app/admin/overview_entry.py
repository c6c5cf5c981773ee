"""The "Overview" row on the admin index: a proxy model whose list is the overview page."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponseRedirect
from django.urls import URLPattern, path, reverse

from django_app.admin.tenancy import has_scope
from django_app.models import SchedulerOverview


@admin.register(SchedulerOverview)
class SchedulerOverviewAdmin(admin.ModelAdmin):
    """Only the list URL: the proxy's rows are schedules of every tenant, so the object
    views a ModelAdmin adds (change, history, delete) would show any of them by id."""

    def get_urls(self) -> list[URLPattern]:
        name = f"{self.opts.app_label}_{self.opts.model_name}_changelist"
        return [path("", self.admin_site.admin_view(self.changelist_view), name=name)]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).none()

    def has_module_permission(self, request: HttpRequest) -> bool:
        return has_scope(request) and request.user.has_perm("django_app.view_schedule")

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.has_module_permission(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponseRedirect:
        return HttpResponseRedirect(reverse("admin:django_app_overview"))


__all__ = ["SchedulerOverviewAdmin"]
