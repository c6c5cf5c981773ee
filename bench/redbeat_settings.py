"""example_project settings plus celery-redbeat's keys (its own Redis db), for the benchmark."""

from __future__ import annotations

import os

from example_project.settings import *  # noqa: F403

CELERY_REDBEAT_REDIS_URL = os.environ.get("BENCH_REDBEAT_URL", "redis://127.0.0.1:6379/10")
CELERY_REDBEAT_LOCK_TIMEOUT = 30
