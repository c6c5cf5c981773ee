"""The admin in a real browser: the operator's path, DST preview, and tenant isolation."""

# The fixtures are imported from admin_support, so their parameters shadow the imports.
# ruff: noqa: F811

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.integration.admin_support import (  # noqa: F401 (fixtures)
    PASSWORD,
    TASK,
    add_occurrence,
    make_schedule,
    tenants,
    users,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def log_in(page: Any, username: str) -> None:
    page.goto("/admin/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(re.compile(r"/admin/$"))


def test_create_fix_preview_pause_and_history(page: Any, users: Any, screenshot: Any) -> None:
    from playwright.sync_api import expect

    from django_app.models import Schedule

    log_in(page, "alice")
    preview_statuses: list[int] = []
    page.on(
        "response",
        lambda r: preview_statuses.append(r.status) if "/preview/" in r.url else None,
    )
    page.goto("/admin/django_app/schedule/add/")
    # A pristine form shows no error and asks the server nothing it would refuse.
    expect(page.locator("#cs-description")).to_contain_text("Type a cron expression")
    expect(page.locator(".errorlist")).to_have_count(0)
    expect(page.locator("#cs-preview-error")).to_be_hidden()
    page.wait_for_timeout(500)  # past the preview's 250 ms debounce
    assert preview_statuses == []  # nothing to preview yet: no request, no logged 400
    page.fill("#id_name", "nightly export")
    page.select_option("#id_task", TASK)
    page.fill("#id_timezone", "Europe/Ber")
    page.fill("#id_cron", "30 2 * * *")
    # A half-typed zone is flagged on the zone field as you type...
    expect(page.locator(".field-timezone .cs-live-error")).to_contain_text("Europe/Berlin")
    page.fill("#id_timezone", "Europe/Berlin")
    expect(page.locator(".field-timezone .cs-live-error")).to_have_count(0)
    page.fill("#id_cron", "30 25 * * *")

    # ...and so is a bad cron, on the cron field, not below the policies.
    expect(page.locator(".field-cron .cs-live-error")).to_contain_text("out of range")
    expect(page.locator("#cs-preview-error")).to_be_hidden()
    # ...and the server refuses the save, with the error on the cron field.
    page.click("input[name=_save]")
    expect(page.locator(".field-cron .errorlist")).to_contain_text("out of range")
    assert Schedule.objects.count() == 0

    page.fill("#id_cron", "30 2 * * *")
    page.fill("#cs-preview-from", "2026-03-27T00:00")
    rows = page.locator("#cs-preview-table tbody tr")
    expect(rows).to_have_count(10)
    expect(page.locator("#cs-description")).to_have_text("At 02:30 (Europe/Berlin)")
    expect(rows.nth(0)).to_contain_text("Fri 27 Mar 2026 02:30 CET")
    expect(rows.nth(0)).to_contain_text("2026-03-27 01:30 UTC")
    expect(rows.nth(1)).to_contain_text("Sat 28 Mar 2026 02:30 CET")
    # Sunday 29 March 02:30 does not exist in Berlin: the next run is Monday, marked.
    expect(rows.nth(2)).to_contain_text("Mon 30 Mar 2026 02:30 CEST")
    expect(rows.nth(2)).to_contain_text("2026-03-30 00:30 UTC")
    expect(rows.nth(2)).to_have_class(re.compile(r"\bcs-dst\b"))
    expect(rows.nth(2).locator(".cs-note")).to_contain_text("skipped")
    assert page.locator("#cs-preview-table tr.cs-dst").count() == 1
    screenshot("schedule_add_with_preview")

    page.click("input[name=_save]")
    page.wait_for_url(re.compile(r"/admin/django_app/schedule/$"))
    expect(page.locator(".messagelist")).to_contain_text("nightly export")
    schedule = Schedule.objects.get()
    assert (schedule.cron, schedule.timezone, schedule.version) == (
        "30 2 * * *",
        "Europe/Berlin",
        1,
    )

    row = page.locator("#result_list tbody tr", has_text="nightly export")
    expect(row.locator(".cs-badge")).to_have_text("Active")
    row.locator("input.action-select").check()
    page.select_option("select[name=action]", "pause_selected")
    page.click("button[name=index]")
    expect(page.locator(".messagelist")).to_contain_text("1 schedule paused")
    expect(page.locator(".messagelist")).to_contain_text("nightly export: paused (version 2)")
    expect(row.locator(".cs-badge").first).to_have_text("Paused")
    schedule.refresh_from_db()
    assert (schedule.state, schedule.version) == ("PAUSED", 2)
    screenshot("schedule_list")

    # History: run it once by hand, then follow the link to its occurrences.
    row.locator("th a, td a").first.click()
    page.click("button[data-verb=run_now]")
    expect(page.locator(".messagelist")).to_contain_text("Queued 1 manual run")
    expect(page.locator("button[data-verb=resume]")).to_be_visible()  # paused: resume offered
    page.fill("#cs-preview-from", "2026-03-27T00:00")
    expect(page.locator("#cs-preview-table tr.cs-dst")).to_contain_text("Mon 30 Mar 2026")
    expect(page.locator(".field-history")).to_contain_text("All 1 occurrences")
    screenshot("schedule_change_with_preview")
    page.click(".object-tools a:has-text('Occurrences')")
    expect(page.locator("h1")).to_contain_text("Occurrences of “nightly export”")
    expect(page.locator("#result_list tbody tr")).to_have_count(1)
    expect(page.locator("#result_list tbody tr .cs-badge")).to_have_text("Scheduled")


def test_tenant_user_cannot_see_or_act_on_other_tenant(
    page: Any, users: Any, make_schedule: Any
) -> None:
    from playwright.sync_api import expect

    own = make_schedule("acme", name="acme billing")
    other = make_schedule("globex", name="globex secret")
    log_in(page, "alice")
    page.goto("/admin/django_app/schedule/")
    expect(page.locator("#result_list")).to_contain_text("acme billing")
    expect(page.locator("body")).not_to_contain_text("globex secret")

    response = page.goto(f"/admin/django_app/schedule/{other.pk}/change/")
    assert response is not None
    assert response.status == 404

    # Forged POSTs with a valid session and CSRF token, aimed at the other tenant's schedule.
    page.goto("/admin/django_app/schedule/")
    token = page.locator("input[name=csrfmiddlewaretoken]").first.get_attribute("value")
    headers = {"Referer": page.url}
    bulk = page.request.post(
        "/admin/django_app/schedule/",
        form={"csrfmiddlewaretoken": token, "action": "pause_selected",
              "_selected_action": str(other.pk)},
        headers=headers,
    )  # fmt: skip
    assert bulk.status == 403
    button = page.request.post(
        f"/admin/django_app/schedule/{other.pk}/act/cancel/",
        form={"csrfmiddlewaretoken": token},
        headers=headers,
    )
    assert button.status == 404
    other.refresh_from_db()
    assert (other.state, other.version) == ("ACTIVE", 1)

    # The same token works on the user's own schedule: the refusal was about the tenant.
    allowed = page.request.post(
        f"/admin/django_app/schedule/{own.pk}/act/pause/",
        form={"csrfmiddlewaretoken": token},
        headers=headers,
        max_redirects=0,
    )
    assert allowed.status == 302
    own.refresh_from_db()
    assert own.state == "PAUSED"


def test_overview_page(page: Any, users: Any, make_schedule: Any, screenshot: Any) -> None:
    from playwright.sync_api import expect

    schedule = make_schedule("acme", name="reports", cron="* * * * *")
    for minute in range(1, 60):
        lag = 0.2 + (minute % 7) * 0.3 + (6.5 if minute in (12, 13, 40) else 0.0)
        add_occurrence(schedule, minutes_ago=minute, lag=lag)
    for state in ("DEAD", "RUNNING", "RETRY_WAIT"):
        add_occurrence(schedule, state=state, minutes_ago=0.5 + len(state) / 100, lag=0.3)
    log_in(page, "root")
    page.goto("/admin/django_app/schedule/overview/")
    expect(page.locator("h1")).to_have_text("Scheduler overview")
    expect(page.locator("svg.cs-chart rect.cs-bar-bad")).to_have_count(3)
    expect(page.locator("#cs-lag")).to_contain_text("p99")
    expect(page.locator("body")).to_contain_text("1 dead letter")
    screenshot("overview")
    page.click("text=1 dead letter")
    expect(page.locator("h1")).to_have_text("Dead letters")
