"""The scheduler's Django admin: importing this package registers every ModelAdmin.

schedules: the one schedule form, list and lifecycle actions; occurrences: history,
attempts and dead letters; tenancy: tenant scoping and tenant management; the preview
endpoint and the overview page live in ``django_app.views``.
"""

from __future__ import annotations

from django_app.admin import occurrences, schedules, tenancy

__all__ = ["occurrences", "schedules", "tenancy"]
