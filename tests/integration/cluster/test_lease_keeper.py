"""The lease keeper renews a node's shard leases only while the beat loop is inside a step.

A step can outlast a lease (a burst wave held until its instant): the keeper renews for it.
Between steps the loop refreshes its own leases, and a loop whose every step fails before
that refresh (a broker this node cannot reach, while the others can) must let them lapse,
so that the other beats take the shards over; a keeper renewing then would keep them
unplanned for as long as the outage lasts.
"""

from __future__ import annotations

import threading
import time

from celery_scheduler.core.clock import SYSTEM_CLOCK
from django_app.cluster.shards import LeaseKeeper


class CountingLeaser:
    """What the keeper reads and calls of a ShardLeaser: renewals counted, none stored."""

    node = "n1"
    clock = SYSTEM_CLOCK
    refresh_interval = 0.02

    def __init__(self) -> None:
        self.last_renewed = 0.0  # long ago: a renewal is due at once
        self.renewals = 0

    def renew(self) -> dict[int, int]:
        self.renewals += 1
        self.last_renewed = self.clock.monotonic()
        return {}


def test_the_keeper_renews_inside_a_step_and_never_between_steps() -> None:
    leaser = CountingLeaser()
    in_step = threading.Event()
    keeper = LeaseKeeper(leaser, in_step=in_step.is_set)  # type: ignore[arg-type]
    keeper.start()
    try:
        time.sleep(0.3)  # ~30 of its wake-ups, each past the renewal period
        assert leaser.renewals == 0, "renewed while no step ran"
        in_step.set()
        deadline = time.monotonic() + 10
        while leaser.renewals < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert leaser.renewals >= 2, "a long step's leases were not renewed"
    finally:
        keeper.stop()
