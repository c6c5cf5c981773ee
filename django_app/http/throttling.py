"""Per-credential rate limits on the HTTP API, through DRF's throttling.

Off unless ``CELERY_SCHEDULER["http_rate"]`` is set ("600/min"). One bucket per API token
(its id) or per staff user, so one noisy client cannot slow another tenant's; over the
rate DRF raises ``Throttled`` and the error handler answers 429 with ``Retry-After``.
The rate is read at each request (the entry point), so a test or a settings change applies
without a restart.
"""

from __future__ import annotations

from typing import Any

from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle

from django_app import conf
from django_app.http import auth


class CredentialRateThrottle(SimpleRateThrottle):
    scope = "celery_scheduler"

    def get_rate(self) -> str | None:
        return conf.get().http_rate

    def allow_request(self, request: Request, view: Any) -> bool:
        # SimpleRateThrottle reads the rate once, in __init__ (before this request): read
        # it again so the setting applies as it stands now.
        self.rate = self.get_rate()
        self.num_requests, self.duration = self.parse_rate(self.rate)
        return super().allow_request(request, view)

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        user: Any = request.user
        if isinstance(user, auth.TokenUser):
            ident = f"token:{user.token.pk}"
        elif getattr(user, "is_authenticated", False):
            ident = f"user:{user.pk}"
        else:
            ident = f"anon:{self.get_ident(request)}"
        return self.cache_format % {"scope": self.scope, "ident": ident}
