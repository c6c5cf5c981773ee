"""Tenant scoping for every admin page: one rule, applied in one place.

A superuser sees every tenant. A staff user tied to a tenant by ``TenantMembership`` sees
only that tenant's rows; a staff user without a membership sees nothing. Objects outside
the user's scope answer 404 (never "exists but forbidden"), and a POSTed action naming
an id outside the scope is refused as a whole with 403 before anything changes.
"""

from __future__ import annotations

from typing import Any, TypeVar

from django.contrib import admin
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import PermissionDenied
from django.db.models import Model, QuerySet
from django.http import Http404, HttpRequest

from django_app import conf
from django_app.admin import scale
from django_app.admin.querystring import SafeChangelistAdmin
from django_app.models import Tenant, TenantMembership

_CACHE_ATTR = "_scheduler_tenant"
_MULTI_ATTR = "_scheduler_multi_tenant"

#: A queryset keeps its own class (and its methods) through :func:`scope`.
_Rows = TypeVar("_Rows", bound=QuerySet[Any])


def tenant_of(request: HttpRequest) -> Tenant | None:
    """The tenant the request's user is tied to (cached per request), else None."""
    if not hasattr(request, _CACHE_ATTR):
        user = request.user
        tenant = None
        if user.is_authenticated:
            membership = (
                TenantMembership.objects.select_related("tenant").filter(user_id=user.pk).first()
            )
            tenant = membership.tenant if membership else None
        setattr(request, _CACHE_ATTR, tenant)
    tenant_or_none: Tenant | None = getattr(request, _CACHE_ATTR)
    return tenant_or_none


def sees_all_tenants(request: HttpRequest) -> bool:
    return bool(request.user.is_active and request.user.is_superuser)


def shows_tenants(request: HttpRequest) -> bool:
    """Whether tenant pickers and columns mean anything to this user.

    Only a superuser chooses between tenants, and only when there is more than the default
    one: a single-tenant install never shows a tenant selector.
    """
    if not sees_all_tenants(request):
        return False
    if not hasattr(request, _MULTI_ATTR):
        others = Tenant.objects.exclude(slug=conf.get().default_tenant).exists()
        setattr(request, _MULTI_ATTR, others)
    return bool(getattr(request, _MULTI_ATTR))


def scope(request: HttpRequest, queryset: _Rows, lookup: str = "tenant") -> _Rows:
    """``queryset`` restricted to what the request's user may see."""
    if sees_all_tenants(request):
        return queryset
    tenant = tenant_of(request)
    if tenant is None:
        return queryset.none()
    return queryset.filter(**{lookup: tenant})


def has_scope(request: HttpRequest) -> bool:
    """Whether the user can see any tenant at all (superuser or a member)."""
    return sees_all_tenants(request) or tenant_of(request) is not None


class TenantScopedAdmin(SafeChangelistAdmin):
    """ModelAdmin whose queryset, objects, actions and filters stop at the user's tenant."""

    #: ORM path from the model to its Tenant.
    tenant_lookup = "tenant"
    # Lists of millions of rows: counts stop at a cap (then estimate), no second count of
    # the unfiltered table, no facet counts (see django_app.admin.scale).
    paginator = scale.EstimatedCountPaginator
    show_full_result_count = False
    if hasattr(admin, "ShowFacets"):  # Django 5.0+
        show_facets = admin.ShowFacets.NEVER

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> Any:
        return scale.ScaleChangeList

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return scope(request, super().get_queryset(request), self.tenant_lookup)

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> Any:
        # Django would redirect to the index with "doesn't exist"; a plain 404 is the same
        # answer for a missing and a foreign object, and is what a forged URL deserves.
        obj = super().get_object(request, object_id, from_field)
        if obj is None:
            raise Http404(f"No {self.opts.verbose_name} with id {object_id!r} in your scope.")
        return obj

    def get_list_filter(self, request: HttpRequest) -> Any:
        filters = list(super().get_list_filter(request))
        if not shows_tenants(request):
            filters = [f for f in filters if f != self.tenant_lookup]
        return filters

    def get_list_display(self, request: HttpRequest) -> Any:
        columns = list(super().get_list_display(request))
        if not shows_tenants(request):
            columns = [c for c in columns if c != "tenant_column"]
        return columns

    def has_module_permission(self, request: HttpRequest) -> bool:
        return has_scope(request) and super().has_module_permission(request)

    def has_view_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return has_scope(request) and super().has_view_permission(request, obj)

    def response_action(self, request: HttpRequest, queryset: QuerySet[Any], *args: Any) -> Any:
        # A selected id that the user cannot see means a forged or stale form: refuse the
        # whole action instead of silently acting on the visible subset.
        selected = request.POST.getlist(ACTION_CHECKBOX_NAME)
        select_across = request.POST.get("select_across") == "1"
        if selected and not select_across:
            visible = {
                str(pk)
                for pk in self.get_queryset(request)
                .filter(pk__in=_valid_pks(self.model, selected))
                .values_list("pk", flat=True)
            }
            if visible != set(selected):
                raise PermissionDenied("Some selected objects are not in your tenant.")
        return super().response_action(request, queryset, *args)


def _valid_pks(model: type[Model], values: list[str]) -> list[Any]:
    field = model._meta.pk
    assert field is not None
    pks = []
    for value in values:
        try:
            pks.append(field.to_python(value))
        except Exception as exc:  # a malformed id in a forged form
            raise PermissionDenied(f"Malformed id {value!r}.") from exc
    return pks


class SuperuserOnlyAdmin(SafeChangelistAdmin):
    """Tenants and memberships decide who sees what, so only superusers manage them."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        return sees_all_tenants(request)

    def has_view_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return sees_all_tenants(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return sees_all_tenants(request)

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return sees_all_tenants(request)

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return sees_all_tenants(request)


class MembershipInline(admin.TabularInline):
    model = TenantMembership
    extra = 0
    autocomplete_fields = ()
    raw_id_fields = ("user",)


@admin.register(Tenant)
class TenantAdmin(SuperuserOnlyAdmin):
    list_display = (
        "slug",
        "name",
        "max_schedules",
        "max_trigger_rate",
        "max_running",
        "relay_weight",
    )
    search_fields = ("slug", "name")
    inlines = (MembershipInline,)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        # A slug names the tenant in what was written under it (the reasons of the runs
        # waiting for its max_running, the metrics' label, API clients), and the HTTP API
        # refuses to change it too: set once, at create.
        fields = tuple(super().get_readonly_fields(request, obj))
        return (*fields, "slug") if obj is not None else fields


@admin.register(TenantMembership)
class TenantMembershipAdmin(SuperuserOnlyAdmin):
    list_display = ("user", "tenant")
    list_filter = ("tenant",)
    raw_id_fields = ("user",)
