"""Tenant isolation and Django permissions in the admin: every rule, and forged requests."""

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
PREVIEW = reverse("admin:django_app_schedule_preview")
OVERVIEW = reverse("admin:django_app_overview")


@pytest.fixture
def two(make_schedule: Any) -> dict[str, Any]:
    acme = make_schedule("acme", name="acme-job")
    globex = make_schedule("globex", name="globex-job")
    return {
        "acme": acme,
        "globex": globex,
        "acme_occ": add_occurrence(acme, state="DEAD"),
        "globex_occ": add_occurrence(globex, state="DEAD"),
    }


def names(response: Any) -> set[str]:
    return {s.name for s in response.context["cl"].result_list}


class TestVisibility:
    def test_tenant_user_lists_only_own_schedules(self, login: Any, two: Any) -> None:
        assert names(login("acme").get(LIST)) == {"acme-job"}
        assert names(login("globex").get(LIST)) == {"globex-job"}
        assert names(login("root").get(LIST)) == {"acme-job", "globex-job"}

    def test_search_and_filters_do_not_leak(self, login: Any, two: Any) -> None:
        client = login("acme")
        assert names(client.get(LIST, {"q": "globex"})) == set()
        assert names(client.get(LIST, {"tenant__id__exact": two["globex"].tenant_id})) == set()
        task_filter = client.get(LIST).context["cl"].filter_specs
        assert all("globex" not in str(getattr(f, "lookup_choices", "")) for f in task_filter)

    def test_foreign_detail_pages_are_404(self, login: Any, two: Any) -> None:
        client = login("acme")
        other = two["globex"]
        for url in (
            reverse("admin:django_app_schedule_change", args=[other.pk]),
            reverse("admin:django_app_schedule_history", args=[other.pk]),
            reverse("admin:django_app_occurrence_change", args=[two["globex_occ"].pk]),
        ):
            assert client.get(url).status_code == 404, url
        own = reverse("admin:django_app_schedule_change", args=[two["acme"].pk])
        assert client.get(own).status_code == 200

    def test_occurrence_list_scoped(self, login: Any, two: Any) -> None:
        response = login("acme").get(OCC_LIST)
        assert {o.pk for o in response.context["cl"].result_list} == {two["acme_occ"].pk}
        # Filtering by another tenant's schedule id yields nothing, not its history.
        foreign = login("acme").get(OCC_LIST, {"schedule": str(two["globex"].pk)})
        assert list(foreign.context["cl"].result_list) == []

    def test_attempt_detail_scoped(self, login: Any, two: Any) -> None:
        from django_app.models import Attempt

        attempt = Attempt.objects.create(
            occurrence=two["globex_occ"], number=1, fencing_token=7, worker="w1@host",
            started_at=two["globex_occ"].scheduled_for, outcome="FAILED", error="boom",
        )  # fmt: skip
        url = reverse("admin:django_app_attempt_change", args=[attempt.pk])
        assert login("acme").get(url).status_code == 404
        page = login("globex").get(url)
        assert page.status_code == 200
        assert "w1@host" in page.content.decode()
        assert "boom" in page.content.decode()

    def test_preview_of_foreign_schedule_is_404(self, login: Any, two: Any) -> None:
        client = login("acme")
        assert client.get(PREVIEW, {"schedule": str(two["globex"].pk)}).status_code == 404
        assert client.get(PREVIEW, {"schedule": str(two["acme"].pk)}).json()["ok"]

    def test_overview_counts_only_own_tenant(self, login: Any, two: Any) -> None:
        stats = login("acme").get(OVERVIEW).context["stats"]
        assert stats.dead_total == 1
        assert login("root").get(OVERVIEW).context["stats"].dead_total == 2

    def test_user_without_tenant_sees_nothing_and_cannot_add(self, login: Any, two: Any) -> None:
        client = login("loner")
        assert client.get(LIST).status_code == 403
        assert client.get(reverse("admin:django_app_schedule_add")).status_code == 403
        assert client.get(PREVIEW, {"cron": "* * * * *"}).status_code == 403
        assert client.get(OVERVIEW).status_code == 403

    def test_tenant_admin_is_superuser_only(self, login: Any, two: Any) -> None:
        url = reverse("admin:django_app_tenant_changelist")
        assert login("acme").get(url).status_code == 403
        assert login("root").get(url).status_code == 200
        index = login("acme").get(reverse("admin:index")).content.decode()
        assert "Tenants" not in index
        assert "Schedules" in index


