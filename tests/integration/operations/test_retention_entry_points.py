"""Every way in to run now with a key and to backfill goes through the path that survives
retention: the HTTP API, the admin's run-now action and ``manage.py schedules backfill``
(the Python API is driven by test_retention_scheduling.py)."""

# The fixtures are imported from the HTTP and admin tests, so their parameters shadow them.
# ruff: noqa: F811

from __future__ import annotations

import importlib
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.apps import apps as django_apps
from django.core.management import CommandError, call_command
from django.db import transaction

from celery_scheduler import api
from django_app.models import ManualRunKey, Occurrence, OutboxEntry, PrunedHistory
from django_app.operations import retention
from tests.integration.admin.test_admin_guards import _hidden, messages_of
from tests.integration.admin.test_admin_schedules import LIST
from tests.integration.admin_support import login, make_schedule, tenants, users  # noqa: F401
from tests.integration.http.http_support import HttpClient
from tests.integration.http.test_http_api import CREATE, _past_range, acme  # noqa: F401


def _finish_and_prune(ids: Iterable[Any]) -> None:
    """Mark the occurrences run and published, then prune them (and only what is as old)."""
    now = datetime.now(UTC)
    ids = [uuid.UUID(str(i)) for i in ids]
    Occurrence.objects.filter(id__in=ids).update(state="SUCCEEDED", finished_at=now)
    OutboxEntry.objects.filter(occurrence_id__in=ids).update(sent_at=now)
    retention.prune(now=now + timedelta(days=2), older_than=timedelta(days=1))
    assert not Occurrence.objects.filter(id__in=ids).exists()


@pytest.mark.django_db(transaction=True)
def test_http_run_now_key_and_backfill_after_pruning(acme: HttpClient) -> None:
    sid = acme.post("schedules/", CREATE).body["schedule"]["id"]
    first = acme.post(f"schedules/{sid}/run-now/", {"idempotency_key": "deploy-7"}).body
    start, end = _past_range()
    body = {"start": start.isoformat(), "end": end.isoformat()}
    backfilled = acme.post(f"schedules/{sid}/backfill/", body).body["created"]
    assert backfilled
    _finish_and_prune([first["id"], *backfilled])

    again = acme.post(f"schedules/{sid}/run-now/", {"idempotency_key": "deploy-7"})
    backfill_again = acme.post(f"schedules/{sid}/backfill/", body)

    assert again.status in (200, 201)
    assert (again.body["id"], again.body["state"]) == (first["id"], "SUCCEEDED")
    assert backfill_again.status in (200, 201), backfill_again.body
    report = backfill_again.body
    assert (report["created"], report["already_backfilled"]) == ([], len(backfilled))
    assert not Occurrence.objects.filter(schedule_id=sid).exists()  # nothing ran again


@pytest.mark.django_db
def test_admin_run_now_submitted_again_after_pruning_runs_nothing(
    login: Any, make_schedule: Any
) -> None:
    schedule = make_schedule()
    client = login("acme")
    key = _hidden(client.get(LIST).content.decode(), "idempotency_key")
    data = {"action": "run_selected_now", "_selected_action": [str(schedule.pk)]}
    client.post(LIST, {**data, "idempotency_key": key}, follow=True)
    _finish_and_prune(Occurrence.objects.filter(schedule=schedule).values_list("id", flat=True))

    again = client.post(LIST, {**data, "idempotency_key": key}, follow=True)

    assert not Occurrence.objects.filter(schedule=schedule).exists()
    assert "Already queued by this submission" in " ".join(messages_of(again))


