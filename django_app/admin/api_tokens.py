"""API tokens in the admin: created (the secret is shown once) and revoked.

A token is a tenant's key to the HTTP API. Superusers manage every tenant's tokens; a
tenant's own admin users (members of the tenant with Django's ``add``/``change``/``view``
permissions on API tokens) manage that tenant's tokens only: the list, the objects and the
revoke action stop at their tenant (``TenantScopedAdmin``), and a token they create is
always their tenant's, whatever the form says. Only the secret's SHA-256 is stored: the
admin can never show a token again, only revoke it.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from django_app.admin.tenancy import TenantScopedAdmin, has_scope, sees_all_tenants, tenant_of
from django_app.http import tokens
from django_app.models import ApiToken


@admin.register(ApiToken)
class ApiTokenAdmin(TenantScopedAdmin):
    list_display = ("prefix", "tenant", "name", "created_at", "last_used_at", "revoked_at")
    list_filter = ("tenant",)
    search_fields = ("prefix", "name", "tenant__slug")
    fields = ("tenant", "name", "prefix", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("prefix", "created_at", "last_used_at", "revoked_at")
    actions = ("revoke",)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if sees_all_tenants(request):
            return self.fields
        return tuple(f for f in self.fields if f != "tenant")  # always their own

    def has_add_permission(self, request: HttpRequest) -> bool:
        return has_scope(request) and super().has_add_permission(request)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Revoke, never delete: the row is the audit of who could call the API.
        return sees_all_tenants(request)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        # The tenant of an existing token never changes: revoke it and create another.
        return (*self.readonly_fields, "tenant") if obj is not None else self.readonly_fields

    def save_model(self, request: HttpRequest, obj: ApiToken, form: Any, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        if not sees_all_tenants(request):
            tenant = tenant_of(request)
            if tenant is None:  # has_add_permission needs a scope: a guard, not a path
                raise PermissionDenied("You belong to no tenant.")
            obj.tenant = tenant
        secret = tokens.fill(obj)
        super().save_model(request, obj, form, change)
        self.message_user(
            request,
            f"API token for {obj.tenant.slug}: {secret} — copy it now, it is not shown again "
            "(only its hash is stored).",
            messages.WARNING,
        )

    @admin.action(description="Revoke selected tokens", permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        n = queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        self.message_user(request, f"{n} token{'s' if n != 1 else ''} revoked.")
