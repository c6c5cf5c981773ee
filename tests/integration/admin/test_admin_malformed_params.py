"""No admin page answers 500 for a malformed query string (issue 15, item 4).

Walks every list page of the app (and the overview, the preview endpoint and change pages)
as a superuser and as a tenant user, with malformed parameters: bad uuids, bad dates, bad
choices, bad page numbers, unknown orderings, huge integers and NUL bytes. Each answer must
be a page (200), a redirect to one (302, e.g. Django's ``?e=1``), 400 or 404, never 500.
Run on SQLite and PostgreSQL (NUL bytes in a text lookup are a DataError on PostgreSQL).
"""

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

HUGE = "9" * 30
NUL = "\x00"

#: Parameters every list page gets (Django's own: page, ordering, search, filters).
COMMON: list[dict[str, str]] = [
    {"p": "abc"}, {"p": "-1"}, {"p": HUGE}, {"p": NUL},
    {"o": "99"}, {"o": "abc"}, {"o": "1.-x.3"}, {"o": f"-{HUGE}"}, {"o": NUL},
    {"q": NUL}, {"q": "a\x00b"}, {"q": "x" * 10_000},
    {"id": "not-a-uuid"}, {"id": HUGE}, {"id__exact": NUL}, {"pk": NUL},
    {"all": NUL}, {"e": NUL}, {"_popup": NUL}, {"_to_field": "bogus"},
    {"tenant__id__exact": "abc"}, {"tenant__id__exact": HUGE}, {"tenant__id__exact": NUL},
    {"tenant": "abc"}, {"tenant": HUGE}, {"unknown_field__gte": "1"},
    {"created_at__gte": "not-a-date"}, {"created_at__year": "abc"},
]  # fmt: skip

#: Page-specific filters (each page's own list_filter, date hierarchy and custom params).
PAGES: dict[str, list[dict[str, str]]] = {
    "schedule": [
        {"state__exact": "BOGUS"}, {"state__exact": NUL}, {"kind__exact": "x"},
        {"kind__exact": NUL}, {"misfire_policy__exact": NUL}, {"overlap_policy__exact": "?"},
        {"task": NUL}, {"task": "x" * 5000}, {"next_run_at__lt": "31/02/2026"},
        {"next_run_at__gte": NUL}, {"version": HUGE}, {"version__gt": "abc"},
    ],
    "occurrence": [
        {"schedule": "not-a-uuid"}, {"schedule": NUL}, {"schedule": HUGE},
        {"schedule": "00000000-0000-0000-0000-000000000000"},
        {"schedule__id__exact": "zzz"}, {"state__exact": "BOGUS"}, {"state__exact": NUL},
        {"manual__exact": "maybe"}, {"manual__exact": NUL},
        {"scheduled_for__year": "abc"}, {"scheduled_for__year": HUGE},
        {"scheduled_for__year": "2026", "scheduled_for__month": "13"},
        {"scheduled_for__year": "2026", "scheduled_for__month": "2", "scheduled_for__day": "31"},
        {"scheduled_for__year": "0"}, {"scheduled_for__year": "10000"},
        {"scheduled_for__year": NUL}, {"scheduled_for__gte": "not-a-date"},
        {"scheduled_for__gte": "9999-12-31T23:59:59+14:00"},
        {"attempt_count__gt": HUGE}, {"q": "not-a-uuid"},
    ],
    "attempt": [
        {"outcome__exact": "BOGUS"}, {"outcome__exact": NUL},
        {"occurrence__id__exact": "not-a-uuid"}, {"occurrence": NUL}, {"number": HUGE},
        {"q": "not-a-uuid"}, {"started_at__lt": "2026-02-30"},
    ],
    "tenant": [{"max_schedules__gt": HUGE}, {"slug": NUL}, {"relay_weight__lt": "abc"}],
    "tenantmembership": [{"tenant__id__exact": "x"}, {"user__id__exact": HUGE}, {"user": NUL}],
}  # fmt: skip

