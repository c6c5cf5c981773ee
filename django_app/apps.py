from __future__ import annotations

from django.apps import AppConfig, apps


class SchedulerConfig(AppConfig):
    name = "django_app"
    label = "django_app"
    verbose_name = "Distributed scheduler"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from celery_scheduler import ports
        from django_app import wiring
        from django_app.db import checks  # registers the system checks
        from django_app.operations import metrics_server

        del checks
        # The composition root: the Celery side (beat, @idempotent_task) reaches the
        # database only through the backend installed here.
        ports.install(wiring.DjangoBackend())
        # Workers serve metrics when a port is configured, with no code in the user's project.
        metrics_server.connect_worker_signals()
        if apps.is_installed("django.contrib.admin"):
            from django.contrib import admin

            from django_app.admin import index_order

            index_order.install(admin.site)  # Schedules first, not 5th alphabetically
