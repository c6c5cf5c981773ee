"""The schedule admin through Django's test client: form, list, actions, messages."""

# The fixtures are imported from admin_support, so their parameters shadow the imports.
# ruff: noqa: F811

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse

from tests.integration.admin_support import (  # noqa: F401 (fixtures)
    TASK,
    add_occurrence,
    login,
    make_schedule,
    tenants,
    users,
)

pytestmark = pytest.mark.django_db(transaction=False)

ADD = reverse("admin:django_app_schedule_add")
LIST = reverse("admin:django_app_schedule_changelist")


def change_url(schedule: Any) -> str:
    return reverse("admin:django_app_schedule_change", args=[schedule.pk])


def form_data(**overrides: Any) -> dict[str, Any]:
    data = {
        "name": "nightly report",
        "task": TASK,
        "args": "[]",
        "kwargs": "{}",
        "kind": "CRON",
        "cron": "30 2 * * *",
        "timezone": "Europe/Berlin",
        "interval_seconds": "",
        "run_at_0": "",
        "run_at_1": "",
        "start_at_0": "",
        "start_at_1": "",
        "end_at_0": "",
        "end_at_1": "",
        "misfire_policy": "SKIP",
        "max_lateness_seconds": "300",
        "catchup_cap": "10",
        "overlap_policy": "ALLOW",
        "flexible_window_seconds": "0",
        "concurrency_limit": "",
        "concurrency_group": "",
        "max_attempts": "",
        "deadline_seconds": "",
        "queue": "",
        "priority": "0",
    }
    data.update(overrides)
    return data


def messages_of(response: Any) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def edit_data(schedule: Any, **overrides: Any) -> dict[str, Any]:
    base = {"name": schedule.name, "cron": schedule.cron, "timezone": schedule.timezone}
    return form_data(**{**base, **overrides})


class TestCreate:
    def test_add_page_renders_task_choices_zones_and_preview(self, login: Any) -> None:
        page = login("acme").get(ADD)
        assert page.status_code == 200
        html = page.content.decode()
        assert f'<option value="{TASK}">' in html
        assert '<option value="Europe/Berlin">' in html  # the zone datalist
        assert 'id="cs-preview"' in html
        assert reverse("admin:django_app_schedule_preview") in html
        assert 'name="tenant"' not in html  # tenant users never pick a tenant

    def test_tenant_user_creates_in_own_tenant(self, login: Any, tenants: Any) -> None:
        from django_app.models import Schedule

        response = login("acme").post(ADD, form_data())
        assert response.status_code == 302, response.content.decode()[:2000]
        schedule = Schedule.objects.get()
        assert schedule.tenant == tenants["acme"]
        assert (schedule.kind, schedule.cron, schedule.timezone) == (
            "CRON", "30 2 * * *", "Europe/Berlin",
        )  # fmt: skip
        assert schedule.version == 1
        assert schedule.next_run_at is not None

    def test_tenant_field_in_post_is_ignored_for_tenant_user(
        self, login: Any, tenants: Any
    ) -> None:
        from django_app.models import Schedule

        login("acme").post(ADD, form_data(tenant=tenants["globex"].pk))
        assert Schedule.objects.get().tenant == tenants["acme"]

    def test_superuser_picks_tenant(self, login: Any, tenants: Any) -> None:
        from django_app.models import Schedule

        client = login("root")
        assert 'name="tenant"' in client.get(ADD).content.decode()
        response = client.post(ADD, form_data(tenant=tenants["globex"].pk))
        assert response.status_code == 302
        assert Schedule.objects.get().tenant == tenants["globex"]

    @pytest.mark.parametrize(
        ("overrides", "field", "text"),
        [
            ({"cron": "61 * * * *"}, "cron", "out of range"),
            ({"cron": "0 0 30 2 *"}, "cron", "never fires"),
            ({"timezone": "Europe/Berln"}, "timezone", "Europe/Berlin"),
            ({"task": "billing.nope"}, "task", "Select a valid choice"),
            ({"args": '{"a": 1}'}, "args", "JSON list"),
            ({"kwargs": "[1]"}, "kwargs", "JSON object"),
            ({"kwargs": "{not json"}, "kwargs", "valid JSON"),
            ({"flexible_window_seconds": "999999"}, "flexible_window_seconds", "between"),
            ({"misfire_policy": "CATCH_UP", "catchup_cap": "0"}, "catchup_cap", "catchup_cap"),
            ({"kind": "INTERVAL", "interval_seconds": ""}, "interval_seconds", "Required"),
        ],
    )
    def test_errors_land_on_their_field_and_nothing_is_saved(
        self, login: Any, overrides: dict[str, str], field: str, text: str
    ) -> None:
        from django_app.models import Schedule

        response = login("acme").post(ADD, form_data(**overrides))
        assert response.status_code == 200
        errors = response.context["adminform"].form.errors
        assert field in errors, errors
        assert text in " ".join(errors[field])
        assert Schedule.objects.count() == 0

    def test_interval_and_one_off_kinds(self, login: Any) -> None:
        from django_app.models import Schedule

        client = login("acme")
        client.post(ADD, form_data(name="every", kind="INTERVAL", interval_seconds="90", cron=""))
        client.post(
            ADD,
            form_data(
                name="once", kind="ONE_OFF", cron="", run_at_0="2099-01-01", run_at_1="10:00:00"
            ),
        )
        kinds = dict(Schedule.objects.values_list("name", "kind"))
        assert kinds == {"every": "INTERVAL", "once": "ONE_OFF"}
        assert Schedule.objects.get(name="every").interval_seconds == 90


