"""``manage.py schedules list``: the table's columns line up whatever the rows hold."""

from __future__ import annotations

from datetime import UTC, timedelta
from io import StringIO

import pytest
from django.core.management import call_command

from celery_scheduler import api
from celery_scheduler.core.clock import SYSTEM_CLOCK
from django_app.models import ScheduleCursor

pytestmark = pytest.mark.django_db


def test_schedules_list_columns_align_with_and_without_microseconds() -> None:
    api.create_tenant("a-rather-long-tenant-slug")
    base = (SYSTEM_CLOCK.now() + timedelta(days=1)).replace(microsecond=0)
    for name, when in (("whole second", base), ("fraction", base + timedelta(microseconds=5))):
        made = api.create_schedule(
            tenant="a-rather-long-tenant-slug", name=name, task="billing.ping", interval=60
        )
        ScheduleCursor.objects.filter(pk=made.id).update(next_run_at=when)
    out = StringIO()
    call_command("schedules", "list", stdout=out)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3, lines
    names = ("NAME", "whole", "fraction")
    starts = {line.index(name) for line, name in zip(lines, names, strict=True)}
    assert len(starts) == 1, "\n".join(lines)  # NAME starts at one column on every line
    assert f"{base.astimezone(UTC):%Y-%m-%d %H:%M:%S}.000" in out.getvalue()
