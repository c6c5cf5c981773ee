"""The preview endpoint and the overview page (numbers, percentiles, chart)."""

# The fixtures are imported from admin_support, so their parameters shadow the imports.
# ruff: noqa: F811

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.urls import reverse

from django_app.admin.overview import lag_percentiles, nearest_rank
from tests.conftest import is_postgres
from tests.integration.admin_support import (  # noqa: F401 (fixtures)
    add_occurrence,
    login,
    make_schedule,
    tenants,
    users,
)

pytestmark = pytest.mark.django_db

PREVIEW = reverse("admin:django_app_schedule_preview")
OVERVIEW = reverse("admin:django_app_overview")


class TestPreview:
    def test_berlin_spring_forward_skips_the_missing_day(self, login: Any) -> None:
        body = (
            login("acme")
            .get(PREVIEW, {"cron": "30 2 * * *", "timezone": "Europe/Berlin", "from": "2026-03-27"})
            .json()
        )
        assert body["ok"]
        assert body["description"] == "At 02:30 (Europe/Berlin)"
        local = [r["local_display"] for r in body["rows"]]
        utc = [r["utc_display"] for r in body["rows"]]
        assert len(local) == 10
        assert local[:3] == [
            "Fri 27 Mar 2026 02:30 CET",
            "Sat 28 Mar 2026 02:30 CET",
            "Mon 30 Mar 2026 02:30 CEST",  # 29 March 02:30 does not exist
        ]
        assert utc[:3] == ["2026-03-27 01:30 UTC", "2026-03-28 01:30 UTC", "2026-03-30 00:30 UTC"]
        flagged = [i for i, r in enumerate(body["rows"]) if r["dst"]]
        assert flagged == [2]
        assert "skipped" in body["rows"][2]["note"]

    def test_a_stored_schedule_is_previewed_with_its_dst_policy(
        self, login: Any, make_schedule: Any
    ) -> None:
        """SHIFT moves the nonexistent 02:30 of 29 March to 03:00 CEST (01:00 UTC), as the
        materializer plans it; the preview of the saved row used SKIP and showed 30 March."""
        schedule = make_schedule(cron="30 2 * * *", timezone="Europe/Berlin",
                                 dst_gap="SHIFT", dst_fold="BOTH")  # fmt: skip
        body = login("acme").get(PREVIEW, {"schedule": str(schedule.id),
                                           "from": "2026-03-28 12:00"}).json()  # fmt: skip
        assert body["ok"], body
        assert body["rows"][0]["utc"] == "2026-03-29T01:00:00+00:00"

    def test_preview_from_includes_its_own_instant_and_a_skipped_wall_time_is_the_gaps_end(
        self, login: Any
    ) -> None:
        """ "Preview from 03:00" lists a 03:00 run; "from 02:30" on 29 March (a wall time
        Berlin skips) starts at 03:00 CEST, not at 03:30 (02:30 read as CET)."""
        client = login("acme")
        params = {"cron": "0,45 3 * * *", "timezone": "Europe/Berlin"}
        for start in ("2026-03-29 03:00", "2026-03-29 02:30"):
            body = client.get(PREVIEW, {**params, "from": start}).json()
            assert body["ok"], body
            assert [r["local"] for r in body["rows"][:2]] == [
                "2026-03-29T03:00:00+02:00",
                "2026-03-29T03:45:00+02:00",
            ], start

    def test_fall_back_marks_the_repeated_hour(self, login: Any) -> None:
        body = (
            login("acme")
            .get(PREVIEW, {"cron": "30 2 * * *", "timezone": "Europe/Berlin", "from": "2026-10-24"})
            .json()
        )
        rows = body["rows"]
        assert rows[1]["local_display"] == "Sun 25 Oct 2026 02:30 CEST"  # runs once, first pass
        assert rows[1]["dst"]
        assert "once" in rows[1]["note"]

    @pytest.mark.parametrize(
        ("params", "field"),
        [
            ({"cron": "61 * * * *"}, "cron"),
            ({"cron": "* * *"}, "cron"),
            ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, "timezone"),
            ({"kind": "INTERVAL", "interval_seconds": "0"}, "interval_seconds"),
            ({"kind": "ONE_OFF"}, "run_at"),
            ({"cron": "* * * * *", "from": "yesterday"}, "from"),
        ],
    )
    def test_errors_name_the_field(self, login: Any, params: dict[str, str], field: str) -> None:
        response = login("acme").get(PREVIEW, params)
        assert response.status_code == 400
        assert field in response.json()["errors"]

    def test_interval_and_one_off(self, login: Any) -> None:
        client = login("acme")
        interval = client.get(
            PREVIEW,
            {"kind": "INTERVAL", "interval_seconds": "3600", "start_at": "2030-01-01 00:00"},
        ).json()
        assert interval["description"].startswith("Every 1 hour")
        assert interval["rows"][0]["utc_display"] == "2030-01-01 00:00 UTC"
        assert interval["rows"][1]["utc_display"] == "2030-01-01 01:00 UTC"
        once = client.get(PREVIEW, {"kind": "ONE_OFF", "run_at": "2030-05-01 10:00"}).json()
        assert [r["utc_display"] for r in once["rows"]] == ["2030-05-01 10:00 UTC"]

    def test_anonymous_is_sent_to_login(self, client: Any) -> None:
        response = client.get(PREVIEW, {"cron": "* * * * *"})
        assert response.status_code == 302
        assert "/login/" in response["Location"]