class TestEdit:
    def test_change_bumps_version_and_reports_invalidation(
        self, login: Any, make_schedule: Any
    ) -> None:
        schedule = make_schedule(cron="0 * * * *")
        pending = add_occurrence(schedule, state="SCHEDULED", minutes_ago=-30, lag=None)
        response = login("acme").post(
            change_url(schedule), edit_data(schedule, cron="15 * * * *"), follow=True
        )
        schedule.refresh_from_db()
        pending.refresh_from_db()
        assert (schedule.version, schedule.cron) == (2, "15 * * * *")
        assert pending.state == "CANCELED"
        text = " ".join(messages_of(response))
        assert "is now version 2" in text
        assert "1 pending occurrence invalidated" in text

    def test_unchanged_save_keeps_version(self, login: Any, make_schedule: Any) -> None:
        schedule = make_schedule(cron="0 * * * *", timezone="UTC")
        response = login("acme").post(change_url(schedule), edit_data(schedule), follow=True)
        schedule.refresh_from_db()
        assert schedule.version == 1
        assert "version stays the same" in " ".join(messages_of(response))

    def test_a_save_without_the_dst_fields_keeps_the_stored_policy(
        self, login: Any, make_schedule: Any
    ) -> None:
        """A POST that leaves dst_gap/dst_fold out (a script written before they existed)
        changes nothing of them: it reset a SHIFT/BOTH schedule to SKIP/FIRST."""
        schedule = make_schedule(cron="30 2 * * *", timezone="Europe/Berlin",
                                 dst_gap="SHIFT", dst_fold="BOTH")  # fmt: skip
        data = {k: v for k, v in edit_data(schedule).items() if k not in ("dst_gap", "dst_fold")}
        response = login("acme").post(change_url(schedule), data)
        assert response.status_code == 302, response.content.decode()[:2000]
        schedule.refresh_from_db()
        assert (schedule.dst_gap, schedule.dst_fold, schedule.version) == ("SHIFT", "BOTH", 1)

    def test_the_audit_trail_names_the_admin_user_of_a_create_and_an_edit(
        self, login: Any, make_schedule: Any
    ) -> None:
        """Admin actions recorded admin:<user>; a form's create and edit recorded no actor."""
        from django_app.models import AuditEntry, Schedule

        client = login("acme")
        assert client.post(ADD, form_data()).status_code == 302
        schedule = Schedule.objects.get()
        response = client.post(change_url(schedule), edit_data(schedule, cron="15 * * * *"))
        assert response.status_code == 302, response.content.decode()[:2000]
        trail = AuditEntry.objects.filter(schedule_id=schedule.id).order_by("id")
        assert list(trail.values_list("action", "actor")) == [
            ("create", "admin:alice"), ("update", "admin:alice"),
        ]  # fmt: skip

    def test_edit_error_changes_nothing(self, login: Any, make_schedule: Any) -> None:
        schedule = make_schedule(cron="0 * * * *")
        response = login("acme").post(change_url(schedule), edit_data(schedule, cron="0 25 * * *"))
        assert response.status_code == 200
        assert "cron" in response.context["adminform"].form.errors
        schedule.refresh_from_db()
        assert (schedule.version, schedule.cron) == (1, "0 * * * *")

    def test_change_page_shows_buttons_for_state_and_history(
        self, login: Any, make_schedule: Any
    ) -> None:
        schedule = make_schedule()
        add_occurrence(schedule, state="DEAD", error="ValueError: bad customer")
        html = login("acme").get(change_url(schedule)).content.decode()
        assert 'data-verb="pause"' in html
        assert 'data-verb="run_now"' in html
        assert 'data-verb="resume"' not in html
        assert "All 1 occurrences" in html
        assert 'data-state="DEAD"' in html

    def test_no_delete(self, login: Any, make_schedule: Any) -> None:
        schedule = make_schedule()
        url = reverse("admin:django_app_schedule_delete", args=[schedule.pk])
        assert login("root").post(url, {"post": "yes"}).status_code == 403
        schedule.refresh_from_db()


