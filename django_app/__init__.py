"""Django app of celery_scheduler: models, migrations, admin, management commands.

Add ``"django_app"`` to ``INSTALLED_APPS``.
"""
