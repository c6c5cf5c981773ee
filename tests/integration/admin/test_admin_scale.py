"""Every admin list page and the overview cost the same queries whatever the table sizes
(issue 10 item 6).

At a million schedules and ten million occurrences a page may only read what it shows: the
query count of a list page must not grow with the rows (N rows and 3N rows: the same
count), no count may walk a whole table (every COUNT over schedules or occurrences stops
at a LIMIT), the task filter may not DISTINCT the schedule table and the date drill-down
may not truncate every row's date. ``bench/admin_pages.py`` measures the same pages at
production size.
"""

# The fixtures are imported from admin_support, so their parameters shadow the imports.
# ruff: noqa: F811

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib import admin
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from celery_scheduler.core.clock import SYSTEM_CLOCK
from tests.integration.admin_support import (  # noqa: F401 (fixtures)
    add_occurrence,
    login,
    make_schedule,
    tenants,
    users,
)

pytestmark = pytest.mark.django_db(transaction=False)

SCHEDULES = reverse("admin:django_app_schedule_changelist")
OCCURRENCES = reverse("admin:django_app_occurrence_changelist")
TABLES = ('"django_app_schedule"', '"django_app_occurrence"', "`django_app_schedule`",
          "`django_app_occurrence`")  # fmt: skip


