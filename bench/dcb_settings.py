"""example_project settings plus django-celery-beat, for the benchmark's comparison run."""

from __future__ import annotations

from example_project.settings import *  # noqa: F403
from example_project.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "django_celery_beat"]
DJANGO_CELERY_BEAT_TZ_AWARE = True
