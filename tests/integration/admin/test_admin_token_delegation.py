"""A tenant's own admin users create and revoke that tenant's API tokens, never another
tenant's (issue 25, item 4)."""

# ruff: noqa: F811

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

from django_app.http import tokens
from django_app.models import ApiToken
from tests.integration.admin_support import (  # noqa: F401 (fixtures)
    login,
    tenants,
    users,
)

pytestmark = pytest.mark.django_db
LIST = reverse("admin:django_app_apitoken_changelist")
ADD = reverse("admin:django_app_apitoken_add")


@pytest.fixture
def token_admin(users: dict[str, Any]) -> Any:
    """alice (acme) gets Django's permissions on API tokens."""
    alice = users["acme"]
    alice.user_permissions.add(
        *Permission.objects.filter(
            content_type__app_label="django_app", codename__endswith="_apitoken"
        )
    )
    return alice


def test_a_tenant_admin_creates_a_token_for_their_tenant_only(
    login: Any, tenants: dict[str, Any], token_admin: Any
) -> None:
    client = login("acme")
    # A forged tenant field is ignored: the token is always the user's tenant's.
    response = client.post(ADD, {"name": "ci", "tenant": tenants["globex"].pk}, follow=True)
    assert response.status_code == 200
    token = ApiToken.objects.get(name="ci")
    assert token.tenant == tenants["acme"]
    assert any("copy it now" in str(m) for m in response.context["messages"])


def test_a_tenant_admin_sees_and_revokes_only_their_tenants_tokens(
    login: Any, tenants: dict[str, Any], token_admin: Any
) -> None:
    own = tokens.issue("acme", "own")
    other = tokens.issue("globex", "other")
    client = login("acme")
    client.raise_request_exception = False
    page = client.get(LIST)
    assert own.token.prefix.encode() in page.content
    assert other.token.prefix.encode() not in page.content
    change = reverse("admin:django_app_apitoken_change", args=[_pk(other.token.prefix)])
    assert client.get(change).status_code == 404
    both = [_pk(own.token.prefix), _pk(other.token.prefix)]
    forged = client.post(LIST, {"action": "revoke", "_selected_action": both})
    assert forged.status_code == 403
    assert not ApiToken.objects.filter(revoked_at__isnull=False).exists()
    client.post(LIST, {"action": "revoke", "_selected_action": [_pk(own.token.prefix)]})
    assert ApiToken.objects.get(prefix=own.token.prefix).revoked_at is not None
    assert ApiToken.objects.get(prefix=other.token.prefix).revoked_at is None


def test_without_the_token_permissions_a_tenant_user_cannot_manage_tokens(login: Any) -> None:
    client = login("acme")
    assert client.get(LIST).status_code == 403
    assert client.get(ADD).status_code == 403


def _pk(prefix: str) -> Any:
    return ApiToken.objects.get(prefix=prefix).pk
