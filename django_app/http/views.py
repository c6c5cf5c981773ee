"""The API's views: parse (serializers), scope (auth), call ``celery_scheduler.api``, format.

Every schedule id in a URL is looked up inside the caller's tenant first
(``reads.get_schedule(id, tenant=...)``): another tenant's schedule answers 404 exactly like
a missing one, before the operation runs, so nothing of it is read or written. A schedule's
tenant never changes, so the check cannot go stale before the call.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any, ClassVar

from django.db.models import Q
from django.http import Http404
from django.urls import include, path
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from drf_spectacular.utils import extend_schema as _extend_schema
from drf_spectacular.views import SpectacularAPIView
from rest_framework import exceptions, serializers
from rest_framework.authentication import SessionAuthentication
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from celery_scheduler import api, errors
from celery_scheduler.api_types import as_json
from django_app.http import auth, operations, parsing, throttling
from django_app.http import errors as http_errors
from django_app.http import serializers as s
from django_app.http.auth import scope_of
from django_app.models import Occurrence
from django_app.schedules import reads

#: The body limit of ``schedules/bulk/`` and ``schedules/sync/`` (32 MiB): 10,000 items of
#: up to ~3 KiB each. Every other route keeps the project's DATA_UPLOAD_MAX_MEMORY_SIZE.
BULK_MAX_BODY = 32 * 1024 * 1024

_ERRORS = {
    400: OpenApiResponse(s.Error, "Validation error; `field` names the bad input."),
    401: OpenApiResponse(s.Error, "No or bad credentials."),
    403: OpenApiResponse(s.Error, "Not allowed for this credential."),
    404: OpenApiResponse(s.Error, "No such object in the caller's tenant."),
    409: OpenApiResponse(s.Error, "Conflict: idempotency key, version or state."),
    413: OpenApiResponse(s.Error, "The body is over this route's limit, which `detail` gives."),
    415: OpenApiResponse(s.Error, "The body is not sent as `application/json`."),
    406: OpenApiResponse(s.Error, "The `Accept` header excludes `application/json`."),
    429: OpenApiResponse(
        s.Error, "Over the `http_rate` (per token, user or address); `Retry-After` says when."
    ),
}
#: Every view throttles (429) and answers JSON only (406); one that reads a body changes
#: something (409: a conflict) and refuses a body too large or not JSON.
_ALWAYS = (400, 401, 403, 404, 406, 429)
_WITH_BODY = (409, 413, 415)


#: The header every 429 carries (every operation throttles).
_RETRY_AFTER = OpenApiParameter(
    "Retry-After", int, OpenApiParameter.HEADER, response=[429],
    description="Seconds until the credential's bucket lets a request through.",
)  # fmt: skip


def extend_schema(**kwargs: Any) -> Callable[[Any], Any]:
    """drf-spectacular's ``extend_schema`` on drf-spectacular's AutoSchema, whatever the
    project's ``DEFAULT_SCHEMA_CLASS``: mounting the API needs no settings."""
    kwargs["parameters"] = [*kwargs.get("parameters", ()), _RETRY_AFTER]

    def decorate(method: Any) -> Any:
        method.schema = AutoSchema
        return _extend_schema(**kwargs)(method)

    return decorate


def _responses(ok: Any, status: int = 200, *, body: bool = False) -> dict[int, Any]:
    codes = sorted(_ALWAYS + (_WITH_BODY if body else ()))
    return {status: ok, **{c: _ERRORS[c] for c in codes}}


class SchedulerAPIView(APIView):
    """Everything explicit, so the project's REST_FRAMEWORK settings do not change the API."""

    authentication_classes = [auth.TenantTokenAuthentication, SessionAuthentication]
    permission_classes = [auth.HasTenantScope]
    renderer_classes = [JSONRenderer]
    parser_classes = [parsing.BoundedJSONParser]
    throttle_classes = [throttling.CredentialRateThrottle]
    schema = AutoSchema()

    def get_exception_handler(self) -> Callable[..., Response | None]:
        return http_errors.handle

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        try:
            super().initial(request, *args, **kwargs)
        except (exceptions.NotAuthenticated, exceptions.AuthenticationFailed):
            # DRF asks the throttles only once the caller is authenticated and permitted:
            # a missing or wrong credential (a guess at a token's secret) would never be
            # throttled. It takes its address's bucket first (429 over the rate).
            self.check_throttles(request)
            raise

    def parse(self, serializer: type[s.Strict], data: Any) -> dict[str, Any]:
        if not hasattr(data, "keys"):
            # A list, as DRF gives every other message: the 400's `fields` has one shape.
            raise exceptions.ValidationError({"non_field_errors": ["expected a JSON object"]})
        ser = serializer(data=data)
        ser.is_valid(raise_exception=True)
        return ser.given()

    def query(self, serializer: type[s.Strict], request: Request) -> dict[str, Any]:
        params = request.query_params
        data: dict[str, Any] = {
            k: params.getlist(k) if k == "tag" else params.get(k) for k in params.keys()
        }
        return self.parse(serializer, data)

    def schedule(self, request: Request, schedule_id: uuid.UUID) -> Any:
        """The schedule in the caller's scope, or 404 (another tenant's one included)."""
        return reads.get_schedule(schedule_id, tenant=scope_of(request).slug)


