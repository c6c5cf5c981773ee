"""One JSON error shape for every failure, with the status that says what to do next.

``{"error": "<code>", "detail": "<message>", "field": "<name or null>"}``:

- 400 ``validation_error``: bad input, ``field`` names it; nothing was written (the API
  validates before it writes). When the request's typing refused it (a wrong type, an
  unknown field), ``fields`` adds DRF's tree of every refused field and its messages.
  Malformed JSON is ``parse_error``.
- 401 ``not_authenticated`` / ``authentication_failed``; 403 ``permission_denied``.
- 404 ``not_found``: no such object *in the caller's tenant* (another tenant's id looks
  exactly like a missing one).
- 413 ``request_too_large``: the body is over the route's limit, which the message gives.
- 429 ``throttled``: over the credential's ``http_rate``; ``Retry-After`` says when to retry.
- 409 ``idempotency_conflict`` (key reused with other content), ``version_conflict``
  (``expected_version`` no longer current), ``invalid_state`` (e.g. resume a canceled
  schedule), ``quota_exceeded`` (the tenant's ``max_schedules``).
"""

from __future__ import annotations

import math
from typing import Any

from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response

from celery_scheduler import errors
from django_app.http import parsing

_CONFLICTS: list[tuple[type[Exception], str]] = [
    (errors.IdempotencyConflict, "idempotency_conflict"),
    (errors.VersionConflict, "version_conflict"),
    (errors.InvalidStateTransition, "invalid_state"),
    (errors.QuotaExceeded, "quota_exceeded"),
]


def body(code: str, detail: str, field: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"error": code, "detail": detail, "field": field, **extra}


def _first_field(detail: Any, prefix: str = "") -> tuple[str | None, str]:
    """The first failing field of a DRF error tree, dotted (``tags.env``), and its message."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            name = "" if key == "non_field_errors" else str(key)  # a list's 0 included
            path = f"{prefix}.{name}" if prefix and name else (name or prefix)
            return _first_field(value, path)
    if isinstance(detail, list) and detail:
        return _first_field(detail[0], prefix)
    return (prefix or None), str(detail)


def handle(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF exception handler for the scheduler's views (set on the base view)."""
    if isinstance(exc, errors.ValidationError):
        return Response(body("validation_error", str(exc), exc.field), status=400)
    for kind, code in _CONFLICTS:
        if isinstance(exc, kind):
            return Response(body(code, str(exc)), status=status.HTTP_409_CONFLICT)
    if isinstance(exc, errors.ScheduleNotFound | errors.OccurrenceNotFound | Http404):
        return Response(body("not_found", str(exc) or "Not found."), status=404)
    if isinstance(exc, TooManyFieldsSent):  # Django's DATA_UPLOAD_MAX_NUMBER_FIELDS
        return Response(body("parse_error", str(exc), "query"), status=400)
    if isinstance(exc, RequestDataTooBig):  # Django's own limit, met through request.body
        detail = f"the request body is larger than the limit ({exc})"
        return Response(body("request_too_large", detail, "body"), status=413)
    if isinstance(exc, exceptions.ParseError | parsing.BodyTooLarge):
        code, status_code = str(exc.default_code), exc.status_code
        return Response(body(code, str(exc.detail), "body"), status=status_code)
    if isinstance(exc, exceptions.ValidationError):
        field, message = _first_field(exc.detail)
        return Response(body("validation_error", message, field, fields=exc.detail), status=400)
    if isinstance(exc, exceptions.APIException):
        codes = exc.get_codes()
        response = Response(
            body(codes if isinstance(codes, str) else exc.default_code, str(exc.detail)),
            status=exc.status_code,
        )
        wait = getattr(exc, "wait", None)  # set by DRF on Throttled (not in its stubs)
        if isinstance(exc, exceptions.Throttled) and wait is not None:
            response["Retry-After"] = str(max(1, math.ceil(wait)))
        # Set by DRF's handle_exception for 401s: tells the client how to authenticate.
        auth_header = getattr(exc, "auth_header", None)
        if auth_header:
            response["WWW-Authenticate"] = auth_header
        return response
    return None  # a bug: let Django answer 500 (and log it)
