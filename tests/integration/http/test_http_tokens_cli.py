"""Tokens from the admin and ``manage.py scheduler_token``; ``manage.py schedules`` reads."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from celery_scheduler import api, errors
from django_app.http import tokens
from django_app.models import ApiToken, AuditEntry, Occurrence, Schedule, Tenant

pytestmark = pytest.mark.django_db

CREATE: dict[str, Any] = {"name": "nightly report", "task": "billing.ping", "cron": "*/10 * * * *"}


def run(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def fails(*args: str) -> CommandError:
    with pytest.raises(CommandError) as caught:
        run(*args)
    return caught.value


def test_scheduler_token_create_list_revoke() -> None:
    api.create_tenant("acme")
    out, err = run("scheduler_token", "create", "--tenant", "acme", "--name", "ci")
    secret = out.strip()
    assert secret.startswith("cs_")
    assert "shown once" in err
    stored = ApiToken.objects.get()
    assert stored.name == "ci"
    assert secret.split(".")[1] not in stored.digest
    assert tokens.check(secret) == stored
    listed = json.loads(run("scheduler_token", "list", "--json")[0])
    assert [(r["prefix"], r["tenant"], r["revoked"]) for r in listed] == [
        (stored.prefix, "acme", False)
    ]
    assert secret not in json.dumps(listed)
    assert "revoked" in run("scheduler_token", "revoke", stored.prefix)[0]
    assert tokens.check(secret) is None
    unknown = fails("scheduler_token", "create", "--tenant", "nobody")
    assert unknown.returncode == 2
    assert "--tenant" in str(unknown)
    assert fails("scheduler_token", "revoke", "cs_ffffffff").returncode == 2


def test_a_token_for_the_default_tenant_creates_it_like_a_schedule_would() -> None:
    out, _ = run("scheduler_token", "create", "--tenant", "default")
    assert tokens.check(out.strip()) is not None
    assert Tenant.objects.filter(slug="default").exists()


def test_update_with_an_expected_version_is_conditional() -> None:
    s = api.create_schedule(**CREATE)
    assert api.update_schedule(s.id, expected_version=1, name="renamed").version == 2
    with pytest.raises(errors.VersionConflict):
        api.update_schedule(s.id, expected_version=1, name="lost update")
    assert Schedule.objects.get(pk=s.id).name == "renamed"


def test_admin_creates_a_token_shown_once_and_revokes_it() -> None:
    api.create_tenant("acme")
    root = User.objects.create_superuser("root", "root@example.com", "pw")
    client = Client()
    client.force_login(root)
    tenant_id = str(Tenant.objects.get(slug="acme").pk)
    reply = client.post(
        "/admin/django_app/apitoken/add/", {"tenant": tenant_id, "name": "dash"}, follow=True
    )
    shown = [str(m) for m in reply.context["messages"]]
    secret = next(w for m in shown for w in m.split() if w.startswith("cs_"))
    token = ApiToken.objects.get()
    assert tokens.check(secret) == token
    page = client.get(f"/admin/django_app/apitoken/{token.pk}/change/").content.decode()
    assert secret.split(".")[1] not in page
    client.post(
        "/admin/django_app/apitoken/",
        {"action": "revoke", "_selected_action": [token.pk]},
    )
    assert tokens.check(secret) is None
    member = User.objects.create_user("ann", is_staff=True)
    client.force_login(member)
    assert client.get("/admin/django_app/apitoken/").status_code in (302, 403)


def test_schedules_list_describe_backfill_commands() -> None:
    api.create_tenant("acme")
    made = [api.create_schedule(tenant="acme", **{**CREATE, "name": f"job {n}"}) for n in range(3)]
    out, _ = run("schedules", "list", "--tenant", "acme", "--limit", "2", "--json")
    page = json.loads(out)
    assert len(page["items"]) == 2
    assert page["next_cursor"]
    rest = json.loads(run("schedules", "list", "--cursor", page["next_cursor"], "--json")[0])
    assert {i["id"] for i in page["items"] + rest["items"]} == {str(s.id) for s in made}
    table, _ = run("schedules", "list", "--name-contains", "JOB 1")
    assert "job 1" in table
    assert "job 2" not in table

    described = json.loads(
        run("schedules", "describe", str(made[0].id), "--next", "2", "--json")[0]
    )
    assert described["schedule"]["id"] == str(made[0].id)
    assert len(described["next_fire_times"]) == 2
    text, _ = run("schedules", "describe", str(made[0].id))
    assert "job 0" in text
    assert "next:" in text

    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=2)
    args = ("schedules", "backfill", str(made[0].id), "--start", hour.isoformat(),
            "--end", (hour + timedelta(minutes=30)).isoformat())  # fmt: skip
    report = json.loads(run(*args, "--reason", "outage OPS-9", "--json")[0])
    assert report["fire_times"] == 3
    assert len(report["created"]) == 3
    assert "3 already backfilled" in run(*args)[0]
    assert Occurrence.objects.filter(schedule=made[0]).count() == 3
    trail = AuditEntry.objects.filter(schedule=made[0], action="backfill").order_by("at", "pk")
    assert [(e.actor, e.reason, e.detail["created"]) for e in trail] == [
        ("manage.py schedules", "outage OPS-9", 3),
        ("manage.py schedules", "", 0),
    ]


@pytest.mark.parametrize(
    ("args", "code", "names"),
    [
        (("schedules", "list", "--state", "SLEEPING"), 2, "--state"),
        (("schedules", "list", "--cursor", "garbage"), 2, "--cursor: cursor is not a next_cursor"),
        (("schedules", "list", "--limit", "0"), 2, "--limit"),
        (("schedules", "list", "--next-run-before", "2030-01-01T00:00"), 2, "--next-run-before"),
        (("schedules", "list", "--tenant", "nobody"), 2, "--tenant"),
        (("schedules", "describe", "not-a-uuid"), 1, "No schedule"),
        (("schedules", "describe", "00000000-0000-0000-0000-000000000000"), 1, "No schedule"),
        (("schedules", "describe", "{id}", "--next", "0"), 2, "--next"),
        (("schedules", "describe", "{id}", "--tenant", "other"), 1, "No schedule"),
        (("schedules", "backfill", "{id}", "--start", "x", "--end", "y"), 2, "--start"),
        (
            ("schedules", "backfill", "{id}", "--start", "2020-01-01T00:00:00+00:00",
             "--end", "2020-01-02T00:00:00+00:00", "--reason", "r" * 2001),
            2, "--reason",
        ),
        (
            ("schedules", "backfill", "{id}", "--start", "2020-01-02T00:00:00+00:00",
             "--end", "2020-01-01T00:00:00+00:00"),
            2, "--end",
        ),
    ],
)  # fmt: skip
def test_schedules_command_errors_name_the_option_with_an_exit_code(
    args: tuple[str, ...], code: int, names: str
) -> None:
    api.create_tenant("other")
    sid = str(api.create_schedule(**CREATE).id)
    error = fails(*(a.replace("{id}", sid) for a in args))
    assert error.returncode == code, str(error)
    assert names in str(error)
    assert Schedule.objects.count() == 1
    assert Occurrence.objects.count() == 0
