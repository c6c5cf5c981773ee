"""API tokens in the admin: superusers create them (the secret is shown once) and revoke them.

A token is a tenant's key to the HTTP API, so only superusers (who see every tenant)
manage them, like tenants and memberships. Only the secret's SHA-256 is stored: the
admin can never show a token again, only revoke it.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from django_app.admin.tenancy import SuperuserOnlyAdmin
from django_app.http import tokens
from django_app.models import ApiToken


@admin.register(ApiToken)
class ApiTokenAdmin(SuperuserOnlyAdmin):
    list_display = ("prefix", "tenant", "name", "created_at", "last_used_at", "revoked_at")
    list_filter = ("tenant",)
    search_fields = ("prefix", "name", "tenant__slug")
    fields = ("tenant", "name", "prefix", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("prefix", "created_at", "last_used_at", "revoked_at")
    actions = ("revoke",)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        # The tenant of an existing token never changes: revoke it and create another.
        return (*self.readonly_fields, "tenant") if obj is not None else self.readonly_fields

    def save_model(self, request: HttpRequest, obj: ApiToken, form: Any, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        secret = tokens.fill(obj)
        super().save_model(request, obj, form, change)
        self.message_user(
            request,
            f"API token for {obj.tenant.slug}: {secret} — copy it now, it is not shown again "
            "(only its hash is stored).",
            messages.WARNING,
        )

    @admin.action(description="Revoke selected tokens")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        n = queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        self.message_user(request, f"{n} token{'s' if n != 1 else ''} revoked.")
