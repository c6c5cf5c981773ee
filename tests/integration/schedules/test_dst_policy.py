"""The per-schedule DST policy through every entry point: the Python API (create, update,
describe, preview), the admin form and its live preview, the HTTP API and its OpenAPI
schema, and the preview command. Bad input is an error naming the field, with nothing
written; a policy change is a new version that re-plans only what replan.py allows.
"""

# ruff: noqa: F811

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from celery_scheduler import api, errors
from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.core.enums import OccurrenceState
from django_app.models import Occurrence, Schedule, ScheduleVersion
from django_app.wiring import materialize_due
from tests.integration.admin_support import login, tenants, users  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db

CRON = "0,30 1,2 * * *"
# 25 October 2026, Europe/Berlin: 02:00-02:59 happens twice (CEST at 00:00Z, CET at 01:00Z).
FALL_EVE = datetime(2026, 10, 24, 22, 0, tzinfo=UTC)


def _create(clock: FrozenClock | None = None, **values: Any) -> Schedule:
    values.setdefault("cron", CRON)
    values.setdefault("timezone", "Europe/Berlin")
    return api.create_schedule(name="dst", task="billing.ping", clock=clock, **values)


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"dst_gap": "later"}, "dst_gap"),
        ({"dst_fold": "twice"}, "dst_fold"),
        ({"dst_fold": 2}, "dst_fold"),
        ({"cron": None, "interval": 60, "dst_gap": "SHIFT"}, "dst_gap"),
        ({"cron": None, "interval": 60, "dst_fold": "BOTH"}, "dst_fold"),
        (
            {"cron": None, "run_at": datetime(2099, 1, 1, tzinfo=UTC), "dst_fold": "SECOND"},
            "dst_fold",
        ),
    ],
)
def test_python_api_refuses_a_bad_policy_naming_the_field(
    values: dict[str, Any], field: str
) -> None:
    with pytest.raises(errors.InvalidPolicy) as caught:
        _create(**values)
    assert caught.value.field == field
    assert Schedule.objects.count() == 0
    assert ScheduleVersion.objects.count() == 0


def test_policy_is_stored_on_the_schedule_and_its_version_in_any_case() -> None:
    schedule = _create(dst_gap="shift", dst_fold="Both")
    assert (schedule.dst_gap, schedule.dst_fold) == ("SHIFT", "BOTH")
    version = ScheduleVersion.objects.get(schedule=schedule)
    assert (version.dst_gap, version.dst_fold) == ("SHIFT", "BOTH")
    interval = api.create_schedule(name="i", task="billing.ping", interval=60)
    assert (interval.dst_gap, interval.dst_fold) == ("SKIP", "FIRST")


def test_describe_shows_the_policy_and_marks_the_runs_it_makes() -> None:
    clock = FrozenClock(FALL_EVE)
    schedule = _create(clock=clock, dst_fold="BOTH")
    described = api.describe_schedule(schedule.id, next_count=6, clock=clock)
    assert (described.schedule.dst_gap, described.schedule.dst_fold) == ("SKIP", "BOTH")
    assert described.current_version is not None
    assert described.current_version.dst_fold == "BOTH"
    times = [(f.utc.strftime("%d %H:%M"), f.note) for f in described.next_fire_times]
    assert [t for t, _ in times] == ["24 23:00", "24 23:30", "25 00:00", "25 00:30", "25 01:00",
                                    "25 01:30"]  # fmt: skip
    assert "the first run (dst_fold=BOTH)" in times[2][1]
    assert "the second run (dst_fold=BOTH)" in times[4][1]


def test_a_policy_change_is_a_new_version_that_never_repeats_a_taken_time() -> None:
    """FIRST -> BOTH in the middle of the repeated hour: 02:00 CEST ran (00:00Z) and stays
    the only run of that instant; 02:30 CEST and the CET pass are planned under v2."""
    clock = FrozenClock(FALL_EVE)
    schedule = _create(clock=clock)
    clock.set(datetime(2026, 10, 25, 0, 5, tzinfo=UTC))
    materialize_due(clock=clock)
    ran = Occurrence.objects.get(schedule=schedule, scheduled_for=clock.now().replace(minute=0))
    Occurrence.objects.filter(pk=ran.pk).update(
        state=OccurrenceState.SUCCEEDED.value, attempt_count=1
    )
    result = api.update_schedule(schedule.id, dst_fold="BOTH", clock=clock)
    assert result.version == 2
    version = ScheduleVersion.objects.get(schedule=schedule, version=2)
    assert version.dst_fold == "BOTH"
    clock.advance(timedelta(hours=2))
    materialize_due(clock=clock)
    v2 = Occurrence.objects.filter(schedule=schedule, schedule_version=2)
    times = sorted(t.strftime("%H:%M") for t in v2.values_list("scheduled_for", flat=True))
    assert times[:3] == ["00:30", "01:00", "01:30"]
    assert not v2.filter(scheduled_for=ran.scheduled_for).exists()


