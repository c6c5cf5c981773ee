"""Malformed list-page query strings answer 400 with a message, never 500.

Django's changelist turns some bad filters into a redirect to ``?e=1`` ("Database error",
which misleads) and lets others escape as a 500: a date-hierarchy year too large for
``datetime`` (OverflowError), an integer too large for SQLite, a NUL byte in a text lookup
(a DataError on PostgreSQL, which also aborts the request's transaction). The 500 page of a
DEBUG site shows querysets and local variables, so it must never be reachable from a URL.

:class:`SafeChangelistAdmin` refuses NUL bytes before any query runs, and turns every
lookup, page or ordering error raised while building or rendering the list into a 400 that
names what the user sent (the message repeats only the user's own input).
"""

from __future__ import annotations

import logging
from typing import Any

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.template.response import TemplateResponse

logger = logging.getLogger(__name__)

#: Errors a lookup built from the query string raises for malformed values.
_LOOKUP_ERRORS = (IncorrectLookupParameters, DjangoValidationError, ValueError, OverflowError)


class MalformedQuery(Exception):
    """A list page's query string cannot be applied; the message says which part."""


def nul_parameter(request: HttpRequest) -> str | None:
    """The first query-string key whose key or value holds a NUL byte, else None."""
    for key, values in request.GET.lists():
        if "\x00" in key or any("\x00" in value for value in values):
            return key
    return None


def bad_request(message: str) -> HttpResponse:
    # Plain text: the message echoes user input, so no HTML is rendered from it.
    return HttpResponseBadRequest(
        f"Bad query string: {message}\n", content_type="text/plain; charset=utf-8"
    )


class SafeChangelistAdmin(admin.ModelAdmin):
    """Base of every ModelAdmin of the app."""

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        try:
            return super().get_changelist_instance(request)
        except _LOOKUP_ERRORS as exc:
            raise MalformedQuery(_describe(exc)) from exc

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> Any:
        # Django 5.0+ answers an integer id beyond the column's range with "no such object";
        # Django 4.2 lets SQLite raise OverflowError (a 500). The same answer on both.
        try:
            return super().get_object(request, object_id, from_field)
        except OverflowError:
            return None

    def changelist_extra_context(self, request: HttpRequest) -> dict[str, Any]:
        """Extra template context of the list page (subclasses add theirs here)."""
        return {}

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        key = nul_parameter(request)
        if key is not None:
            return bad_request(f"parameter {key!r} contains a NUL byte")
        try:
            extra = {**self.changelist_extra_context(request), **(extra_context or {})}
            response: HttpResponse = super().changelist_view(request, extra)
            if isinstance(response, TemplateResponse):
                # Render here: the page's rows are fetched while rendering, and an error
                # there must become the same 400, not a 500 after the view returned.
                response.render()
        except MalformedQuery as exc:
            return bad_request(str(exc))
        except _LOOKUP_ERRORS as exc:
            logger.info("admin list %s: malformed query %r: %s", request.path, request.GET, exc)
            return bad_request(_describe(exc))
        return response


def _describe(exc: BaseException) -> str:
    error = exc
    while isinstance(error, IncorrectLookupParameters | MalformedQuery) and error.__cause__:
        error = error.__cause__  # Django wraps the lookup's own error; say that one
    if isinstance(error, DjangoValidationError):
        return "; ".join(error.messages)
    return str(error) or type(error).__name__
