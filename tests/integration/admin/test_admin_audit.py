"""Pause, resume, cancel, run now and replay from the admin are in Django's admin log."""

# The fixtures are imported from admin_support, so their parameters shadow the imports.
# ruff: noqa: F811

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from tests.integration.admin_support import (  # noqa: F401 (fixtures)
    add_occurrence,
    login,
    make_schedule,
    tenants,
    users,
)

pytestmark = pytest.mark.django_db

LIST = reverse("admin:django_app_schedule_changelist")
OCC_LIST = reverse("admin:django_app_occurrence_changelist")


def log_of(schedule: Any) -> list[tuple[str, str]]:
    from django.contrib.admin.models import LogEntry

    entries = LogEntry.objects.filter(object_id=str(schedule.pk)).order_by("action_time", "pk")
    return [(e.user.username, e.change_message) for e in entries]


def test_each_verb_is_written_to_the_admin_log(login: Any, make_schedule: Any) -> None:
    schedule = make_schedule(name="audited")
    client = login("acme")
    for verb in ("pause", "resume", "run_now"):
        url = reverse("admin:django_app_schedule_act", args=[schedule.pk, verb])
        assert client.post(url).status_code == 302
    # A replay must be of the current version of a live schedule (else it is refused).
    schedule.refresh_from_db()
    dead = add_occurrence(schedule, state="DEAD")
    client.post(OCC_LIST, {"action": "replay_selected", "_selected_action": [str(dead.pk)]})
    cancel = reverse("admin:django_app_schedule_act", args=[schedule.pk, "cancel"])
    assert client.post(cancel).status_code == 302

    log = log_of(schedule)
    assert [who for who, _ in log] == ["alice"] * 5
    messages = [message for _, message in log]
    assert messages[0].startswith("Paused: ")
    assert messages[1].startswith("Resumed: ")
    assert messages[2].startswith("Run now: manual occurrence ")
    assert messages[3] == f"Replayed DEAD occurrence {dead.pk}"
    assert messages[4].startswith("Canceled: ")
    history = client.get(reverse("admin:django_app_schedule_history", args=[schedule.pk]))
    assert "Run now: manual occurrence" in history.content.decode()


def test_a_refused_verb_is_not_logged(login: Any, make_schedule: Any) -> None:
    schedule = make_schedule()
    client = login("acme")
    client.post(reverse("admin:django_app_schedule_act", args=[schedule.pk, "cancel"]))
    client.post(reverse("admin:django_app_schedule_act", args=[schedule.pk, "resume"]))
    assert [m.split(":")[0] for _, m in log_of(schedule)] == ["Canceled"]


def test_the_api_trail_is_in_the_admin_for_the_tenant_only(login: Any, make_schedule: Any) -> None:
    from celery_scheduler import api

    own = make_schedule("acme", name="own")
    other = make_schedule("globex", name="other")
    api.pause_schedule(own.pk, actor="ops-bot", reason="maintenance window")
    api.pause_schedule(other.pk, actor="globex-bot", reason="their secret")
    client = login("acme")
    trail = reverse("admin:django_app_auditentry_changelist")
    html = client.get(trail, {"schedule__id__exact": str(own.pk)}).content.decode()
    assert "ops-bot" in html
    assert "maintenance window" in html
    everything = client.get(trail).content.decode()
    assert "globex-bot" not in everything  # another tenant's trail stays theirs
    change = client.get(reverse("admin:django_app_schedule_change", args=[own.pk]))
    assert f"{trail}?schedule__id__exact={own.pk}" in change.content.decode()
