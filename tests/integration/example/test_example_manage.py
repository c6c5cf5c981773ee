"""``python example_project/manage.py`` works from any folder, as a newcomer runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_example_projects_manage_py_runs_without_shadowing_celery(tmp_path: Path) -> None:
    env = {**os.environ, "CELERY_SCHEDULER_DATA_DIR": str(tmp_path)}
    env.pop("DATABASE_URL", None)
    done = subprocess.run(
        [sys.executable, str(ROOT / "example_project" / "manage.py"), "check"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "no issues" in done.stdout