@pytest.mark.django_db
def test_cli_backfill_over_history_pruned_before_0024_is_refused_naming_start() -> None:
    """The one span backfill cannot answer: what was pruned before retention kept the
    times (migration 0024 marks it unknown), refused as HistoryPruned, exit 2."""
    now = datetime.now(UTC)
    s = api.create_schedule(name="report", task="billing.ping", cron="0 * * * *")
    start, end = now - timedelta(hours=6), now - timedelta(hours=2)
    report = api.backfill(s.id, start=start, end=end)
    _finish_and_prune(report.created)
    # As an install that pruned before 0024: the span without its times, marked unknown.
    PrunedHistory.objects.filter(schedule_id=s.id).update(ran="", backfilled="")
    importlib.import_module("django_app.migrations.0024_pruned_history_times").unknown_spans(
        django_apps, None
    )
    assert PrunedHistory.objects.filter(schedule_id=s.id, unknown_from__isnull=False).exists()

    args = ["schedules", "backfill", str(s.id), "--start", start.isoformat()]
    with pytest.raises(CommandError, match=r"^--start: retention deleted") as refused:
        call_command(*args, "--end", end.isoformat())

    assert refused.value.returncode == 2
    assert not Occurrence.objects.filter(schedule_id=s.id).exists()


@pytest.mark.django_db
def test_a_partition_drop_that_calls_record_pruned_keeps_keys_and_backfills_exactly() -> None:
    """The partition path: record_pruned over a range of scheduled_for, then the rows go
    (here a plain delete stands in for detaching the partition). A backfill over the range
    afterwards runs exactly what it would have run with the rows there: nothing that ran,
    the time whose row was MISSED."""
    now = datetime.now(UTC)
    s = api.create_schedule(name="report", task="billing.ping", cron="0 * * * *")
    hour = now.replace(minute=0, second=0, microsecond=0)
    start, end = hour - timedelta(hours=6), hour - timedelta(hours=2)
    created = api.backfill(s.id, start=start, end=end).created
    keyed = api.run_now(s.id, idempotency_key="k")
    ids = [*created, keyed.id]
    Occurrence.objects.filter(id__in=ids).update(state="SUCCEEDED", finished_at=now)
    # A fire time the schedule's own version missed, before the backfilled range.
    missed_at = start - timedelta(hours=1)
    Occurrence.objects.create(
        id=uuid.uuid4(), schedule_id=s.id, tenant_id=s.tenant_id, schedule_version=1,
        scheduled_for=missed_at, available_at=missed_at, state="MISSED", finished_at=now,
    )  # fmt: skip
    lo, hi = missed_at - timedelta(hours=1), now + timedelta(hours=1)  # the "partition"
    times = sorted(
        Occurrence.objects.filter(schedule_id=s.id).values_list("scheduled_for", flat=True)
    )

    with transaction.atomic():
        retention.record_pruned(
            Occurrence.objects.filter(scheduled_for__gte=lo, scheduled_for__lt=hi)
        )
        OutboxEntry.objects.filter(occurrence_id__in=ids).delete()
        Occurrence.objects.filter(scheduled_for__gte=lo, scheduled_for__lt=hi).delete()

    span = PrunedHistory.objects.get(schedule_id=s.id)
    assert (span.first, span.through) == (times[0], times[-1])
    again = api.run_now(s.id, idempotency_key="k")
    assert (again.id, again.state, again._state.adding) == (keyed.id, "SUCCEEDED", True)
    report = api.backfill(s.id, start=missed_at, end=end)
    assert (report.already_backfilled, report.already_ran) == (len(created), 0)
    assert len(report.created) == 1
    assert list(
        Occurrence.objects.filter(schedule_id=s.id).values_list("scheduled_for", "manual")
    ) == [(missed_at, True)]


@pytest.mark.django_db
def test_the_migration_writes_a_key_row_for_each_keyed_run_now_that_exists() -> None:
    migration = importlib.import_module("django_app.migrations.0019_pruned_history")
    now = datetime.now(UTC)
    s = api.create_schedule(name="report", task="billing.ping", cron="0 * * * *")
    keyed = api.run_now(s.id, idempotency_key="deploy-1")
    api.run_now(s.id)  # unkeyed: no key row
    api.backfill(s.id, start=now - timedelta(hours=3), end=now - timedelta(hours=1))
    ManualRunKey.objects.all().delete()  # as before the migration

    migration.keyed_run_now_rows(django_apps, None)

    (row,) = ManualRunKey.objects.all()
    assert (row.occurrence_id, row.schedule_id, row.scheduled_for, row.state) == (
        keyed.id,
        s.id,
        keyed.scheduled_for,
        "",
    )
