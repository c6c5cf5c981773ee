"""Issue 14, item 2: beat and a prefork worker serve Prometheus metrics with no user code.

Real processes on PostgreSQL + Redis, configured only through ``CELERY_SCHEDULER_METRICS_PORT``.
The beat's scrape lists every metric docs/howto/operate.md lists and its probes answer 200;
the worker (``-c 2 -P prefork``) runs failing tasks in both children, and its one scrape sums
both children's ``dead_total``.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest

from celery_scheduler import api, metrics
from celery_scheduler.core.clock import SYSTEM_CLOCK
from django_app.models import Occurrence
from tests.acceptance import support, worker_tasks

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.acceptance,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(300),
]

assert worker_tasks.fails_slowly.name == "acceptance.fails_slowly"  # registered for validation

RUNS = 8
#: The operator's page whose "Metrics served" table lists every metric.
OPERATE = support.ROOT / "docs" / "howto" / "operate.md"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def sample(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert match, f"{name} not in scrape"
    return float(match.group(1))


def documented_metric_names() -> set[str]:
    """The names the operator's metrics table lists (`celery_scheduler_...`)."""
    text = OPERATE.read_text()
    section = text[text.index("## Metrics served") :]
    section = section.split("\n## ", 1)[0].split("\n# ", 1)[0]
    return set(re.findall(r"`(celery_scheduler_[a-z_]+)`", section))


def test_the_operate_page_lists_every_metric() -> None:
    assert documented_metric_names() == {metrics.PREFIX + name for name in metrics._SPECS}


def test_beat_and_a_prefork_worker_serve_metrics(redis_url: str, tmp_path: Path) -> None:
    beat_port, worker_port = free_port(), free_port()
    pid_file = tmp_path / "pids.txt"
    multiproc = tmp_path / "prom"
    env = support.process_env(redis_url, ACCEPTANCE_PID_FILE=str(pid_file))
    beat = support.start_beat(
        {**env, "CELERY_SCHEDULER_METRICS_PORT": str(beat_port)}, tmp_path / "beat.log"
    )
    with (tmp_path / "worker.log").open("ab") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "example_project", "worker",
             "-c", "2", "-P", "prefork", "--prefetch-multiplier", "1",
             "-I", "tests.acceptance.worker_tasks", "-n", "metrics@%h", "--loglevel", "INFO",
             "--without-gossip", "--without-mingle", "--without-heartbeat"],
            cwd=support.ROOT, stdout=log, stderr=subprocess.STDOUT,
            env={**env, "CELERY_SCHEDULER_METRICS_PORT": str(worker_port),
                 "PROMETHEUS_MULTIPROC_DIR": str(multiproc)},
        )  # fmt: skip
    with support.running(beat, worker):
        support.wait_until(
            lambda: get(beat_port, "/readyz")[0] == 200, timeout=90, what="beat ready"
        )
        support.wait_until(
            lambda: get(worker_port, "/readyz")[0] == 200, timeout=90, what="worker ready"
        )
        # The worker says where it serves, as beat does, through Celery's log: the line
        # logged at worker_init (before Celery sets logging up) reaches only a project's own
        # LOGGING, which startproject does not configure for django_app.
        endpoint = re.compile(rf"INFO/MainProcess\] .*serving metrics .*:{worker_port}/metrics")
        support.wait_until(
            lambda: endpoint.search((tmp_path / "worker.log").read_text()),
            timeout=30,
            what="the worker to log its metrics endpoint",
        )
        code, beat_scrape = get(beat_port, "/metrics")
        assert code == 200
        print("beat /metrics (HELP lines):")
        print("\n".join(line for line in beat_scrape.splitlines() if line.startswith("# HELP")))
        for name in documented_metric_names():
            assert f"# HELP {name} " in beat_scrape, name
        assert get(beat_port, "/healthz")[0] == 200
        code, body = get(beat_port, "/status")
        assert code == 200
        assert len(json.loads(body)["detail"]["nodes"]) == 1

        run_at = SYSTEM_CLOCK.now() + timedelta(seconds=3)
        for i in range(RUNS):
            api.create_schedule(
                name=f"fails-{i}", task="acceptance.fails_slowly", args=[1.0],
                run_at=run_at, max_attempts=1,
            )  # fmt: skip
        support.wait_until(
            lambda: Occurrence.objects.filter(state="DEAD").count() == RUNS,
            timeout=120,
            what="every run to go DEAD",
        )
        pids = set(pid_file.read_text().split())
        assert len(pids) == 2, f"both children ran tasks: {pids}"

        def scraped_dead() -> float:
            return sample(get(worker_port, "/metrics")[1], "celery_scheduler_dead_total")

        support.wait_until(lambda: scraped_dead() == RUNS, timeout=10, what="dead_total summed")
        code, worker_scrape = get(worker_port, "/metrics")
        print(f"worker /metrics: dead_total {scraped_dead()} from children {sorted(pids)}")
        for name, spec in metrics._SPECS.items():
            if not spec.labels:  # labelled series appear once a child has a sample
                assert f"# HELP {metrics.PREFIX}{name} " in worker_scrape, name
        assert get(worker_port, "/healthz")[0] == 200
        # The default path's timings, from the real processes: the worker observed each
        # claim's queue age and each run, the beat each publish and its time SCHEDULED.
        for name, labels in [
            ("celery_scheduler_queue_age_seconds_count", {"tenant": "default"}),
            ("celery_scheduler_state_seconds_count", {"tenant": "default", "state": "ENQUEUED"}),
            ("celery_scheduler_state_seconds_count", {"tenant": "default", "state": "RUNNING"}),
        ]:
            assert labelled(worker_scrape, name, labels) == RUNS, (name, labels)
        beat_scrape = get(beat_port, "/metrics")[1]
        assert sample(beat_scrape, "celery_scheduler_published_total") >= RUNS
        for name, labels in [
            ("celery_scheduler_schedule_lag_seconds_count", {"tenant": "default"}),
            ("celery_scheduler_state_seconds_count", {"tenant": "default", "state": "SCHEDULED"}),
        ]:
            assert labelled(beat_scrape, name, labels) >= RUNS, (name, labels)
        assert re.search(r"^celery_scheduler_outbox_backlog \S+$", beat_scrape, re.MULTILINE)


def labelled(text: str, name: str, labels: dict[str, str]) -> float:
    """A labelled sample's value in a scrape, whatever the order of its labels (0 if absent)."""
    for line in text.splitlines():
        head, _, value = line.rpartition(" ")
        metric, _, rest = head.partition("{")
        if metric != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', rest))
        if found == labels:
            return float(value)
    return 0.0
