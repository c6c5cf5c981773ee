from __future__ import annotations

from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "example_project.billing"
    label = "billing"
    default_auto_field = "django.db.models.BigAutoField"
