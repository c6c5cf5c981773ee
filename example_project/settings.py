"""Settings for the example project.

``DATABASE_URL`` (default: a SQLite file next to this project) and ``CELERY_BROKER_URL``
(default: kombu's SQLAlchemy transport over a SQLite file, so no server is needed) select
the embedded default or PostgreSQL + Redis with the same code.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import dj_database_url
import django

BASE_DIR = Path(__file__).resolve().parent
DATA_DIR = Path(os.environ.get("CELERY_SCHEDULER_DATA_DIR", BASE_DIR.parent / ".data"))
DATA_DIR.mkdir(parents=True, exist_ok=True)

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-project-insecure-key")
# Off unless asked for with DJANGO_DEBUG=1: Django's debug error page shows local variables
# and querysets, i.e. other tenants' data, to whoever can make a view fail.
DEBUG = os.environ.get("DJANGO_DEBUG", "0") == "1"
ALLOWED_HOSTS = ["*"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_app",
    "example_project.billing",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
WSGI_APPLICATION = "example_project.wsgi.application"

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL", f"sqlite:///{DATA_DIR / 'db.sqlite3'}"),
        conn_max_age=0,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    if django.VERSION < (5, 1):
        # transaction_mode and init_command are Django 5.1+: the package backports them.
        DATABASES["default"]["ENGINE"] = "django_app.sqlite3"
    # Several processes (beat, worker, web) share the file: wait for locks instead of failing.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"timeout": 30, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"}
    )
    DATABASES["default"].setdefault("TEST", {})["NAME"] = str(DATA_DIR / "test_db.sqlite3")

if DATABASES["default"]["ENGINE"] == "django.db.backends.mysql":
    # MySQL 8 / MariaDB 10.6+. utf8mb4 for any text; the test database gets a binary
    # (case-sensitive) collation like the one the docs ask production databases to use: under
    # the servers' default *_ci collations "Key" and "key" would collide in the unique indexes
    # on idempotency keys. Django's MySQL backend already sets READ COMMITTED (the claims'
    # conditional UPDATEs rely on it) and stores UTC datetimes as DATETIME(6).
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault("charset", "utf8mb4")
    DATABASES["default"].setdefault("TEST", {}).update(
        {
            "NAME": f"{DATABASES['default']['NAME']}_test",
            "CHARSET": "utf8mb4",
            "COLLATION": "utf8mb4_bin",
        }
    )

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"
STATIC_URL = "static/"

CELERY_BROKER_URL = os.environ.get(
    "CELERY_BROKER_URL", f"sqla+sqlite:///{DATA_DIR / 'broker.sqlite3'}"
)
# A result backend (e.g. redis://...) when set: scheduled runs store results like any task.
CELERY_RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND") or None
CELERY_RESULT_EXTENDED = os.environ.get("CELERY_RESULT_EXTENDED", "") == "1"
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BEAT_SCHEDULER = "celery_scheduler.beat:DatabaseScheduler"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Keep each worker process's database connection across tasks (Celery's Django fixup closes
# it before and after every task otherwise, whatever CONN_MAX_AGE says): a new PostgreSQL
# connection per scheduled run was the largest part of its cost (bench/README.md, "Worker
# throughput"). Celery closes it every this many tasks; 0 closes it after each task.
CELERY_DB_REUSE_MAX = int(os.environ.get("CELERY_DB_REUSE_MAX", "1000")) or None

CELERY_SCHEDULER = {
    key: int(value)
    for key, value in (
        ("shard_count", os.environ.get("CELERY_SCHEDULER_SHARDS")),
        ("horizon_seconds", os.environ.get("CELERY_SCHEDULER_HORIZON")),
        ("occurrence_lease_seconds", os.environ.get("CELERY_SCHEDULER_OCCURRENCE_LEASE")),
        ("lease_seconds", os.environ.get("CELERY_SCHEDULER_LEASE_SECONDS")),
        ("redelivery_timeout_seconds", os.environ.get("CELERY_SCHEDULER_REDELIVERY_TIMEOUT")),
        ("bulk_materialize", os.environ.get("CELERY_SCHEDULER_BULK_MATERIALIZE")),
        ("burst_relay", os.environ.get("CELERY_SCHEDULER_BURST_RELAY")),
        ("burst_lookahead_seconds", os.environ.get("CELERY_SCHEDULER_BURST_LOOKAHEAD")),
        ("burst_max_rows", os.environ.get("CELERY_SCHEDULER_BURST_MAX_ROWS")),
    )
    if value
}
# Any further settings as JSON, e.g. CELERY_SCHEDULER_SETTINGS='{"lease_seconds": 6}' (the
# chaos soak uses it to give its subprocesses short leases).
CELERY_SCHEDULER.update(json.loads(os.environ.get("CELERY_SCHEDULER_SETTINGS") or "{}"))

# One handler, on the root logger: the scheduler's INFO lines propagate to it once. (A handler
# on the "celery_scheduler" logger itself printed every line twice under celery, whose own
# root handler received the same record.) Celery replaces the root handler in its processes.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {"celery_scheduler": {"level": "INFO"}, "django_app": {"level": "INFO"}},
}