@pytest.fixture
def small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two rows a page, so both sizes below span several pages."""
    from django_app.models import Occurrence, Schedule

    for model in (Schedule, Occurrence):
        # On the registered admin instance only (restored by monkeypatch).
        monkeypatch.setattr(admin.site._registry[model], "list_per_page", 2)


def grow(make_schedule: Any, tenants: dict[str, Any], first: Any, start: int, n: int) -> None:
    """n more schedules per tenant, each tagged and with a history in every state."""
    from django_app.models import ScheduleTag

    now = SYSTEM_CLOCK.now()
    states = ("SUCCEEDED", "DEAD", "RUNNING", "RETRY_WAIT", "MISSED", "SCHEDULED")
    for i in range(start, start + n):
        for slug in ("acme", "globex"):
            schedule = make_schedule(slug, name=f"report {i}", interval=60 + i)
            ScheduleTag.objects.create(
                schedule=schedule, tenant=tenants[slug], key="team", value="a"
            )
            for k, state in enumerate(states):
                add_occurrence(schedule, state=state, now=now, minutes_ago=5 + k)
        for k, state in enumerate(("DEAD", "SUCCEEDED", "MISSED")):
            add_occurrence(first, state=state, now=now, minutes_ago=100 + 10 * i + k)


def list_pages(first: Any, tenant: Any) -> list[str]:
    today = SYSTEM_CLOCK.now()
    return [
        SCHEDULES,
        f"{SCHEDULES}?tenant__id__exact={tenant.pk}",
        f"{SCHEDULES}?state__exact=ACTIVE",
        f"{SCHEDULES}?task=billing.ping",
        f"{SCHEDULES}?tag=team%3Da",
        f"{SCHEDULES}?q=report",
        f"{SCHEDULES}?o=4",  # next run (column 0 is the action checkbox)
        f"{SCHEDULES}?o=-1",  # name, descending
        f"{SCHEDULES}?p=2",
        OCCURRENCES,
        *(f"{OCCURRENCES}?state__exact={s}" for s in ("DEAD", "RUNNING", "RETRY_WAIT", "MISSED")),
        f"{OCCURRENCES}?manual__exact=0",
        f"{OCCURRENCES}?tenant__id__exact={tenant.pk}",
        f"{OCCURRENCES}?schedule={first.pk}",
        f"{OCCURRENCES}?schedule={first.pk}&state__exact=DEAD",
        f"{OCCURRENCES}?q=report",
        f"{OCCURRENCES}?scheduled_for__year={today.year}",
        f"{OCCURRENCES}?scheduled_for__year={today.year}&scheduled_for__month={today.month}",
        f"{OCCURRENCES}?p=2",
        reverse("admin:django_app_overview"),
    ]


def unbounded(sql: str) -> str | None:
    """Why a query would read a whole table at production size, or None."""
    if not any(table in sql for table in TABLES):
        return None
    upper = sql.upper()
    if "COUNT(" in upper and "LIMIT" not in upper:
        return "a COUNT without a LIMIT"
    if re.search(r"SELECT DISTINCT \S*django_app_schedule\S*\.\S*task", sql):
        return "a DISTINCT over the schedule table's task names"
    if "TRUNC" in upper:
        return "a date truncation of every row (date hierarchy)"
    return None


@pytest.mark.parametrize("who", ["root", "acme"])
def test_list_pages_cost_the_same_queries_at_n_and_3n_rows(
    who: str, login: Any, make_schedule: Any, tenants: dict[str, Any], small_pages: None
) -> None:
    client = login(who)
    first = make_schedule("acme", name="first report", interval=30)
    pages = list_pages(first, tenants["acme"])

    def measure() -> dict[str, tuple[int, list[str]]]:
        costs = {}
        for url in pages:
            if who != "root" and "tenant__id__exact" in url:
                continue  # a tenant user has no tenant filter
            with CaptureQueriesContext(connection) as captured:
                response = client.get(url)
                assert response.status_code == 200, (url, response.content[:500])
            sqls = [q["sql"] for q in captured.captured_queries]
            problems = [f"{why}: {sql[:300]}" for sql in sqls if (why := unbounded(sql))]
            costs[url] = (len(sqls), problems)
        return costs

    grow(make_schedule, tenants, first, 0, 3)
    at_n = measure()
    grow(make_schedule, tenants, first, 3, 6)
    at_3n = measure()

    for url, (queries, problems) in at_3n.items():
        assert not problems, (url, problems)
        assert queries == at_n[url][0], f"{url}: {at_n[url][0]} queries at N rows, {queries} at 3N"
        budget = 26 if "overview" in url else 16  # the overview: a bounded count per state
        assert queries <= budget, f"{url}: {queries} queries"


def test_a_long_list_says_its_count_is_an_estimate(
    login: Any, make_schedule: Any, monkeypatch: pytest.MonkeyPatch, small_pages: None
) -> None:
    from django_app.admin import scale

    first = make_schedule("acme", name="first report", interval=30)
    for k in range(5):
        add_occurrence(first, state="SUCCEEDED", minutes_ago=5 + k)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE django_app_occurrence")
    client = login("root")
    monkeypatch.setattr(scale, "COUNT_CAP", 3)
    monkeypatch.setattr(scale.capped_count, "__defaults__", (3,))
    html = client.get(OCCURRENCES).content.decode()
    if connection.vendor == "postgresql":
        assert "about" in html.split('class="paginator"')[1][:2000]
    else:  # other databases count exactly
        assert re.search(r"\b5 occurrences", html)
    assert client.get(f"{OCCURRENCES}?state__exact=SUCCEEDED").status_code == 200


def test_tab_badges_stop_counting_at_the_cap(
    login: Any, make_schedule: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_app.admin import scale

    first = make_schedule("acme", name="first report", interval=30)
    for k in range(5):
        add_occurrence(first, state="DEAD", minutes_ago=5 + k)
    monkeypatch.setattr(scale.count_label, "__defaults__", (3,))
    html = login("acme").get(OCCURRENCES).content.decode()
    assert '<span class="cs-count">3+</span>' in html


def test_the_date_drill_down_offers_the_days_between_the_bounds(
    login: Any, make_schedule: Any
) -> None:
    from datetime import timedelta

    first = make_schedule("acme", name="first report", interval=30)
    now = SYSTEM_CLOCK.now().replace(hour=12, day=15)
    add_occurrence(first, now=now, minutes_ago=0)
    add_occurrence(first, now=now - timedelta(days=3), minutes_ago=0)
    html = login("acme").get(OCCURRENCES).content.decode()
    # One month of data: the drill-down starts at its days, 12th to 15th, both included.
    for day in (12, 13, 14, 15):
        assert f"scheduled_for__day={day}" in html
    assert "scheduled_for__day=16" not in html


def test_occurrence_search_matches_id_schedule_name_and_task(
    login: Any, make_schedule: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The search reads the schedule terms first; what it finds is what Django's would."""
    from django_app.admin import occurrences

    nightly = make_schedule("acme", name="nightly export", interval=30)
    hourly = make_schedule("acme", name="hourly digest", interval=60)
    a = add_occurrence(nightly, minutes_ago=5)
    b = add_occurrence(hourly, minutes_ago=6)
    client = login("acme")

    def found(q: str) -> set[str]:
        html = client.get(OCCURRENCES, {"q": q}).content.decode()
        return {o.pk.hex[:8] for o in (a, b) if str(o.pk)[:8] in html}

    for many in (False, True):  # ids inline, and the subquery past MAX_NAMED_SCHEDULES
        monkeypatch.setattr(occurrences, "MAX_NAMED_SCHEDULES", 0 if many else 1000)
        assert found("export") == {a.pk.hex[:8]}
        assert found("digest hourly") == {b.pk.hex[:8]}
        assert found("billing.ping") == {a.pk.hex[:8], b.pk.hex[:8]}  # the task
        assert found("export digest") == set()  # every term must match
        assert found(str(b.pk)) == {b.pk.hex[:8]}
        assert found(f"{b.pk} hourly") == {b.pk.hex[:8]}


@pytest.mark.parametrize("order", ["", "-1"])
def test_a_search_lists_its_matches_in_name_order(
    order: str, login: Any, make_schedule: Any
) -> None:
    """A search with few matches sorts them by ``name || ''`` (no index walk): same order."""
    for name in ("beta report", "alpha report", "gamma report", "delta other"):
        make_schedule("acme", name=name, interval=30)
    params = {"q": "report", **({"o": order} if order else {})}
    html = login("acme").get(SCHEDULES, params).content.decode()
    found = [n for n in ("alpha report", "beta report", "gamma report") if n in html]
    assert found == ["alpha report", "beta report", "gamma report"]
    positions = [html.index(n) for n in found]
    assert positions == sorted(positions, reverse=bool(order))
    assert "delta other" not in html