def test_a_tenants_slug_is_set_once(login: Any, tenants: Any) -> None:
    """Waiters for a tenant's max_running are found by a reason naming its slug, so a slug
    renamed in the admin (the HTTP API refuses it) let newer runs pass the older waiters."""
    from django_app.models import Tenant

    acme = tenants["acme"]
    url = reverse("admin:django_app_tenant_change", args=[acme.pk])
    client = login("root")
    form = {
        "slug": "renamed", "name": "Acme", "relay_weight": "1",
        "members-TOTAL_FORMS": "0", "members-INITIAL_FORMS": "0",
    }  # fmt: skip
    response = client.post(url, form)
    assert response.status_code == 302, response.content.decode()[:2000]
    assert Tenant.objects.get(pk=acme.pk).slug == "acme"
    add = client.post(reverse("admin:django_app_tenant_add"), {**form, "slug": "initech"})
    assert add.status_code == 302
    assert Tenant.objects.filter(slug="initech").exists()


class TestForgedWrites:
    @pytest.mark.parametrize(
        "action", ["pause_selected", "resume_selected", "cancel_selected", "run_selected_now"]
    )
    def test_bulk_action_on_foreign_schedule_is_403_and_changes_nothing(
        self, login: Any, two: Any, action: str
    ) -> None:
        from django_app.models import Occurrence

        other = two["globex"]
        before = (other.state, other.version, Occurrence.objects.count())
        response = login("acme").post(
            LIST,
            {"action": action, "_selected_action": [str(two["acme"].pk), str(other.pk)]},
        )
        assert response.status_code == 403
        other.refresh_from_db()
        two["acme"].refresh_from_db()
        assert (other.state, other.version, Occurrence.objects.count()) == before
        assert two["acme"].version == 1  # refused as a whole, not half-applied

    @pytest.mark.parametrize("verb", ["pause", "resume", "cancel", "run_now"])
    def test_button_post_on_foreign_schedule_is_404(self, login: Any, two: Any, verb: str) -> None:
        other = two["globex"]
        url = reverse("admin:django_app_schedule_act", args=[other.pk, verb])
        assert login("acme").post(url).status_code == 404
        other.refresh_from_db()
        assert (other.state, other.version) == ("ACTIVE", 1)

    def test_forged_edit_of_foreign_schedule_is_404(self, login: Any, two: Any) -> None:
        other = two["globex"]
        url = reverse("admin:django_app_schedule_change", args=[other.pk])
        response = login("acme").post(url, {"name": "hijacked", "cron": "* * * * *"})
        assert response.status_code == 404
        other.refresh_from_db()
        assert (other.name, other.version) == ("globex-job", 1)

    def test_forged_replay_of_foreign_occurrence_is_403(self, login: Any, two: Any) -> None:
        occ = two["globex_occ"]
        response = login("acme").post(
            OCC_LIST, {"action": "replay_selected", "_selected_action": [str(occ.pk)]}
        )
        assert response.status_code == 403
        occ.refresh_from_db()
        assert occ.state == "DEAD"

    def test_malformed_selected_id_is_403(self, login: Any, two: Any) -> None:
        response = login("acme").post(
            LIST, {"action": "pause_selected", "_selected_action": ["not-a-uuid"]}
        )
        assert response.status_code == 403


class TestModelPermissions:
    def test_view_only_user_sees_but_cannot_act(self, login: Any, two: Any) -> None:
        client = login("viewer")
        page = client.get(LIST)
        assert page.status_code == 200
        assert "pause_selected" not in page.content.decode()
        response = client.post(
            LIST, {"action": "pause_selected", "_selected_action": [str(two["acme"].pk)]}
        )
        two["acme"].refresh_from_db()
        assert two["acme"].state == "ACTIVE"
        assert response.status_code in (200, 302)
        act_url = reverse("admin:django_app_schedule_act", args=[two["acme"].pk, "pause"])
        assert client.post(act_url).status_code == 403
        change = client.get(reverse("admin:django_app_schedule_change", args=[two["acme"].pk]))
        assert change.status_code == 200
        assert 'data-verb="pause"' not in change.content.decode()
        assert client.get(reverse("admin:django_app_schedule_add")).status_code == 403

    def test_view_only_user_cannot_replay(self, login: Any, two: Any) -> None:
        client = login("viewer")
        page = client.get(OCC_LIST, {"state__exact": "DEAD"})
        assert "replay_selected" not in page.content.decode()
        client.post(
            OCC_LIST,
            {"action": "replay_selected", "_selected_action": [str(two["acme_occ"].pk)]},
        )
        two["acme_occ"].refresh_from_db()
        assert two["acme_occ"].state == "DEAD"

    def test_occurrences_cannot_be_edited_or_deleted(self, login: Any, two: Any) -> None:
        occ = two["acme_occ"]
        client = login("root")
        change = reverse("admin:django_app_occurrence_change", args=[occ.pk])
        client.post(change, {"state": "SUCCEEDED"})
        occ.refresh_from_db()
        assert occ.state == "DEAD"
        delete = reverse("admin:django_app_occurrence_delete", args=[occ.pk])
        assert client.post(delete, {"post": "yes"}).status_code == 403
        assert client.get(reverse("admin:django_app_occurrence_add")).status_code == 403
