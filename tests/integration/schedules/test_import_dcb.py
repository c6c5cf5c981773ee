"""``import_django_celery_beat`` against real django-celery-beat tables.

django_celery_beat is installed for this test only (settings override + its migrations),
so the project itself does not depend on it.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from datetime import UTC, timedelta

import pytest
from django.conf import settings
from django.contrib import admin
from django.core.management import call_command
from django.test import override_settings

from celery_scheduler.core.clock import SYSTEM_CLOCK
from django_app.models import AuditEntry, Schedule

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def dcb() -> Iterator[None]:
    apps = [*settings.INSTALLED_APPS, "django_celery_beat"]
    with override_settings(INSTALLED_APPS=apps):
        call_command("migrate", "django_celery_beat", verbosity=0)
        try:
            yield
        finally:
            call_command("migrate", "django_celery_beat", "zero", verbosity=0)
    # Installing the app ran the admin's autodiscovery, which registered django_celery_beat's
    # models on the default site; left there, every later admin index page raised KeyError.
    for model in [m for m in admin.site._registry if m._meta.app_label == "django_celery_beat"]:
        admin.site.unregister(model)


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("import_django_celery_beat", *args, stdout=out)
    return out.getvalue()


def test_dry_run_reports_then_import_creates_idempotently(dcb: None) -> None:
    from django_celery_beat import models as m

    every = m.IntervalSchedule.objects.create(every=90, period="seconds")
    hourly = m.IntervalSchedule.objects.create(every=2, period="hours")
    berlin = m.CrontabSchedule.objects.create(
        minute="30", hour="2", day_of_week="*", day_of_month="*", month_of_year="*",
        timezone="Europe/Berlin",
    )  # fmt: skip
    run_at = SYSTEM_CLOCK.now() + timedelta(hours=1)
    clocked = m.ClockedSchedule.objects.create(clocked_time=run_at)
    sun = m.SolarSchedule.objects.create(event="sunrise", latitude=52.5, longitude=13.4)
    tasks = {
        "interval": m.PeriodicTask.objects.create(
            name="interval", task="billing.ping", interval=every, args=json.dumps(["a"]),
            kwargs=json.dumps({"message": "hi"}), queue="reports", priority=4,
        ),
        "disabled": m.PeriodicTask.objects.create(
            name="disabled", task="billing.ping", interval=hourly, enabled=False
        ),
        "cron": m.PeriodicTask.objects.create(name="cron", task="billing.ping", crontab=berlin),
        "clocked": m.PeriodicTask.objects.create(
            name="clocked", task="billing.ping", clocked=clocked, one_off=True
        ),
        "solar": m.PeriodicTask.objects.create(name="solar", task="billing.ping", solar=sun),
        "unknown": m.PeriodicTask.objects.create(
            name="unknown", task="nope.missing", interval=every
        ),
    }  # fmt: skip

    code, report = run_status("--dry-run")
    assert code == 1  # two rows skipped (solar, unknown task)
    assert Schedule.objects.count() == 0
    assert "6 periodic task(s): 4 would create, 0 already imported, 2 skipped" in report
    assert f"skip    #{tasks['solar'].id} 'solar': solar schedules are not supported" in report
    assert f"#{tasks['unknown'].id} 'unknown'" in report
    assert "nope.missing" in report
    assert "(paused: disabled in django-celery-beat)" in report

    assert "4 created, 0 already imported, 2 skipped" in run_status()[1]
    by_name = {s.name: s for s in Schedule.objects.all()}
    assert set(by_name) == {"interval", "disabled", "cron", "clocked"}
    interval = by_name["interval"]
    assert (interval.kind, interval.interval_seconds, interval.args, interval.kwargs) == (
        "INTERVAL", 90, ["a"], {"message": "hi"},
    )  # fmt: skip
    assert (interval.queue, interval.priority, interval.source) == (
        "reports", 4, "django_celery_beat",
    )  # fmt: skip
    assert interval.idempotency_key == f"dcb:{tasks['interval'].id}"
    assert (by_name["disabled"].interval_seconds, by_name["disabled"].state) == (7200, "PAUSED")
    # Audited like any change, naming the import (it wrote no entry before).
    trail = AuditEntry.objects.filter(schedule_id=by_name["disabled"].id).order_by("id")
    assert list(trail.values_list("action", "actor", "reason")) == [
        ("create", "manage.py import_django_celery_beat", ""),
        ("pause", "manage.py import_django_celery_beat", "disabled in django-celery-beat"),
    ]
    cron = by_name["cron"]
    assert (cron.kind, cron.cron, cron.timezone) == ("CRON", "30 2 * * *", "Europe/Berlin")
    one_off = by_name["clocked"]
    assert one_off.kind == "ONE_OFF"
    assert one_off.run_at == run_at.astimezone(UTC).replace(microsecond=run_at.microsecond)

    assert run_status()[0] == 1
    assert "0 created, 4 already imported, 2 skipped" in run_status()[1]
    assert Schedule.objects.count() == 4


def test_dry_run_shows_the_timing_each_import_gets(dcb: None) -> None:
    from django_celery_beat import models as m

    now = SYSTEM_CLOCK.now().replace(microsecond=0)
    hourly = m.IntervalSchedule.objects.create(every=1, period="hours")
    berlin = m.CrontabSchedule.objects.create(
        minute="30", hour="2", day_of_week="*", day_of_month="*", month_of_year="*",
        timezone="Europe/Berlin",
    )  # fmt: skip
    run_at = now + timedelta(hours=1)
    clocked = m.ClockedSchedule.objects.create(clocked_time=run_at)
    m.PeriodicTask.objects.create(
        name="hourly", task="billing.ping", interval=hourly,
        last_run_at=now - timedelta(minutes=10),
    )  # fmt: skip
    m.PeriodicTask.objects.create(name="cron", task="billing.ping", crontab=berlin)
    m.PeriodicTask.objects.create(
        name="clocked", task="billing.ping", clocked=clocked, one_off=True
    )
    report = run("--dry-run")
    lines = {name: next(x for x in report.splitlines() if f"{name!r}:" in x) for name in
             ("hourly", "cron", "clocked")}  # fmt: skip
    first = now + timedelta(minutes=50)  # the cadence kept from last_run_at
    assert f"every 3600 s, first run {first:%Y-%m-%d %H:%M:%S} UTC" in lines["hourly"]
    assert "cron '30 2 * * *' in Europe/Berlin, first run " in lines["cron"]
    assert f"once at {run_at:%Y-%m-%d %H:%M:%S} UTC" in lines["clocked"]
    assert Schedule.objects.count() == 0  # still a dry run


def test_without_the_tables_the_command_explains(db: None) -> None:
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="django_celery_beat_periodictask is missing"):
        run()
    assert Schedule.objects.count() == 0


def test_intervals_keep_their_cadence_from_last_run_at(dcb: None) -> None:
    """An hourly task that ran 10 minutes ago runs again in 50 minutes, not at the import."""
    from django_celery_beat import models as m

    now = SYSTEM_CLOCK.now().replace(microsecond=0)
    hourly = m.IntervalSchedule.objects.create(every=1, period="hours")
    daily = m.IntervalSchedule.objects.create(every=1, period="days")
    ran = {
        "hourly": now - timedelta(minutes=10),
        "daily": now - timedelta(hours=23),
        "long idle": now - timedelta(hours=3, minutes=30),  # beat was down: phase kept
    }
    for name, interval in (("hourly", hourly), ("daily", daily), ("long idle", hourly)):
        m.PeriodicTask.objects.create(
            name=name, task="billing.ping", interval=interval, last_run_at=ran[name]
        )
    run()
    first = {s.name: s.next_run_at for s in Schedule.objects.all()}
    assert first["hourly"] == ran["hourly"] + timedelta(hours=1)
    assert first["daily"] == ran["daily"] + timedelta(days=1)  # same time of day as before
    assert first["long idle"] == ran["long idle"] + timedelta(hours=4)


def test_expiry_fields_map_to_deadline_and_end(dcb: None) -> None:
    from django_celery_beat import models as m

    every = m.IntervalSchedule.objects.create(every=5, period="minutes")
    ends = SYSTEM_CLOCK.now().replace(microsecond=0) + timedelta(days=30)
    m.PeriodicTask.objects.create(
        name="short-lived runs", task="billing.ping", interval=every, expire_seconds=120
    )
    m.PeriodicTask.objects.create(name="ends", task="billing.ping", interval=every, expires=ends)
    run()
    assert Schedule.objects.get(name="short-lived runs").deadline_seconds == 120
    assert Schedule.objects.get(name="ends").end_at == ends


def test_dry_run_lists_what_cannot_be_carried_over(dcb: None) -> None:
    from django_celery_beat import models as m

    every = m.IntervalSchedule.objects.create(every=5, period="minutes")
    task = m.PeriodicTask.objects.create(
        name="routed", task="billing.ping", interval=every, exchange="billing",
        routing_key="billing.high", headers=json.dumps({"trace": "1"}), description="docs",
    )  # fmt: skip
    report = run("--dry-run")
    line = next(ln for ln in report.splitlines() if f"#{task.id} 'routed'" in ln)
    assert "not carried over: exchange='billing', routing_key='billing.high'" in report
    assert "headers=" in report
    assert "would create" in line


def test_before_migrate_the_command_says_so(dcb: None) -> None:
    from django.core.management.base import CommandError

    call_command("migrate", "django_app", "zero", verbosity=0)
    try:
        for args in (("--dry-run",), ()):
            with pytest.raises(CommandError, match=r"manage\.py migrate"):
                run(*args)
    finally:
        call_command("migrate", "django_app", verbosity=0)


def run_status(*args: str) -> tuple[int, str]:
    """Output and exit status, as a shell would see them (CommandError -> its returncode)."""
    from django.core.management.base import CommandError

    out = io.StringIO()
    try:
        call_command("import_django_celery_beat", *args, stdout=out)
    except CommandError as exc:
        return exc.returncode, out.getvalue() + str(exc)
    return 0, out.getvalue()


def test_each_malformed_row_is_skipped_with_its_reason_and_the_rest_imported(dcb: None) -> None:
    from django.db import connection
    from django_celery_beat import models as m

    every = m.IntervalSchedule.objects.create(every=60, period="seconds")
    good = [
        m.PeriodicTask.objects.create(name=f"good-{i}", task="billing.ping", interval=every)
        for i in range(3)
    ]
    bad_cron = m.CrontabSchedule.objects.create(minute="\u00b2", hour="*")  # a Unicode digit
    far = m.CrontabSchedule.objects.create(minute="0", hour="*", timezone="Europe/Berlin")
    bad = {
        "unicode cron": m.PeriodicTask.objects.create(
            name="unicode-cron", task="billing.ping", crontab=bad_cron
        ),
        "nul in kwargs": m.PeriodicTask.objects.create(
            name="nul-kwargs", task="billing.ping", interval=every, kwargs='{"a": "x\\u0000y"}'
        ),
        "year 9999": m.PeriodicTask.objects.create(
            name="year-9999", task="billing.ping", crontab=far,
        ),
    }  # fmt: skip
    good.append(m.PeriodicTask.objects.create(name="good-last", task="billing.ping", crontab=far))
    # Values django-celery-beat's forms would refuse, written behind its back.
    table = "django_celery_beat_periodictask"
    with connection.cursor() as cur:
        cur.execute(
            f"UPDATE {table} SET start_time = %s WHERE id = %s",
            # MySQL/MariaDB DATETIME takes no offset (Django stores UTC there).
            [
                "9999-12-31 23:59:59" if connection.vendor == "mysql" else "9999-12-31 23:59:59+00",
                bad["year 9999"].id,
            ],
        )

    # A NUL in kwargs is refused by validation on every database (PostgreSQL's jsonb could
    # not store it anyway), so the dry run reports it too.
    refused = {"unicode-cron", "year-9999", "nul-kwargs"}
    imported = {t.name for t in good}

    code, dry = run_status("--dry-run")
    assert code == 1, dry
    assert Schedule.objects.count() == 0
    assert "Traceback" not in dry
    skipped = {t.name for t in bad.values() if f"skip    #{t.id} {t.name!r}: " in dry}
    assert skipped == refused, dry
    total = len(good) + len(bad)
    summary = f"{total} periodic task(s): {{}} {{}}, 0 already imported, {len(refused)} skipped"
    assert summary.format(len(imported), "would create") in dry

    code, real = run_status()
    assert code == 1, real
    assert summary.format(len(imported), "created") in real
    assert set(Schedule.objects.values_list("name", flat=True)) == imported
    assert f"{len(refused)} periodic task(s) skipped" in real
    for name in refused:  # the same reason, dry run and real run alike
        line = next(x for x in dry.splitlines() if f"{name!r}:" in x)
        assert line in real.splitlines()


def test_a_crontab_imports_as_celery_runs_it(dcb: None) -> None:
    """django-celery-beat runs a row as Celery's crontab: both day fields must match there,
    either one in cron; a range that wraps (22-2) is Celery's, not cron's."""
    from django_celery_beat import models as m

    first_monday = m.CrontabSchedule.objects.create(
        minute="0", hour="9", day_of_month="1-7", day_of_week="mon"
    )
    overnight = m.CrontabSchedule.objects.create(minute="0", hour="22-2")
    m.PeriodicTask.objects.create(name="first-monday", task="billing.ping", crontab=first_monday)
    m.PeriodicTask.objects.create(name="overnight", task="billing.ping", crontab=overnight)
    code, out = run_status()
    assert code == 1, out
    assert "'first-monday'" in out
    assert "restricts both day_of_month and day_of_week" in out
    assert Schedule.objects.get(name="overnight").cron == "0 0,1,2,22,23 * * *"
    assert not Schedule.objects.filter(name="first-monday").exists()
