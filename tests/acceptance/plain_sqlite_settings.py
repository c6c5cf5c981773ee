"""The example project's settings with Django's plain SQLite options (what a user who did not
copy ours would have): for the test that beat refuses to run on them."""

from __future__ import annotations

from example_project.settings import *  # noqa: F403
from example_project.settings import DATABASES

DATABASES["default"]["OPTIONS"] = {}
