"""The API's audit trail in the admin: read-only, scoped to the user's tenant."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from django_app.admin import display
from django_app.admin.occurrences import ReadOnlyMixin
from django_app.admin.tenancy import TenantScopedAdmin, has_scope
from django_app.models import AuditEntry


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyMixin, TenantScopedAdmin):
    list_display = ("at_column", "actor", "action", "schedule", "reason", "tenant_column")
    list_filter = ("action", "tenant")
    search_fields = ("actor", "reason", "schedule__name", "=schedule__id")
    list_select_related = ("schedule", "tenant")
    ordering = ("-at", "-pk")
    fields = ("at_column", "actor", "action", "schedule", "occurrence_id", "reason", "detail")
    readonly_fields = fields

    # Whoever may see a tenant's schedules may see what was done to them.
    def has_module_permission(self, request: HttpRequest) -> bool:
        return has_scope(request) and request.user.has_perm("django_app.view_schedule")

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.has_module_permission(request)

    @admin.display(description=_("When"), ordering="at")
    def at_column(self, obj: AuditEntry) -> str:
        return display.instant(obj.at)

    @admin.display(description=_("Tenant"), ordering="tenant__slug")
    def tenant_column(self, obj: AuditEntry) -> str:
        return obj.tenant.slug