class TestList:
    def test_columns_filters_and_search(self, login: Any, make_schedule: Any) -> None:
        berlin = make_schedule(name="berlin nightly", cron="30 2 * * *", timezone="Europe/Berlin")
        make_schedule(name="other", cron="0 * * * *", misfire_policy="FIRE_ONCE")
        add_occurrence(berlin, state="SUCCEEDED", lag=7.5)
        client = login("acme")
        html = client.get(LIST).content.decode()
        assert "berlin nightly" in html
        assert "other" in html
        assert "At 02:30" in html  # cron-descriptor rendering
        assert "CET" in html or "CEST" in html  # next run in local time...
        assert "UTC</small>" in html  # ...with UTC underneath
        assert "7.50 s" in html
        assert "cs-lag-bad" in html
        assert 'data-state="SUCCEEDED"' in html
        searched = client.get(LIST, {"q": "berlin"}).content.decode()
        assert "berlin nightly" in searched
        assert ">other<" not in searched
        by_policy = client.get(LIST, {"misfire_policy__exact": "FIRE_ONCE"})
        assert [s.name for s in by_policy.context["cl"].result_list] == ["other"]
        by_task = client.get(LIST, {"task": TASK})
        assert by_task.context["cl"].result_count == 2
        by_state = client.get(LIST, {"state__exact": "PAUSED"})
        assert by_state.context["cl"].result_count == 0

    def test_tenant_column_and_filter_only_for_superuser(
        self, login: Any, make_schedule: Any
    ) -> None:
        make_schedule()
        tenant_page = login("acme").get(LIST)
        assert "tenant_column" not in tenant_page.context["cl"].list_display
        root_page = login("root").get(LIST)
        assert "tenant_column" in root_page.context["cl"].list_display
        assert "tenant__id__exact" in root_page.content.decode()


def act(client: Any, action: str, *schedules: Any, follow: bool = True) -> Any:
    return client.post(
        LIST,
        {"action": action, "_selected_action": [str(s.pk) for s in schedules]},
        follow=follow,
    )


class TestActions:
    def test_bulk_pause_reports_api_result(self, login: Any, make_schedule: Any) -> None:
        a, b = make_schedule(name="a"), make_schedule(name="b")
        add_occurrence(a, state="SCHEDULED", minutes_ago=-10, lag=None)
        add_occurrence(a, state="RUNNING", minutes_ago=1)
        response = act(login("acme"), "pause_selected", a, b)
        a.refresh_from_db()
        b.refresh_from_db()
        assert (a.state, b.state) == ("PAUSED", "PAUSED")
        assert (a.version, b.version) == (2, 2)
        text = " ".join(messages_of(response))
        assert "2 schedules paused" in text
        assert "a: paused (version 2), 1 pending occurrence invalidated, 1 still running" in text

    def test_resume_and_cancel(self, login: Any, make_schedule: Any) -> None:
        schedule = make_schedule()
        client = login("acme")
        act(client, "pause_selected", schedule)
        response = act(client, "resume_selected", schedule)
        schedule.refresh_from_db()
        assert schedule.state == "ACTIVE"
        assert "1 schedule resumed" in " ".join(messages_of(response))
        response = act(client, "cancel_selected", schedule)
        schedule.refresh_from_db()
        assert schedule.state == "CANCELED"
        assert "1 schedule canceled" in " ".join(messages_of(response))

    def test_refused_transition_is_a_warning_not_a_success(
        self, login: Any, make_schedule: Any
    ) -> None:
        schedule = make_schedule()
        client = login("acme")
        act(client, "cancel_selected", schedule)
        response = act(client, "resume_selected", schedule)
        levels = [(m.level_tag, str(m)) for m in get_messages(response.wsgi_request)]
        assert len(levels) == 1
        assert levels[0][0] == "warning"
        assert "Could not resume" in levels[0][1]
        schedule.refresh_from_db()
        assert schedule.state == "CANCELED"

    def test_run_now_creates_manual_occurrence_and_outbox_row(
        self, login: Any, make_schedule: Any
    ) -> None:
        from django_app.models import Occurrence, OutboxEntry

        schedule = make_schedule()
        response = act(login("acme"), "run_selected_now", schedule)
        occurrence = Occurrence.objects.get(schedule=schedule)
        assert occurrence.manual
        assert OutboxEntry.objects.filter(occurrence=occurrence, sent_at__isnull=True).exists()
        text = " ".join(messages_of(response))
        assert "Queued 1 manual run" in text
        assert str(occurrence.pk)[:8] in text

    def test_change_page_buttons_post_the_same_verbs(self, login: Any, make_schedule: Any) -> None:
        schedule = make_schedule()
        client = login("acme")
        url = reverse("admin:django_app_schedule_act", args=[schedule.pk, "pause"])
        assert client.get(url).status_code == 405  # state changes are POST only
        response = client.post(url, follow=True)
        schedule.refresh_from_db()
        assert schedule.state == "PAUSED"
        assert response.redirect_chain[-1][0] == change_url(schedule)
        assert "1 schedule paused" in " ".join(messages_of(response))
        bad = reverse("admin:django_app_schedule_act", args=[schedule.pk, "explode"])
        assert client.post(bad).status_code == 403

    def test_actions_need_csrf(self, users: Any, make_schedule: Any) -> None:
        from django.test import Client

        schedule = make_schedule()
        client = Client(enforce_csrf_checks=True)
        client.force_login(users["acme"])
        url = reverse("admin:django_app_schedule_act", args=[schedule.pk, "pause"])
        assert client.post(url).status_code == 403
        assert act(client, "pause_selected", schedule, follow=False).status_code == 403
        schedule.refresh_from_db()
        assert schedule.state == "ACTIVE"
