"""Who is asking, and which tenant's data they may see.

Two ways in: a per-tenant API token (``Authorization: Bearer cs_<prefix>.<secret>``), which
sees exactly its tenant, or a Django session (with CSRF on unsafe methods, as DRF's
``SessionAuthentication`` enforces) of an active staff user: a superuser sees every tenant,
a staff user tied to a tenant by ``TenantMembership`` sees that tenant (the admin's rule),
anyone else is refused with 403.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions, permissions
from rest_framework.request import Request

from django_app.http import tokens
from django_app.models import ApiToken, Tenant, TenantMembership


class TokenUser:
    """``request.user`` for a token: authenticated, never staff, bound to one tenant."""

    is_authenticated = True
    is_anonymous = False
    is_active = True
    is_staff = False
    is_superuser = False

    def __init__(self, token: ApiToken) -> None:
        self.token = token
        self.pk = None
        self.username = f"token:{token.prefix}"

    def __str__(self) -> str:
        return self.username


class TenantTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer <token>``; a bad or revoked token is a 401."""

    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[TokenUser, ApiToken] | None:
        header = request.META.get("HTTP_AUTHORIZATION", "")
        scheme, _, raw = header.partition(" ")
        if scheme.lower() != self.keyword.lower():
            return None
        token = tokens.check(raw.strip())
        if token is None:
            raise exceptions.AuthenticationFailed("Invalid or revoked API token.")
        return TokenUser(token), token

    def authenticate_header(self, request: Request) -> str:
        return f'{self.keyword} realm="celery-scheduler"'


class TenantTokenScheme(OpenApiAuthenticationExtension):
    """The token as an OpenAPI security scheme (drf-spectacular finds it by target class)."""

    target_class = "django_app.http.auth.TenantTokenAuthentication"
    name = "tenantToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "bearerFormat": "cs_<prefix>.<secret>"}


@dataclass(frozen=True)
class Scope:
    """The tenant a request is confined to (None: every tenant, for superusers)."""

    tenant: Tenant | None

    @property
    def slug(self) -> str | None:
        return self.tenant.slug if self.tenant is not None else None

    @property
    def all_tenants(self) -> bool:
        return self.tenant is None

    def tenant_filter(self, requested: str | None) -> str | None:
        """The tenant slug to pass to the API for a request naming ``requested`` (or not).

        A scoped caller naming another tenant is refused with 403: it cannot even learn
        whether that tenant exists.
        """
        if self.tenant is None:
            return requested or None
        if requested and requested != self.tenant.slug:
            raise exceptions.PermissionDenied("This credential sees only its own tenant.")
        return self.tenant.slug


_SCOPE_ATTR = "_scheduler_scope"


def scope_of(request: Request) -> Scope:
    """The request's scope, computed once by :class:`HasTenantScope`."""
    found = getattr(request, _SCOPE_ATTR, None)
    if not isinstance(found, Scope):  # a view without HasTenantScope: a programming error
        raise exceptions.PermissionDenied("No tenant scope for this request.")
    return found


def _compute_scope(request: Request) -> Scope | None:
    user: Any = request.user
    if isinstance(user, TokenUser):
        return Scope(tenant=user.token.tenant)
    if not (user and user.is_authenticated and user.is_active and user.is_staff):
        return None
    if user.is_superuser:
        return Scope(tenant=None)
    membership = TenantMembership.objects.select_related("tenant").filter(user_id=user.pk).first()
    return Scope(tenant=membership.tenant) if membership else None


class HasTenantScope(permissions.BasePermission):
    """A token, a superuser, or a staff member of a tenant; 401 anonymous, 403 others."""

    message = "Staff users need a tenant membership (or superuser) to use the API."

    def has_permission(self, request: Request, view: Any) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False  # DRF answers 401 with the WWW-Authenticate header
        scope = _compute_scope(request)
        if scope is None:
            return False
        setattr(request, _SCOPE_ATTR, scope)
        return True


class StaffOnly(permissions.BasePermission):
    """Tenant pages: staff sessions only (a member reads its own tenant, a superuser all
    and is the only one who creates tenants or changes quotas); tokens are refused."""

    message = "Tenants are managed by staff: superusers change them, members read their own."

    def has_permission(self, request: Request, view: Any) -> bool:
        if isinstance(request.user, TokenUser):
            return False
        if request.method in permissions.SAFE_METHODS:
            return True
        return scope_of(request).all_tenants
