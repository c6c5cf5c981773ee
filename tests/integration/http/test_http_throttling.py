"""Per-token rate limits (issue 25, item 4): off by default; over the rate a 429 with
Retry-After; one token's bucket does not slow another's."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from django.test import Client, override_settings

from celery_scheduler import api
from django_app.http import tokens

pytestmark = pytest.mark.django_db
URL = "/scheduler/api/schedules/"


def _get(client: Client, token: str) -> tuple[int, dict[str, str], dict[str, object]]:
    response = client.get(URL, HTTP_AUTHORIZATION=f"Bearer {token}")
    return response.status_code, dict(response.headers), response.json()


@pytest.fixture
def two_tokens() -> tuple[str, str]:
    cache.clear()
    api.create_tenant("acme")
    api.create_tenant("globex")
    return tokens.issue("acme", "a").secret, tokens.issue("globex", "g").secret


def test_no_throttling_by_default(two_tokens: tuple[str, str]) -> None:
    client = Client()
    assert {_get(client, two_tokens[0])[0] for _ in range(30)} == {200}


def test_over_the_rate_a_token_gets_429_with_retry_after_and_others_do_not(
    two_tokens: tuple[str, str],
) -> None:
    acme, globex = two_tokens
    client = Client()
    with override_settings(CELERY_SCHEDULER={"http_rate": "3/min"}):
        assert [_get(client, acme)[0] for _ in range(3)] == [200, 200, 200]
        status, headers, body = _get(client, acme)
        assert status == 429
        assert body["error"] == "throttled"
        assert 1 <= int(headers["Retry-After"]) <= 60
        assert _get(client, globex)[0] == 200  # its own bucket


def test_calls_without_a_valid_credential_are_throttled_by_address(
    two_tokens: tuple[str, str],
) -> None:
    """DRF asks the throttles after authentication and permissions: a wrong secret (a guess
    at a token) or no credential at all got 401 forever, never 429."""
    acme, _ = two_tokens
    prefix = acme.split(".")[0] if "." in acme else acme[:8]
    guesses = Client()
    with override_settings(CELERY_SCHEDULER={"http_rate": "3/min"}):
        wrong = [_get(guesses, f"{prefix}.not-the-secret")[0] for _ in range(4)]
        assert wrong == [401, 401, 401, 429]
        anonymous = guesses.get(URL)
        assert anonymous.status_code == 429  # the same address's bucket
        assert _get(Client(), acme)[0] == 200  # a valid token has its own
