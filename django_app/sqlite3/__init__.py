"""Django's SQLite backend with 5.1's ``transaction_mode`` and ``init_command`` on Django 4.2.

Use ``ENGINE = "django_app.sqlite3"`` on Django 4.2 for the scheduler's embedded SQLite
default; on 5.1+ it is Django's own backend unchanged.
"""
