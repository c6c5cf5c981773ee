from __future__ import annotations

from django.apps import AppConfig


class SchedulerConfig(AppConfig):
    name = "django_app"
    label = "django_app"
    verbose_name = "Distributed scheduler"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_app import (
            database_checks,  # registers the system checks
            metrics_server,
        )

        del database_checks
        # Workers serve metrics when a port is configured, with no code in the user's project.
        metrics_server.connect_worker_signals()
