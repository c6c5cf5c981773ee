"""Time GET schema/ six times in one process: the first builds the OpenAPI document, the
rest are served from the kept one (issue 25).

    CELERY_SCHEDULER_DATA_DIR=$(mktemp -d) python manage.py migrate
    CELERY_SCHEDULER_DATA_DIR=<same> python bench/openapi_schema.py
"""

from __future__ import annotations

import os
import time

import django


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
    django.setup()
    # After setup: the test client imports models.
    from django.test import Client
    from django.test.utils import setup_test_environment

    setup_test_environment()
    client = Client()
    times = []
    for _ in range(6):
        start = time.perf_counter()
        response = client.get("/scheduler/api/schema/?format=json")
        times.append((time.perf_counter() - start) * 1000)
        assert response.status_code == 200, response.status_code
    print(" ".join(f"{t:.1f}" for t in times), "ms")


if __name__ == "__main__":
    main()
