"""A frozen clock walks across both of Europe/Berlin's 2026 changes, a minute at a time,
through the real materializer (per-schedule, and set-based on PostgreSQL) and relay into a
recording publisher, with one schedule per DST policy pair. What each publishes is checked
against fire times written out by hand, and the reconciler expects exactly those.

``0,30 1,2 * * *`` in Europe/Berlin:

* 29 March 2026 (02:00 CET -> 03:00 CEST): 01:00 and 01:30 CET exist (00:00Z, 00:30Z);
  02:00 and 02:30 do not. SKIP drops them; SHIFT runs them once, at 03:00 CEST (01:00Z).
* 25 October 2026 (03:00 CEST -> 02:00 CET): 01:00 and 01:30 CEST exist once (23:00Z,
  23:30Z on the 24th); 02:00 and 02:30 twice: CEST 00:00Z/00:30Z, then CET 01:00Z/01:30Z.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test import override_settings

from celery_scheduler import api
from celery_scheduler.core.clock import FrozenClock
from celery_scheduler.publishers import RecordingPublisher
from django_app.operations import reconcile
from django_app.relay.batch import relay_due
from django_app.wiring import materialize_due

pytestmark = pytest.mark.django_db(transaction=True)

CRON = "0,30 1,2 * * *"
POLICIES = [(gap, fold) for gap in ("SKIP", "SHIFT") for fold in ("FIRST", "SECOND", "BOTH")]


def _z(day: int, month: int, hour: int, minute: int) -> datetime:
    return datetime(2026, month, day, hour, minute, tzinfo=UTC)


SPRING = {
    "SKIP": [_z(29, 3, 0, 0), _z(29, 3, 0, 30)],
    "SHIFT": [_z(29, 3, 0, 0), _z(29, 3, 0, 30), _z(29, 3, 1, 0)],
}
FALL = {
    "FIRST": [_z(24, 10, 23, 0), _z(24, 10, 23, 30), _z(25, 10, 0, 0), _z(25, 10, 0, 30)],
    "SECOND": [_z(24, 10, 23, 0), _z(24, 10, 23, 30), _z(25, 10, 1, 0), _z(25, 10, 1, 30)],
    "BOTH": [
        _z(24, 10, 23, 0), _z(24, 10, 23, 30), _z(25, 10, 0, 0), _z(25, 10, 0, 30),
        _z(25, 10, 1, 0), _z(25, 10, 1, 30),
    ],
}  # fmt: skip


def _materializers() -> list[bool]:
    # The set-based materializer runs on PostgreSQL only (conf.bulk_materialize_enabled).
    return [False, True] if connection.vendor == "postgresql" else [False]


def _walk(start: datetime, end: datetime, expected: dict[str, list[datetime]], key: int) -> None:
    clock = FrozenClock(start)
    ids = {}
    for gap, fold in POLICIES:
        schedule = api.create_schedule(
            name=f"{gap}-{fold}", task="billing.ping", cron=CRON, timezone="Europe/Berlin",
            dst_gap=gap, dst_fold=fold, clock=clock,
        )  # fmt: skip
        ids[str(schedule.id)] = (gap, fold)
    publisher = RecordingPublisher()
    while clock.now() < end:
        materialize_due(clock=clock)
        relay_due(clock=clock, publisher=publisher)
        clock.advance(timedelta(minutes=1))
    published: dict[tuple[str, str], list[datetime]] = {p: [] for p in POLICIES}
    for message in publisher.sent:
        kwargs = message.task_kwargs()
        when = datetime.fromisoformat(kwargs["scheduled_for"].replace("Z", "+00:00"))
        published[ids[kwargs["schedule_id"]]].append(when)
    want = {(gap, fold): expected[(gap, fold)[key]] for gap, fold in POLICIES}
    assert published == want
    report = reconcile.reconcile(start=start, end=end, now=clock.now())
    by_policy: dict[tuple[str, str], list[datetime]] = {p: [] for p in POLICIES}
    for item in report.expected:
        by_policy[ids[str(item.schedule_id)]].append(item.scheduled_for)
    assert by_policy == want
    assert report.unexpected == []
    assert {i.status for i in report.expected} == {"pending"}  # ENQUEUED, nobody ran them


@pytest.mark.parametrize("bulk", [False, True], ids=["per_schedule", "set_based"])
def test_spring_forward_fires_what_each_gap_policy_promises(bulk: bool) -> None:
    if bulk not in _materializers():
        pytest.skip("the set-based materializer runs on PostgreSQL only")
    with override_settings(CELERY_SCHEDULER={"bulk_materialize": bulk}):
        _walk(_z(28, 3, 23, 0), _z(29, 3, 2, 0), SPRING, key=0)


@pytest.mark.parametrize("bulk", [False, True], ids=["per_schedule", "set_based"])
def test_fall_back_fires_what_each_fold_policy_promises(bulk: bool) -> None:
    if bulk not in _materializers():
        pytest.skip("the set-based materializer runs on PostgreSQL only")
    with override_settings(CELERY_SCHEDULER={"bulk_materialize": bulk}):
        _walk(_z(24, 10, 22, 0), _z(25, 10, 2, 30), FALL, key=1)
