"""A real HTTP client for the API tests: ``urllib`` against pytest-django's ``live_server``."""

from __future__ import annotations

import json
import secrets
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client

PREFIX = "/scheduler/api/"


@dataclass
class Reply:
    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class HttpClient:
    """Sends JSON to the live server as a token holder or a logged-in session."""

    base: str
    token: str | None = None
    cookies: dict[str, str] = field(default_factory=dict)
    csrf: str | None = None

    def call(self, method: str, path: str, body: Any = None, raw: bytes | None = None) -> Reply:
        url = self.base + PREFIX + path.lstrip("/")
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        request = urllib.request.Request(url, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        if self.cookies:
            request.add_header("Cookie", "; ".join(f"{k}={v}" for k, v in self.cookies.items()))
        if self.csrf:
            request.add_header("X-CSRFToken", self.csrf)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return Reply(response.status, _json(response.read()), dict(response.headers))
        except urllib.error.HTTPError as exc:
            return Reply(exc.code, _json(exc.read()), dict(exc.headers))

    def get(self, path: str) -> Reply:
        return self.call("GET", path)

    def post(self, path: str, body: Any = None) -> Reply:
        return self.call("POST", path, {} if body is None else body)

    def patch(self, path: str, body: Any) -> Reply:
        return self.call("PATCH", path, body)


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return raw.decode(errors="replace")


def session_client(base: str, user: User, *, csrf: bool = True) -> HttpClient:
    """A client holding ``user``'s session cookie (and a CSRF cookie + header pair)."""
    django_client = Client()
    django_client.force_login(user)
    cookies = {
        settings.SESSION_COOKIE_NAME: django_client.cookies[settings.SESSION_COOKIE_NAME].value
    }
    token = None
    if csrf:
        token = secrets.token_hex(16)  # 32 characters: an unmasked CSRF secret
        cookies[settings.CSRF_COOKIE_NAME] = token
    return HttpClient(base, cookies=cookies, csrf=token)
