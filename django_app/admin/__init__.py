"""The scheduler's Django admin: importing this package registers every ModelAdmin.

schedules: the one schedule form, list and lifecycle actions; occurrences: history,
attempts and dead letters; tenancy: tenant scoping and tenant management; api_tokens: the
HTTP API's tokens (create, shown once; revoke); the preview endpoint and the overview page
live in ``django_app.admin.views``; overview_entry gives the overview its row on the admin index.
"""

from __future__ import annotations

from django_app.admin import api_tokens, audit, occurrences, overview_entry, schedules, tenancy

__all__ = ["api_tokens", "audit", "occurrences", "overview_entry", "schedules", "tenancy"]
