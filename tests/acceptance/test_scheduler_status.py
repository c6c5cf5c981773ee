"""Issue 14, item 1: ``scheduler_status`` and its Kubernetes probes on real beats.

Two real beats on PostgreSQL + Redis. Healthy: both nodes hold shards, no shard is unowned,
and ``--liveness`` / ``--readiness`` exit 0 for each node. One beat SIGSTOPped: its liveness
and (once its leases lapse) its readiness exit 1, while the other node's stay 0 and it takes
every shard over.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

import pytest

from celery_scheduler.core.clock import SYSTEM_CLOCK
from django_app.models import BeatNode, ShardLease
from tests.acceptance import support

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.acceptance,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(300),
]

SHARDS = 8
LEASE = 6
#: Liveness bound for the probes here (the loop stamps progress about every second).
MAX_AGE = "4"


def manage(env: dict[str, str], *args: str) -> CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "scheduler_status", *args],
        cwd=support.ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def manage_all(env: dict[str, str], *argsets: tuple[str, ...]) -> list[CompletedProcess[str]]:
    """``manage.py scheduler_status ARGS`` for each of ``argsets``, two processes at a time
    (one per core: each is a Django start-up, and one after another they were most of this
    test's time), in the order given."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(lambda args: manage(env, *args), argsets))


def probe_args(node: str) -> list[tuple[str, ...]]:
    return [
        ("--liveness", "--node", node, "--max-age", MAX_AGE),
        ("--readiness", "--node", node, "--timeout", "3"),
    ]


def status_and_probes(
    env: dict[str, str], nodes: list[str]
) -> tuple[CompletedProcess[str], dict[str, Any], dict[str, tuple[int, int]]]:
    """The text status, the --json status and each node's (liveness, readiness) exit codes,
    all taken at once."""
    text, as_json, *probed = manage_all(
        env, (), ("--json",), *(args for node in nodes for args in probe_args(node))
    )
    codes = {}
    for i, node in enumerate(nodes):
        live, ready = probed[2 * i], probed[2 * i + 1]
        for name, result in (("liveness", live), ("readiness", ready)):
            print(f"$ scheduler_status --{name} --node {node}  -> exit {result.returncode}")
            print(result.stdout, end="")
        codes[node] = (live.returncode, ready.returncode)
    return text, json.loads(as_json.stdout), codes


def node_of(process: subprocess.Popen[bytes]) -> str:
    return BeatNode.objects.get(name__endswith=f":{process.pid}").name


def shards_of(node: str) -> int:
    return ShardLease.objects.filter(owner=node).count()


def test_status_and_probes_of_a_healthy_and_a_stopped_beat(
    redis_url: str, tmp_path: Path, settings: Any
) -> None:
    settings.CELERY_SCHEDULER = {"shard_count": SHARDS, "lease_seconds": LEASE}
    env = support.process_env(
        redis_url, CELERY_SCHEDULER_SHARDS=str(SHARDS), CELERY_SCHEDULER_LEASE_SECONDS=str(LEASE)
    )
    beats = [support.start_beat(env, tmp_path / f"beat{n}.log") for n in range(2)]
    with support.running(*beats):
        support.wait_until(
            lambda: BeatNode.objects.filter(progress_at__isnull=False).count() == 2,
            timeout=90,
            what="both beats to make progress",
        )
        first, second = (node_of(b) for b in beats)
        support.wait_until(
            lambda: (
                shards_of(first) + shards_of(second) == SHARDS
                and shards_of(first) > 0
                and shards_of(second) > 0
            ),
            timeout=60,
            what="the shards to be shared",
        )
        healthy, report, codes = status_and_probes(env, [first, second])
        print("$ scheduler_status   (healthy)\n" + healthy.stdout)
        assert healthy.returncode == 0, healthy.stderr
        assert {n["name"] for n in report["nodes"] if n["alive"]} == {first, second}
        assert report["unowned_shards"] == []
        assert sum(len(n["shards"]) for n in report["nodes"]) == SHARDS
        assert codes[first] == (0, 0)
        assert codes[second] == (0, 0)

        beats[1].send_signal(signal.SIGSTOP)
        try:
            # The stopped node's leases lapse (whether the live one has taken every shard
            # over by then is the failover tests' business: status reports either way).
            support.wait_until(
                lambda: (
                    not ShardLease.objects.filter(
                        owner=second, expires_at__gt=SYSTEM_CLOCK.now()
                    ).exists()
                ),
                timeout=LEASE * 4,
                what="the stopped node's leases to lapse",
            )
            stopped, report, codes = status_and_probes(env, [first, second])
            print("$ scheduler_status   (second beat SIGSTOPped)\n" + stopped.stdout)
            assert stopped.returncode == 0, stopped.stderr
            by_name = {n["name"]: n for n in report["nodes"]}
            assert by_name[first]["alive"]
            assert by_name[first]["shards"]
            assert by_name[second]["shards"] == []
            assert codes[first] == (0, 0)
            assert codes[second] == (1, 1)
        finally:
            beats[1].send_signal(signal.SIGCONT)
