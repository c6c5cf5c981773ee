"""The admin's live preview answers 400 naming the field for a cron with a Unicode digit."""

# ruff: noqa: F811

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from tests.integration.admin_support import login, tenants, users  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db

PREVIEW = reverse("admin:django_app_schedule_preview")


@pytest.mark.parametrize("cron", ["² * * * *", "① * * * *", "٣ * * * *", "*/² * * * *"])
def test_preview_rejects_unicode_digits_with_400(login: Any, cron: str) -> None:
    response = login("root").get(PREVIEW, {"kind": "CRON", "cron": cron, "timezone": "UTC"})
    assert response.status_code == 400
    body = response.json()
    assert body["ok"] is False
    assert "minute" in body["errors"]["cron"]