def actor_of(request: Request) -> str:
    """Who is calling, for the audit trail: ``token:<prefix> (<name>)`` or ``user:<name>``."""
    user: Any = request.user
    if isinstance(user, auth.TokenUser):
        name = f" ({user.token.name})" if user.token.name else ""
        return f"token:{user.token.prefix}{name}"[:200]
    return f"user:{user.get_username()}"[:200]


def _filters(request: Request, given: dict[str, Any]) -> dict[str, Any]:
    """list_schedules/bulk keyword arguments, confined to the caller's tenant."""
    filters = dict(given)
    filters["tenant"] = scope_of(request).tenant_filter(filters.get("tenant"))
    tags = filters.pop("tag", None)
    if tags:
        if len(tags) == 1:
            filters["tag"] = tags[0]
        else:
            pairs = [t.partition("=") for t in tags]
            if any(not sep for _, sep, _ in pairs):
                raise errors.ValidationError(
                    "several tag filters must each be 'key=value'", field="tag"
                )
            counted = Counter(k.strip() for k, _, _ in pairs)
            twice = sorted(k for k, n in counted.items() if n > 1)
            if twice:
                # Folded into one mapping the last value would win: the filter (and a bulk
                # change by it) would reach schedules the caller excluded.
                raise errors.ValidationError(
                    f"tag filters name the key {twice[0]!r} more than once; a schedule has "
                    "one value per key",
                    field="tag",
                )
            filters["tag"] = {k: v for k, _, v in pairs}
    return {k: v for k, v in filters.items() if v is not None}


def _lifecycle(result: Any) -> dict[str, Any]:
    return {
        "schedule_id": str(result.schedule.id),
        "version": result.version,
        "state": result.state,
        "changed": result.changed,
        "invalidated": result.invalidated,
        "still_running": [str(i) for i in result.still_running],
        "message": result.describe(),
    }


class ScheduleListView(SchedulerAPIView):
    @extend_schema(
        parameters=[s.ListQuery],
        responses=_responses(s.SchedulePage),
        **operations.doc("schedules_list"),
        operation_id="schedules_list",
    )
    def get(self, request: Request) -> Response:
        given = self.query(s.ListQuery, request)
        limit = given.pop("limit", 50)
        cursor = given.pop("cursor", None) or None
        try:
            page = api.list_schedules(**_filters(request, given), limit=limit, after=cursor)
        except errors.ValidationError as exc:  # checked in the API's order, named as here
            raise reads.renamed_cursor_error(exc, "cursor") from None
        return Response(as_json(page))

    @extend_schema(
        request=s.ScheduleCreate,
        responses=_responses(s.ScheduleDescription, 201, body=True),
        **operations.doc("schedules_create"),
    )
    def post(self, request: Request) -> Response:
        given = self.parse(s.ScheduleCreate, request.data)
        given["tenant"] = scope_of(request).tenant_filter(given.get("tenant") or None)
        schedule = api.create_schedule(**given, actor=actor_of(request))
        described = api.describe_schedule(schedule.id, tenant=scope_of(request).slug)
        return Response(as_json(described), status=201)


