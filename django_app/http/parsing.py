"""The request body: size-bounded, depth-safe JSON, every failure a JSON 400 or 413.

DRF's ``JSONParser`` lets two inputs escape as 500s or HTML: ``RecursionError`` from the
decoder on a body nested ~1,000 levels, and (through ``request.body``) Django's
``RequestDataTooBig`` above ``DATA_UPLOAD_MAX_MEMORY_SIZE``, which Django answers with an
HTML 400. This parser reads the stream itself, at most ``limit + 1`` bytes, so the limit is
the view's (``max_body_bytes``: the bulk routes take more than Django's default) and a
larger body is a 413 that says the limit. (Django's check would still answer a project
whose DATA_UPLOAD_MAX_MEMORY_SIZE is lower than a route's limit, and the error handler
turns that into the same JSON 413.)
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Mapping
from typing import IO, Any

from django.conf import settings
from rest_framework import exceptions, status
from rest_framework.parsers import BaseParser

#: Django's own default for DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MiB).
DEFAULT_MAX_BODY = 2_621_440


class BodyTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "request_too_large"

    def __init__(self, limit: int) -> None:
        super().__init__(f"the request body is larger than this route's limit of {limit} bytes")


def default_max_body() -> int:
    """The project's ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (None there means no limit: ours then)."""
    return int(getattr(settings, "DATA_UPLOAD_MAX_MEMORY_SIZE", None) or DEFAULT_MAX_BODY)


def _strict_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


class BoundedJSONParser(BaseParser):
    """JSON with the view's body limit (``max_body_bytes``, default Django's setting).

    Not a ``JSONParser`` subclass on purpose: DRF hands those ``request.body`` (and so
    Django's limit and its HTML 400), anything else the raw stream."""

    media_type = "application/json"

    def parse(
        self,
        stream: IO[bytes] | None,
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        context = parser_context or {}
        limit = getattr(context.get("view"), "max_body_bytes", None) or default_max_body()
        request = context.get("request")
        meta = getattr(request, "META", {}) or {}
        try:
            declared = int(meta.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        if declared > limit:
            raise BodyTooLarge(limit)
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise BodyTooLarge(limit)
        encoding = context.get("encoding", settings.DEFAULT_CHARSET)
        try:
            text = codecs.decode(raw, encoding)
            return json.loads(text, parse_constant=_strict_constant)
        except RecursionError:
            raise exceptions.ParseError("JSON parse error - nested too deeply") from None
        except ValueError as exc:  # bad JSON, bad encoding, an integer of 4,300+ digits
            raise exceptions.ParseError(f"JSON parse error - {exc}") from None