def test_switching_a_cron_to_an_interval_drops_its_policy() -> None:
    schedule = _create(dst_gap="SHIFT", dst_fold="SECOND")
    api.update_schedule(schedule.id, interval=600)
    schedule.refresh_from_db()
    assert (schedule.kind, schedule.dst_gap, schedule.dst_fold) == ("INTERVAL", "SKIP", "FIRST")


def test_a_new_cron_keeps_its_policy_whatever_the_other_triggers_say() -> None:
    """Only a trigger that is given (an interval or a run_at, not None) drops the policy:
    ``interval=None`` beside a new cron (HTTP's null, sync's absent triggers) kept nothing
    of it. Seen failing: SKIP/FIRST after the update; sync flipping it at every run."""
    schedule = _create(dst_gap="SHIFT", dst_fold="BOTH")
    api.update_schedule(schedule.id, cron="*/5 * * * *", interval=None, run_at=None)
    schedule.refresh_from_db()
    assert (schedule.cron, schedule.dst_gap, schedule.dst_fold) == ("*/5 * * * *", "SHIFT", "BOTH")

    item = {"name": "dst", "task": "billing.ping", "timezone": "Europe/Berlin",
            "dst_gap": "SHIFT", "dst_fold": "BOTH", "idempotency_key": "nightly"}  # fmt: skip
    api.sync_schedules([{**item, "cron": CRON}])
    synced = Schedule.objects.get(idempotency_key="nightly")
    api.sync_schedules([{**item, "cron": "15 3 * * *"}])
    synced.refresh_from_db()
    assert (synced.dst_gap, synced.dst_fold, synced.version) == ("SHIFT", "BOTH", 2)
    api.sync_schedules([{**item, "cron": "15 3 * * *"}])  # the same again: nothing changes
    synced.refresh_from_db()
    assert (synced.dst_gap, synced.dst_fold, synced.version) == ("SHIFT", "BOTH", 2)


def test_pure_preview_takes_the_policy() -> None:
    rows = api.preview(
        cron=CRON, timezone="Europe/Berlin", dst_gap="SHIFT",
        start=datetime(2026, 3, 29, 0, 15, tzinfo=UTC), count=2,
    )  # fmt: skip
    assert [r.utc.strftime("%H:%M") for r in rows] == ["00:30", "01:00"]
    assert "(dst_gap=SHIFT)" in rows[1].note
    with pytest.raises(errors.InvalidPolicy) as caught:
        api.preview(interval=60, dst_gap="SHIFT")
    assert caught.value.field == "dst_gap"


def test_preview_command_takes_the_policy_and_names_a_bad_option() -> None:
    out = StringIO()
    call_command(
        "preview_schedule", CRON, "--tz", "Europe/Berlin", "--dst-fold", "SECOND",
        "--start", "2026-10-25T00:45+00:00", "--count", "2", "--json", stdout=out,
    )  # fmt: skip
    payload = json.loads(out.getvalue())
    assert payload["dst_fold"] == "SECOND"
    assert [r["utc"][11:16] for r in payload["runs"]] == ["01:00", "01:30"]
    assert "dst_fold=SECOND" in payload["runs"][0]["note"]
    with pytest.raises(CommandError, match="--dst-gap: dst_gap 'later'"):
        call_command("preview_schedule", CRON, "--dst-gap", "later")


PREVIEW = reverse("admin:django_app_schedule_preview")
ADD = reverse("admin:django_app_schedule_add")


def test_admin_preview_marks_the_shifted_run_and_names_a_bad_policy(login: Any) -> None:
    client = login("root")
    params = {
        "kind": "CRON", "cron": CRON, "timezone": "Europe/Berlin", "dst_gap": "SHIFT",
        "dst_fold": "FIRST", "from": "2026-03-29 00:00",
    }  # fmt: skip
    body = client.get(PREVIEW, params).json()
    assert body["ok"] is True
    assert "dst_gap=SHIFT" in body["description"]
    shifted = [r for r in body["rows"] if "dst_gap=SHIFT" in r["note"]]
    assert [r["utc"] for r in shifted] == ["2026-03-29T01:00:00+00:00"]
    response = client.get(PREVIEW, {**params, "dst_gap": "later"})
    assert response.status_code == 400
    assert "dst_gap" in response.json()["errors"]


def test_admin_form_saves_the_policy_and_refuses_a_bad_one(login: Any) -> None:
    from tests.integration.admin.test_admin_schedules import form_data

    client = login("acme")
    response = client.post(ADD, form_data(dst_gap="later"))
    assert response.status_code == 200
    assert "dst_gap" in response.context["adminform"].form.errors
    assert Schedule.objects.count() == 0
    client.post(ADD, form_data(dst_gap="SHIFT", dst_fold="BOTH"))
    assert Schedule.objects.values_list("dst_gap", "dst_fold").get() == ("SHIFT", "BOTH")