class _ItemsView(SchedulerAPIView):
    # 10,000 items (serializers.MAX_ITEMS) of a few hundred bytes each do not fit Django's
    # 2.5 MiB default: these two routes take up to BULK_MAX_BODY.
    max_body_bytes = BULK_MAX_BODY
    """Bulk create and sync: each item parsed like a create's body, errors naming it."""

    def items(self, request: Request, serializer: type[s.Strict]) -> tuple[Any, dict[str, Any]]:
        given = self.parse(serializer, request.data)
        items = []
        for index, item in enumerate(given.pop("items")):
            parsed = s.ScheduleItem(data=item)
            if not parsed.is_valid():
                # {"items[3]": {"cron": [...]}}: the 400's field reads "items[3].cron".
                raise exceptions.ValidationError({f"items[{index}]": parsed.errors})
            items.append(parsed.given())
        tenant = scope_of(request).tenant_filter(given.pop("tenant", None) or None)
        return items, {"tenant": tenant, **given, "actor": actor_of(request)}


class BulkCreateView(_ItemsView):
    @extend_schema(
        request=s.BulkCreateRequest,
        responses=_responses(s.BulkCreateOutcome, 201, body=True),
        **operations.doc("schedules_bulk_create"),
        operation_id="schedules_bulk_create",
    )
    def post(self, request: Request) -> Response:
        items, options = self.items(request, s.BulkCreateRequest)
        return Response(as_json(api.create_schedules(items, **options)), status=201)


class SyncView(_ItemsView):
    @extend_schema(
        request=s.SyncRequest,
        responses=_responses(s.SyncOutcome, body=True),
        **operations.doc("schedules_sync"),
        operation_id="schedules_sync",
    )
    def post(self, request: Request) -> Response:
        items, options = self.items(request, s.SyncRequest)
        return Response(as_json(api.sync_schedules(items, **options)))


class ScheduleDetailView(SchedulerAPIView):
    @extend_schema(
        parameters=[s.DescribeQuery],
        responses=_responses(s.ScheduleDescription),
        **operations.doc("schedules_describe"),
        operation_id="schedules_describe",
    )
    def get(self, request: Request, schedule_id: uuid.UUID) -> Response:
        counts = self.query(s.DescribeQuery, request)
        described = api.describe_schedule(schedule_id, tenant=scope_of(request).slug, **counts)
        return Response(as_json(described))

    @extend_schema(
        request=s.ScheduleUpdate,
        responses=_responses(s.LifecycleOutcome, body=True),
        **operations.doc("schedules_update"),
    )
    def patch(self, request: Request, schedule_id: uuid.UUID) -> Response:
        given = self.parse(s.ScheduleUpdate, request.data)
        self.schedule(request, schedule_id)
        result = api.update_schedule(schedule_id, **given, actor=actor_of(request))
        return Response(_lifecycle(result))


class _ActionView(SchedulerAPIView):
    request_serializer: type[s.Strict] = s.EmptyRequest

    def act(self, schedule_id: uuid.UUID, given: dict[str, Any], slug: str | None) -> Any:
        raise NotImplementedError

    def post(self, request: Request, schedule_id: uuid.UUID) -> Response:
        given = self.parse(self.request_serializer, request.data)
        self.schedule(request, schedule_id)
        given["actor"] = actor_of(request)  # every action is in the audit trail
        return Response(self.act(schedule_id, given, scope_of(request).slug))


def _action(
    key: str,
    request: type[s.Strict],
    response: type[serializers.Serializer],
    act: Callable[[uuid.UUID, dict[str, Any], str | None], Any],
) -> type[_ActionView]:
    class View(_ActionView):
        request_serializer = request

        def act(self, schedule_id: uuid.UUID, given: dict[str, Any], slug: str | None) -> Any:
            return act(schedule_id, given, slug)

        @extend_schema(
            request=request,
            responses=_responses(response, body=True),
            **operations.doc(f"schedules_{key}"),
        )
        def post(self, request: Request, schedule_id: uuid.UUID) -> Response:
            return super().post(request, schedule_id)

    View.__name__ = View.__qualname__ = key.title().replace("_", "") + "View"
    return View


def _run_now(schedule_id: uuid.UUID, given: dict[str, Any], slug: str | None) -> Any:
    return as_json(reads.occurrence_summary(api.run_now(schedule_id, **given)))


