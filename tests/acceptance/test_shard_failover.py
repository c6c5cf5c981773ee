"""Must-show (issue 6): two real beat nodes; one is SIGSTOPped past its shard leases.

Each node is a real process running this module's ``node_main`` loop: ``ShardLeaser.refresh``
then ``materialize_due(shard_fencing=held)``, the beat's shard work without Celery around it
(so the test can see every refresh and write as a JSON line). Node A is frozen with SIGSTOP
right after a refresh, holding its tokens, and stays frozen past its lease: node B takes its
shards (new tokens). While B is briefly frozen too, new schedules become due in A's old
shards, and A is resumed: it writes with its stale tokens and every one of those writes is
rejected by the fencing check. Then both run on, rebalance, and stop; the offline reconciler
recomputes the expected occurrences of every schedule in the window from the schedule
versions and time rules alone, and none is absent, missed, unexpected or doubled.

Run one node by hand: ``python -m tests.acceptance.test_shard_failover NAME STOP_FILE``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.support import ROOT, database_url, tail, wait_until

SHARDS = 8
LEASE = 3
HORIZON = 3
SCHEDULES = 60
#: Seconds a node waits between its refresh and its writes. It stands for the ordinary gap
#: between learning you hold a lease and using it, and gives the test a moment to freeze
#: a node that has its tokens in hand.
GAP = 0.4


# -- the node process ----------------------------------------------------------------------


def _emit(**event: Any) -> None:
    print(json.dumps(event), flush=True)


def node_main(name: str, stop_file: Path) -> int:
    import django

    django.setup()
    from celery_scheduler.core.clock import SYSTEM_CLOCK
    from celery_scheduler.errors import CoordinationUnavailable
    from django_app.cluster.shards import ShardLeaser
    from django_app.wiring import materialize_due

    leaser = ShardLeaser(name, clock=SYSTEM_CLOCK)
    while not stop_file.exists():
        started = time.monotonic()
        try:
            held = leaser.refresh()
        except CoordinationUnavailable as exc:
            _emit(event="unavailable", error=str(exc))
            time.sleep(leaser.refresh_interval)
            continue
        _emit(event="refreshed", held={str(s): t for s, t in held.items()})
        time.sleep(GAP)
        if held:  # holding nothing means writing nothing (no fencing map = every shard)
            report = materialize_due(clock=SYSTEM_CLOCK, shard_fencing=held, node=name)
            _emit(
                event="materialized",
                shards=sorted(held),
                created=report.occurrences_created,
                fenced=report.fenced,
                conflicts=report.conflicts,
            )
        time.sleep(max(0.0, leaser.refresh_interval - (time.monotonic() - started)))
    _emit(event="stopped", released=leaser.release_all())
    return 0


# -- the test's side -----------------------------------------------------------------------


class Node:
    """A node process and the JSON events it printed, in order."""

    def __init__(self, name: str, stop_file: Path, log: Path) -> None:
        env = dict(os.environ)
        env.update(
            DATABASE_URL=database_url(),
            DJANGO_SETTINGS_MODULE="example_project.settings",
            CELERY_SCHEDULER_SHARDS=str(SHARDS),
            CELERY_SCHEDULER_LEASE_SECONDS=str(LEASE),
            CELERY_SCHEDULER_HORIZON=str(HORIZON),
            PYTHONUNBUFFERED="1",
        )
        env.pop("CELERY_SCHEDULER_FAULT", None)
        self.name = name
        self.log = log
        self._log_file = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.acceptance.test_shard_failover", name, str(stop_file)],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=self._log_file,
        )  # fmt: skip
        self.events: list[dict[str, Any]] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            event = json.loads(line)
            event["seen"] = time.monotonic()
            with self._changed:
                self.events.append(event)
                self._changed.notify_all()

    def wait_for(
        self, what: str, test: Callable[[dict[str, Any]], bool], *, after: int = 0, timeout: float
    ) -> tuple[int, dict[str, Any]]:
        """The first event at index >= ``after`` that passes ``test`` (index, event)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for i in range(after, len(self.events)):
                    if test(self.events[i]):
                        return i, self.events[i]
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise AssertionError(
                        f"{self.name}: no {what} within {timeout} s; events {self.events[after:]}"
                        f"\n{tail(self.log)}"
                    )
                self._changed.wait(min(left, 0.2))

    def signal(self, sig: signal.Signals) -> None:
        os.kill(self.proc.pid, sig)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(10)
        self._reader.join(10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        self._log_file.close()


def refreshed(count: int) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e["event"] == "refreshed" and len(e["held"]) == count


def materialized(e: dict[str, Any]) -> bool:
    return e["event"] == "materialized"


def create_interval_schedule(tenant: Any, name: str, start_at: datetime) -> Any:
    from django_app.schedules.lifecycle import create_schedule

    return create_schedule(
        tenant=tenant, name=name, task="billing.ping", interval=1, start_at=start_at
    )


@pytest.mark.acceptance
@pytest.mark.concurrent_db
@pytest.mark.django_db(transaction=True)
def test_a_node_paused_past_its_lease_is_fenced_and_nothing_is_lost_or_doubled(
    settings: Any, tmp_path: Path
) -> None:
    from django.db.models import Count

    from celery_scheduler.core import ids
    from django_app.models import Occurrence, OutboxEntry, ShardLease, Tenant
    from django_app.operations.reconcile import reconcile

    settings.CELERY_SCHEDULER = {
        **getattr(settings, "CELERY_SCHEDULER", {}),
        "shard_count": SHARDS,
        "lease_seconds": LEASE,
        "horizon_seconds": HORIZON,
    }
    tenant = Tenant.objects.create(slug="failover")
    window_start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=2)
    # Ids are random: with 60 schedules over 8 shards one shard is empty about once in 400
    # runs, so keep creating until every shard holds work (the failover must move real work).
    schedules = [create_interval_schedule(tenant, f"s{i}", window_start) for i in range(SCHEDULES)]
    while {s.shard for s in schedules} != set(range(SHARDS)):
        schedules.append(create_interval_schedule(tenant, f"s{len(schedules)}", window_start))
        assert len(schedules) < 200

    stop_file = tmp_path / "stop"
    a = Node("node-a", stop_file, tmp_path / "a.log")
    b = Node("node-b", stop_file, tmp_path / "b.log")
    try:
        half = SHARDS // 2
        # 1. Both nodes up and balanced.
        b.wait_for("a balanced refresh", refreshed(half), timeout=30)
        i, _ = a.wait_for("a balanced refresh", refreshed(half), timeout=30)
        steady_from = datetime.now(UTC)

        # 2. Freeze A right after a refresh: it holds its tokens and has not written yet.
        i, frozen = a.wait_for("a refresh", refreshed(half), after=i + 1, timeout=10)
        a.signal(signal.SIGSTOP)
        frozen_at = time.monotonic()
        assert frozen_at - frozen["seen"] < GAP / 2, "A was not frozen inside its gap"
        stale = {int(s): t for s, t in frozen["held"].items()}

        # 3. B takes every shard, A's under new tokens, and writes in them.
        def b_owns_all() -> bool:
            now = datetime.now(UTC)
            rows = list(ShardLease.objects.filter(shard__lt=SHARDS))
            return all(r.owner == "node-b" and r.expires_at and r.expires_at > now for r in rows)

        wait_until(b_owns_all, timeout=4 * LEASE, what="B to lease every shard")
        took_over = time.monotonic() - frozen_at
        for shard, token in stale.items():
            assert ShardLease.objects.get(shard=shard).fencing_token > token
        j, _ = b.wait_for("B holding all", refreshed(SHARDS), timeout=10)
        j, _ = b.wait_for(
            "B writing all", lambda e: materialized(e) and len(e["shards"]) == SHARDS, after=j,
            timeout=10,
        )  # fmt: skip
        assert time.monotonic() - frozen_at > LEASE, "A must stay frozen past its lease"

        # 4. Freeze B (just refreshed: its leases hold for LEASE s) and make new work due in
        #    A's old shards; resume A, which still believes in its stale tokens.
        j, _ = b.wait_for("B refresh", refreshed(SHARDS), after=j + 1, timeout=10)
        b.signal(signal.SIGSTOP)
        b_frozen_at = time.monotonic()
        now = datetime.now(UTC)
        due_soon = now.replace(microsecond=0) + timedelta(seconds=1)
        extra: list[Any] = []
        while not set(stale) <= {s.shard for s in extra}:
            extra.append(create_interval_schedule(tenant, f"late-{len(extra)}", due_soon))
            assert len(extra) < 200
        a.signal(signal.SIGCONT)
        _, resumed = a.wait_for("A's write after resume", materialized, after=i + 1, timeout=10)
        assert resumed["shards"] == sorted(stale)
        assert resumed["fenced"] == len(stale), resumed  # every stale write was rejected
        assert resumed["created"] == 0
        in_stale = [s.id for s in extra if s.shard in stale]
        assert not Occurrence.objects.filter(schedule_id__in=in_stale).exists()
        b.signal(signal.SIGCONT)
        assert time.monotonic() - b_frozen_at < LEASE - 0.5, "B was frozen too long"

        # 5. Both run on: the new work is written by B, then the nodes rebalance.
        wait_until(
            lambda: Occurrence.objects.filter(schedule_id__in=in_stale).count() >= len(in_stale),
            timeout=10, what="B to materialize the new work",
        )  # fmt: skip
        k, _ = a.wait_for("A back to its share", refreshed(half), after=i + 1, timeout=20)
        a.wait_for("A writing again", materialized, after=k, timeout=10)
        b.wait_for("B back to its share", refreshed(half), after=j + 1, timeout=20)
        time.sleep(1)  # one more round of writes by both
        window_end = datetime.now(UTC)
        stop_file.touch()
        for node in (a, b):
            _, stopped = node.wait_for("stop", lambda e: e["event"] == "stopped", timeout=15)
            assert node.proc.wait(10) == 0
        assert stopped["released"] == half
    finally:
        a.close()
        b.close()

    # 6. Nothing lost, nothing doubled, nothing missed, every time within the window.
    all_ids = [s.id for s in schedules + extra]
    report = reconcile(start=window_start, end=window_end, now=window_end, schedule_ids=all_ids)
    assert report.ok, report.absent[:5]
    assert report.unexpected == []
    assert set(report.counts) - {"unexpected"} == {"pending"}, report.counts
    assert report.counts["pending"] >= SCHEDULES * 5
    occurrences = Occurrence.objects.filter(schedule_id__in=all_ids)
    doubled = occurrences.values("schedule_id", "scheduled_for").annotate(n=Count("id"))
    assert not doubled.filter(n__gt=1).exists()
    assert OutboxEntry.objects.filter(occurrence__in=occurrences).count() == occurrences.count()
    for occ in occurrences.filter(scheduled_for__lt=window_end)[:200]:
        assert occ.id == ids.occurrence_id(occ.schedule_id, occ.schedule_version, occ.scheduled_for)
    # The takeover bound: B held A's shards about one lease period after A froze, so even
    # the fire times that fell in the gap were written at most a couple of seconds late.
    assert took_over < LEASE + 2 * (LEASE / 3) + 1, took_over
    lateness = max(
        (o.created_at - o.scheduled_for).total_seconds()
        for o in occurrences.filter(scheduled_for__gte=steady_from, scheduled_for__lt=window_end)
    )
    print(f"takeover after {took_over:.2f} s; latest write {lateness:.2f} s after its time")
    assert lateness < 2 * LEASE


if __name__ == "__main__":
    sys.exit(node_main(sys.argv[1], Path(sys.argv[2])))
