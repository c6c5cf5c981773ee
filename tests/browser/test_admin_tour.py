"""The operator's pages at 1,400 px with realistic history: screenshots, and no page wider
than the window (the occurrence list used to scroll sideways)."""

# The fixtures are imported from admin_support, so their parameters shadow the imports.
# ruff: noqa: F811

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest

from tests.browser.test_admin_browser import log_in
from tests.integration.admin_support import (  # noqa: F401 (fixtures)
    add_occurrence,
    make_schedule,
    tenants,
    users,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/srv/app/billing/tasks.py", line 41, in create_invoice\n'
    "    address = customer.billing_address()\n"
    '  File "/srv/app/billing/models.py", line 88, in billing_address\n'
    '    raise ValueError(f"customer {self.pk} has no billing address")\n'
    "ValueError: customer 42 has no billing address"
)


def history(make_schedule: Any) -> Any:
    nightly = make_schedule(
        "acme", name="nightly invoices", cron="0 2 * * *", timezone="Europe/Berlin",
        args=[42, "2026-11"],
    )  # fmt: skip
    flaky = make_schedule("acme", name="partner export (flaky)", interval=30)
    make_schedule("globex", name="globex sync", cron="*/5 * * * *")
    for minute in range(1, 40):
        add_occurrence(nightly, minutes_ago=minute * 3, lag=0.1 + (minute % 5) * 0.2)
    dead = None
    for minute in range(1, 12):
        state = "DEAD" if minute % 3 == 1 else "SUCCEEDED"
        occ = add_occurrence(
            flaky, state=state, minutes_ago=minute / 2, lag=0.3,
            error=TRACEBACK if state == "DEAD" else "",
        )  # fmt: skip
        if state == "DEAD":
            occ.started_at = occ.scheduled_for + timedelta(seconds=0.4)
            occ.finished_at = occ.started_at + timedelta(seconds=1.7)
            occ.save()
            dead = dead or occ
    add_occurrence(flaky, state="SCHEDULED", minutes_ago=-0.3, lag=None)
    return dead


def fits(page: Any) -> bool:
    """No sideways scrolling: neither the page nor the result table's own scroller."""
    return bool(
        page.evaluate(
            "document.documentElement.scrollWidth <= window.innerWidth && "
            "[...document.querySelectorAll('#changelist .results')]"
            ".every(el => el.scrollWidth <= el.clientWidth)"
        )
    )


def test_operator_pages_at_1400px(
    page: Any, users: Any, make_schedule: Any, screenshot: Any
) -> None:
    from playwright.sync_api import expect

    dead = history(make_schedule)
    page.set_viewport_size({"width": 1400, "height": 900})
    log_in(page, "root")

    page.goto("/admin/django_app/schedule/")
    row = page.locator("#result_list tbody tr", has_text="partner export")
    expect(row.locator('[data-column="last-run"] .cs-badge')).to_have_text("Dead")
    assert fits(page)
    screenshot("tour_schedule_list")

    page.goto(f"/admin/django_app/schedule/{dead.schedule_id}/change/")
    expect(page.locator(".field-history")).to_contain_text("Dead")
    screenshot("tour_schedule_change")

    page.goto(f"/admin/django_app/occurrence/{dead.pk}/change/")
    expect(page.locator("pre.cs-error")).to_contain_text("line 88, in billing_address")
    expect(page.locator("button[data-verb=replay]")).to_be_visible()
    screenshot("tour_occurrence_traceback")

    page.goto("/admin/django_app/occurrence/?state__exact=DEAD")
    expect(page.locator("#result_list")).to_contain_text("has no billing address")
    assert fits(page)
    screenshot("tour_dead_letters")

    page.goto("/admin/django_app/occurrence/")
    assert fits(page)
    screenshot("tour_occurrences")

    page.goto("/admin/")
    page.click("a:has-text('Overview')")
    expect(page.locator("h1")).to_have_text(re.compile("Scheduler overview"))
    screenshot("tour_overview")
