from __future__ import annotations

from django.apps import AppConfig, apps


class SchedulerConfig(AppConfig):
    name = "django_app"
    label = "django_app"
    verbose_name = "Distributed scheduler"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # deferred (app registry): AppConfig.ready, where the models and admin may load
        from celery import signals

        from celery_scheduler import ports
        from django_app import wiring
        from django_app.db import checks  # registers the system checks
        from django_app.operations import metrics_server
        from django_app.worker import presentation

        del checks
        # The composition root: the Celery side (beat, @idempotent_task) reaches the
        # database only through the backend installed here.
        ports.install(wiring.DjangoBackend())
        # Workers serve metrics when a port is configured, with no code in the user's project.
        metrics_server.connect_worker_signals()
        # Scheduled runs are traced as the user's task: its run is set up before the
        # worker builds any tracer (django_app.worker.presentation).
        signals.worker_init.connect(
            presentation.on_worker_init, weak=False, dispatch_uid="cs-celery-tools"
        )
        if apps.is_installed("django.contrib.admin"):
            # deferred (app registry): only with the admin installed
            from django.contrib import admin

            from django_app.admin import index_order

            index_order.install(admin.site)  # Schedules first, not 5th alphabetically