class TestOverview:
    def test_counts_backlog_oldest_and_percentiles(self, login: Any, make_schedule: Any) -> None:
        from django_app.models import OutboxEntry

        schedule = make_schedule()
        for i, lag in enumerate([0.1 * n for n in range(1, 101)]):  # 0.1 .. 10.0 s
            add_occurrence(schedule, minutes_ago=1 + i * 0.5, lag=lag)
        add_occurrence(schedule, state="DEAD", minutes_ago=120)
        stale = add_occurrence(schedule, state="SCHEDULED", minutes_ago=0.2, lag=None)
        OutboxEntry.objects.create(
            occurrence=stale, tenant=schedule.tenant, available_at=stale.available_at
        )
        response = login("acme").get(OVERVIEW)
        assert response.status_code == 200
        stats = response.context["stats"]
        assert (stats.lag_p50, stats.lag_p95, stats.lag_p99) == pytest.approx((5.0, 9.5, 9.9))
        assert stats.lag_samples == 100
        assert dict(stats.state_counts)["SUCCEEDED"] == 100
        assert stats.dead_total == 1
        assert (stats.outbox_backlog, stats.outbox_due) == (1, 1)
        assert stats.oldest_pending.pk == stale.pk
        html = response.content.decode()
        assert "<svg" in html
        assert "cs-bar-bad" in html
        assert "cs-bar-ok" in html
        assert "9.90 s" in html  # p99, over the SLO
        assert "1 dead letter" in html

    def test_rows_not_yet_due_are_not_waiting(self, login: Any, make_schedule: Any) -> None:
        from django_app.models import OutboxEntry

        schedule = make_schedule()
        ahead = add_occurrence(schedule, state="SCHEDULED", minutes_ago=-3, lag=None)
        OutboxEntry.objects.create(
            occurrence=ahead, tenant=schedule.tenant, available_at=ahead.available_at
        )
        stats = login("acme").get(OVERVIEW).context["stats"]
        assert (stats.outbox_backlog, stats.outbox_due) == (1, 0)
        assert stats.oldest_unsent_age is None  # was -180 s: "waiting" since the future

    def test_empty_overview_renders(self, login: Any) -> None:
        response = login("acme").get(OVERVIEW)
        assert response.status_code == 200
        assert response.context["stats"].lag_p99 is None
        assert "Nothing is waiting" in response.content.decode()


def test_nearest_rank_matches_definition() -> None:
    values = sorted(random.Random(7).uniform(0, 10) for _ in range(1000))
    assert nearest_rank(values, 50) == values[499]
    assert nearest_rank(values, 99) == values[989]
    assert nearest_rank([], 50) is None
    assert nearest_rank([3.0], 99) == 3.0


@pytest.mark.postgres
def test_sql_percentiles_equal_python_on_postgres(make_schedule: Any) -> None:
    from django_app.models import Occurrence

    assert is_postgres()
    now = datetime.now(UTC).replace(microsecond=0)
    schedule = make_schedule()
    rng = random.Random(3)
    for i in range(300):
        add_occurrence(schedule, minutes_ago=i * 0.15, lag=round(rng.expovariate(1.0), 3), now=now)
    qs = Occurrence.objects.all()
    n_py, python, minutes_py = lag_percentiles(qs, now, use_sql=False)
    n_sql, sql, minutes_sql = lag_percentiles(qs, now, use_sql=True)
    assert n_py == n_sql == 300
    assert sql == pytest.approx(python)
    # The chart's worst lag per minute, too (computed in SQL on PostgreSQL).
    assert [m for m, _ in minutes_sql] == [m for m, _ in minutes_py]
    assert [v for _, v in minutes_sql] == pytest.approx([v for _, v in minutes_py])
    p50, p95, p99 = python
    assert p50 is not None
    assert p95 is not None
    assert p99 is not None
    assert p50 < p95 < p99
    assert timedelta(hours=1) > timedelta(minutes=300 * 0.15)  # every row is in the window


def test_the_overview_is_reachable_from_the_admin_index(login: Any) -> None:
    client = login("acme")
    index = client.get(reverse("admin:index")).content.decode()
    entry = reverse("admin:django_app_scheduleroverview_changelist")
    assert f'href="{entry}"' in index
    response = client.get(entry)
    assert response.status_code == 302
    assert response["Location"] == OVERVIEW
    assert client.get(OVERVIEW).status_code == 200


def test_the_overview_entry_shows_no_schedule_by_id(login: Any, make_schedule: Any) -> None:
    """The entry is a proxy of Schedule over every tenant: its object views showed another
    tenant's schedule (args, kwargs) to anyone who had its id."""
    schedule = make_schedule("globex", kwargs={"token": "globex-secret"})
    client = login("acme")
    base = reverse("admin:django_app_scheduleroverview_changelist")
    for view in ("change/", "history/", "delete/"):
        response = client.get(f"{base}{schedule.id}/{view}")
        assert response.status_code == 404, view
        assert b"globex-secret" not in response.content
    assert client.get(f"{base}add/").status_code == 404
    assert client.get(base).status_code == 302
