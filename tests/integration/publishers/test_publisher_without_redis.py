"""The base install has no redis-py (it comes with the ``redis`` extra): a project on another
broker (the embedded SQLite one, RabbitMQ) must get a publisher without importing it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.acceptance.support import ROOT


def test_non_redis_broker_never_imports_redis() -> None:
    script = textwrap.dedent("""
        import sys
        sys.modules["redis"] = None  # as if redis-py were not installed
        from celery import Celery
        from celery_scheduler.publishers.default import celery_publisher
        for url in ("sqla+sqlite:///:memory:", "amqp://guest@127.0.0.1:5672//", "memory://"):
            publisher = celery_publisher(Celery("p", broker=url, set_as_current=False))
            print(type(publisher).__name__)
        """)
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["CeleryPublisher", "AmqpFastPublisher", "CeleryPublisher"]