#: Non-list pages that read the query string.
EXTRA: dict[str, list[dict[str, str]]] = {
    "admin:django_app_overview": [{"tenant": NUL}, {"window": HUGE}, {"state__exact": NUL}],
    "admin:django_app_schedule_preview": [
        {"schedule": "not-a-uuid"}, {"schedule": NUL}, {"schedule": HUGE},
        {"kind": NUL}, {"kind": "CRON", "cron": NUL}, {"kind": "CRON", "timezone": NUL},
        {"kind": "CRON", "cron": "* * * * *", "from": "2026-02-30 10:00"},
        {"kind": "CRON", "cron": "* * * * *", "from": NUL},
        {"kind": "INTERVAL", "interval_seconds": HUGE},
        {"kind": "INTERVAL", "interval_seconds": "²"},
        {"kind": "ONE_OFF", "run_at": "9999-12-31 23:59"},
    ],
}  # fmt: skip


@pytest.fixture
def populated(make_schedule: Any) -> dict[str, Any]:
    acme = make_schedule("acme", name="acme-secret-name")
    globex = make_schedule("globex", name="globex-secret-name")
    return {"acme": add_occurrence(acme, state="DEAD"), "globex": add_occurrence(globex)}


def _short(params: dict[str, str]) -> str:
    return repr({k: v if len(v) < 40 else v[:20] + "..." for k, v in params.items()})


def _walk(client: Any, url: str, cases: list[dict[str, str]]) -> list[str]:
    client.raise_request_exception = False
    bad = []
    for params in cases:
        try:
            response = client.get(url, params)
        except Exception as exc:  # the test client re-raises view errors in some paths
            bad.append(f"{url} {_short(params)}: raised {type(exc).__name__}: {exc}")
            continue
        status = response.status_code
        if status == 302 and response["Location"].startswith(url):
            status = client.get(response["Location"]).status_code  # follow Django's ?e=1
        # 403: a page the user may not see at all (tenants are for superusers only).
        if status not in (200, 302, 400, 403, 404):
            bad.append(f"{url} {_short(params)}: HTTP {status}")
    return bad


@pytest.mark.parametrize("who", ["root", "acme"])
def test_no_list_page_answers_500_for_malformed_params(
    login: Any, populated: Any, who: str
) -> None:
    client = login(who)
    failures = []
    for model, specific in PAGES.items():
        url = reverse(f"admin:django_app_{model}_changelist")
        failures += _walk(client, url, COMMON + specific)
    # The "Overview" row of the admin index: a list page that redirects to the overview.
    failures += _walk(client, reverse("admin:django_app_scheduleroverview_changelist"), COMMON)
    for name, cases in EXTRA.items():
        failures += _walk(client, reverse(name), cases)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("who", ["root", "acme"])
def test_change_pages_with_malformed_ids_are_404(login: Any, populated: Any, who: str) -> None:
    client = login(who)
    client.raise_request_exception = False
    failures = []
    for model in PAGES:
        for object_id in ("not-a-uuid", HUGE, NUL, "%00", "-1"):
            url = reverse(f"admin:django_app_{model}_change", args=[object_id])
            status = client.get(url).status_code
            if status not in (302, 400, 403, 404):
                failures.append(f"{url}: HTTP {status}")
    assert not failures, "\n".join(failures)


def test_malformed_schedule_filter_does_not_show_other_tenants(login: Any, populated: Any) -> None:
    """The occurrence list filtered by a malformed schedule id is a page (or 400) for the
    tenant user, and never names another tenant's schedule."""
    client = login("acme")
    client.raise_request_exception = False
    url = reverse("admin:django_app_occurrence_changelist")
    for value in ("not-a-uuid", NUL, str(populated["globex"].schedule_id)):
        response = client.get(url, {"schedule": value}, follow=True)
        assert response.status_code in (200, 400)
        assert b"globex-secret-name" not in response.content