PauseView = _action(
    "pause",
    s.PauseRequest,
    s.LifecycleOutcome,
    lambda i, g, t: _lifecycle(api.pause_schedule(i, **g)),
)
ResumeView = _action(
    "resume",
    s.ReasonRequest,
    s.LifecycleOutcome,
    lambda i, g, t: _lifecycle(api.resume_schedule(i, **g)),
)
CancelView = _action(
    "cancel",
    s.ReasonRequest,
    s.LifecycleOutcome,
    lambda i, g, t: _lifecycle(api.cancel_schedule(i, **g)),
)
RunNowView = _action("run_now", s.RunNowRequest, s.OccurrenceSummary, _run_now)
SkipView = _action(
    "skip",
    s.SkipRequest,
    s.SkipOutcome,
    lambda i, g, t: as_json(api.skip_occurrence(i, tenant=t, **g)),
)
BackfillView = _action(
    "backfill",
    s.BackfillRequest,
    s.BackfillOutcome,
    lambda i, g, t: as_json(api.backfill(i, tenant=t, **g)),
)


class OccurrenceListView(SchedulerAPIView):
    @extend_schema(
        parameters=[s.OccurrenceQuery],
        responses=_responses(s.OccurrencePage),
        **operations.doc("occurrences_list"),
    )
    def get(self, request: Request, schedule_id: uuid.UUID) -> Response:
        given = self.query(s.OccurrenceQuery, request)
        schedule = self.schedule(request, schedule_id)
        limit = given.get("limit", 50)
        rows = Occurrence.objects.filter(schedule=schedule)
        this_list = reads.occurrence_list(schedule.id)
        if given.get("cursor"):
            at, pk = reads.decode_cursor(given["cursor"], this_list, field="cursor")
            # Keyset on (scheduled_for, id) descending: the occurrence_schedule_time index.
            rows = rows.filter(Q(scheduled_for__lt=at) | Q(scheduled_for=at, id__lt=pk))
        page = list(rows.order_by("-scheduled_for", "-id")[: limit + 1])
        more = len(page) > limit
        page = page[:limit]
        cursor = (
            reads.encode_cursor(page[-1].scheduled_for, page[-1].id, this_list) if more else None
        )
        items = [as_json(reads.occurrence_summary(o)) for o in page]
        return Response({"items": items, "next_cursor": cursor})


class ReplayView(SchedulerAPIView):
    @extend_schema(
        request=s.ReasonRequest,
        responses=_responses(s.OccurrenceSummary, body=True),
        **operations.doc("occurrences_replay"),
    )
    def post(self, request: Request, occurrence_id: uuid.UUID) -> Response:
        given = self.parse(s.ReasonRequest, request.data)
        rows = Occurrence.objects.filter(pk=occurrence_id)
        slug = scope_of(request).slug
        if slug is not None:
            rows = rows.filter(tenant__slug=slug)
        if not rows.exists():
            raise errors.OccurrenceNotFound(f"No occurrence with id {occurrence_id}")
        replayed = api.replay_occurrence(occurrence_id, **given, actor=actor_of(request))
        return Response(as_json(reads.occurrence_summary(replayed)))


_BULK = {"pause": api.bulk_pause, "resume": api.bulk_resume, "cancel": api.bulk_cancel}


class BulkView(SchedulerAPIView):
    @extend_schema(
        request=s.BulkRequest,
        parameters=[
            OpenApiParameter("action", str, OpenApiParameter.PATH, enum=sorted(_BULK)),
        ],
        responses=_responses(s.BulkOutcome, body=True),
        **operations.doc("schedules_bulk_action"),
        operation_id="schedules_bulk_action",
    )
    def post(self, request: Request, action: str) -> Response:
        call = _BULK.get(action)
        if call is None:
            raise errors.ValidationError(f"action must be one of {sorted(_BULK)}", field="action")
        given = self.parse(s.BulkRequest, request.data)
        note = given.pop("note", None)
        reason = given.pop("reason", None)
        filters = _filters(request, given)  # another tenant named: 403 before anything else
        # The tenant is a scope, not a filter: {"tenant": "acme"} is every schedule of acme.
        chosen = {k: v for k, v in given.items() if k != "tenant"}
        if not any(v not in (None, "", []) for v in chosen.values()):
            # A token's tenant is implied, not chosen: an empty filter would otherwise mean
            # "every schedule of my tenant", which the API refuses to do by accident.
            raise errors.ValidationError(
                "give at least one filter (state, task, tag, name_contains, next_run_*); "
                "a bulk change of every schedule is refused",
                field="filter",
            )
        if note is not None:
            if action != "pause":
                raise errors.ValidationError("note is only for a bulk pause", field="note")
            filters["note"] = note
        return Response(as_json(call(**filters, actor=actor_of(request), reason=reason)))


