"""Django management commands for celery_scheduler (queries: their raw SQL statements)."""

from __future__ import annotations
