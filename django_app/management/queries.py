"""The management commands' raw SQL statements, named.

``import_django_celery_beat`` reads django-celery-beat's tables, whose models are not
installed here (the app need not be in ``INSTALLED_APPS``): their names are that app's
table names, written once below and quoted by the connection when the statement is built.
No statement takes parameters.
"""

from __future__ import annotations

from django.db import connection

#: django-celery-beat's table names (its models' ``db_table``).
DCB_PERIODIC_TASK = "django_celery_beat_periodictask"
DCB_INTERVAL = "django_celery_beat_intervalschedule"
DCB_CRONTAB = "django_celery_beat_crontabschedule"
DCB_CLOCKED = "django_celery_beat_clockedschedule"


def dcb_tasks() -> str:
    """Any database: every django-celery-beat periodic task with its interval, crontab or
    clocked schedule, in id order (the columns ``import_django_celery_beat`` reads)."""
    q = connection.ops.quote_name
    return f"""
SELECT t.id, t.name, t.task, t.args, t.kwargs, t.queue, t.priority, t.one_off, t.enabled,
       t.start_time, t.expires, t.expire_seconds, t.last_run_at, t.total_run_count,
       t.exchange, t.routing_key, t.headers, t.description,
       i.every, i.period,
       c.minute, c.hour, c.day_of_month, c.month_of_year, c.day_of_week, c.timezone,
       k.clocked_time, t.solar_id
FROM {q(DCB_PERIODIC_TASK)} t
LEFT JOIN {q(DCB_INTERVAL)} i ON i.id = t.interval_id
LEFT JOIN {q(DCB_CRONTAB)} c ON c.id = t.crontab_id
LEFT JOIN {q(DCB_CLOCKED)} k ON k.id = t.clocked_id
ORDER BY t.id
"""
