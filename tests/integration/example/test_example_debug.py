"""The example project runs with DEBUG off unless DJANGO_DEBUG=1, and its admin keeps its
styles with DEBUG off (a DEBUG error page lists querysets: other tenants' schedule names)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _debug_setting(env_debug: str | None, tmp_path: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_DEBUG"}
    env.update(DJANGO_SETTINGS_MODULE="example_project.settings",
               CELERY_SCHEDULER_DATA_DIR=str(tmp_path))  # fmt: skip
    if env_debug is not None:
        env["DJANGO_DEBUG"] = env_debug
    code = "import django; django.setup(); from django.conf import settings; print(settings.DEBUG)"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.parametrize(
    ("env_debug", "expected"), [(None, "False"), ("0", "False"), ("1", "True")]
)
def test_debug_is_off_unless_asked(env_debug: str | None, expected: str, tmp_path: Path) -> None:
    assert _debug_setting(env_debug, tmp_path) == expected


@pytest.mark.django_db
def test_admin_static_files_are_served_with_debug_off(client: Any, settings: Any) -> None:
    settings.DEBUG = False
    for url in ("/static/admin/css/base.css", "/static/django_app/admin.css"):
        response = client.get(url)
        try:
            assert response.status_code == 200, url
            assert b"".join(response.streaming_content), url
        finally:
            response.close()  # a FileResponse holds the file open until closed
