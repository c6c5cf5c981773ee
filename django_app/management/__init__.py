"""Django management commands for celery_scheduler."""

from __future__ import annotations