class TenantListView(SchedulerAPIView):
    permission_classes = [auth.HasTenantScope, auth.StaffOnly]

    @extend_schema(responses=_responses(s.TenantUsage(many=True)), **operations.doc("tenants_list"))
    def get(self, request: Request) -> Response:
        slug = scope_of(request).slug
        return Response(as_json(api.list_tenants(tenant=slug)))

    @extend_schema(
        request=s.TenantCreate,
        responses=_responses(s.TenantInfo, 201, body=True),
        **operations.doc("tenants_create"),
    )
    def post(self, request: Request) -> Response:
        given = self.parse(s.TenantCreate, request.data)
        return Response(as_json(api.create_tenant(given.pop("slug"), **given)), status=201)


class TenantDetailView(SchedulerAPIView):
    permission_classes = [auth.HasTenantScope, auth.StaffOnly]

    def _visible(self, request: Request, slug: str) -> None:
        own = scope_of(request).slug
        if own is not None and own != slug:
            raise Http404(f"No tenant {slug!r}")

    @extend_schema(responses=_responses(s.TenantUsage), **operations.doc("tenants_describe"))
    def get(self, request: Request, slug: str) -> Response:
        self._visible(request, slug)
        try:
            (usage,) = api.list_tenants(tenant=slug)
        except errors.ValidationError:
            raise Http404(f"No tenant {slug!r}") from None
        return Response(as_json(usage))

    @extend_schema(
        request=s.TenantUpdate,
        responses=_responses(s.TenantInfo, body=True),
        **operations.doc("tenants_update"),
    )
    def patch(self, request: Request, slug: str) -> Response:
        given = self.parse(s.TenantUpdate, request.data)
        try:
            api.get_tenant(slug)
        except errors.ValidationError:
            raise Http404(f"No tenant {slug!r}") from None
        return Response(as_json(api.update_tenant(slug, **given)))


def _version() -> str:
    try:
        return version("celery-scheduler")
    except PackageNotFoundError:  # a checkout that was never installed
        return "0"


class _NotDocumented(AutoSchema):
    def is_excluded(self) -> bool:
        return True


class SchemaView(SpectacularAPIView):
    """The OpenAPI 3 document of this API alone (public: it describes, it holds no data).

    Only this package's urls are walked, under the prefix the project mounted them at, so
    other DRF views of the project (whatever their schema class) stay out of it.
    """

    authentication_classes: list[Any] = []
    permission_classes: list[Any] = []
    schema = _NotDocumented()
    custom_settings = {
        "TITLE": "celery-scheduler HTTP API",
        "DESCRIPTION": (
            "Schedules, occurrences and tenants of celery-scheduler. Authenticate with a "
            "tenant token (`Authorization: Bearer cs_<prefix>.<secret>`) or a staff session. "
            "Errors are `{error, detail, field}`: 400 names the field (and lists every "
            "refused one in `fields` when the request's typing refused it), 404 hides other "
            "tenants, 409 is a conflict. A method a path does not list (but HEAD and OPTIONS, "
            "which every path answers) is a 405 in the same shape, with `Allow` naming the "
            "methods it does."
        ),
        "VERSION": _version(),
    }

    #: The generated document per mount prefix: it depends on the code only, and building
    #: it is slow (bench/README.md, "OpenAPI document served from memory"): built once.
    _documents: ClassVar[dict[str, Any]] = {}

    def get_exception_handler(self) -> Callable[..., Response | None]:
        return http_errors.handle

    def handle_exception(self, exc: Exception) -> Response:
        response = super().handle_exception(exc)
        # The document's renderers (YAML unless asked for JSON) would write the error too, in
        # DRF's shape: an error is the API's JSON error whatever format was asked for.
        self.request.accepted_renderer = JSONRenderer()
        self.request.accepted_media_type = JSONRenderer.media_type
        return response

    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        prefix = request.path_info.lstrip("/").removesuffix("schema/")
        document = self._documents.get(prefix)
        if document is not None:
            return Response(document)
        self.patterns = [path(prefix, include("django_app.http.urls"))]
        response = super().get(request, *args, **kwargs)
        if response.status_code == 200:
            self._documents[prefix] = response.data
        return response


class NotFoundView(SchedulerAPIView):
    """Every path under the API that matches no route: the JSON 404, whatever the method."""

    authentication_classes: list[Any] = []
    permission_classes: list[Any] = []
    schema = _NotDocumented()

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        raise Http404("No such route in the scheduler API.")
