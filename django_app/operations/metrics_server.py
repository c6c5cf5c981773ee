"""Prometheus metrics and health endpoints served by beat and workers without user code.

``CELERY_SCHEDULER["metrics_port"]`` (or the ``CELERY_SCHEDULER_METRICS_PORT`` environment
variable, which wins) turns it on; ``metrics_addr`` / ``CELERY_SCHEDULER_METRICS_ADDR`` is the
address bound. Routes: ``/metrics`` (Prometheus text), ``/healthz`` (beat: liveness of its
loop; worker: the process answers), ``/readyz`` (beat: holds shards, reaches database and
broker; worker: reaches database and broker), ``/status`` (``scheduler_status --json``).
200 means healthy, 503 not.

Beat starts the server from its scheduler setup. A worker starts it from Celery's
``worker_init`` signal in the main process, switching prometheus_client to multiprocess mode
first (``PROMETHEUS_MULTIPROC_DIR``; a fresh temporary one unless set): prefork children
write their samples to per-pid files and the main process's ``MultiProcessCollector`` sums the
counters and histograms of every child on each scrape. ``worker_process_shutdown`` marks a
child dead so its live gauges disappear.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from celery import signals
from django.db import connections
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, values
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from celery_scheduler import metrics
from django_app import conf
from django_app.operations import health

logger = logging.getLogger(__name__)

PORT_ENV = "CELERY_SCHEDULER_METRICS_PORT"
ADDR_ENV = "CELERY_SCHEDULER_METRICS_ADDR"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

#: The worker's server, kept so a test or a shutdown can stop it.
_worker_server: ThreadingHTTPServer | None = None


def configured_port() -> int | None:
    """The port to serve on, or ``None`` (not configured: nothing is served)."""
    raw = os.environ.get(PORT_ENV, "").strip()
    if raw:
        return int(raw)
    return conf.get().metrics_port


def configured_addr() -> str:
    return os.environ.get(ADDR_ENV, "").strip() or conf.get().metrics_addr


Check = Callable[[], tuple[bool, object]]


def serve(
    port: int,
    addr: str,
    *,
    registry: Callable[[], CollectorRegistry],
    healthz: Check,
    readyz: Check,
) -> ThreadingHTTPServer:
    """Serve the routes on a daemon thread; ``port=0`` picks a free one (``server_port``)."""

    def status() -> tuple[bool, object]:
        return True, health.status().as_dict()

    routes: dict[str, Check] = {"/healthz": healthz, "/readyz": readyz, "/status": status}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, CONTENT_TYPE_LATEST, generate_latest(registry()))
                return
            route = routes.get(path)
            if route is None:
                self._send(404, "text/plain", b"not found\n")
                return
            try:
                ok, body = _on_fresh_connection(route)
            except Exception as exc:  # a probe that cannot run has failed, it does not crash
                ok, body = False, {"error": f"{type(exc).__name__}: {exc}"}
            payload = json.dumps({"ok": ok, "detail": body}, default=str).encode()
            self._send(200 if ok else 503, "application/json", payload)

        def _send(self, code: int, content_type: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("metrics server: %s", format % args)

    server = ThreadingHTTPServer((addr, port), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="metrics-server", daemon=True)
    thread.start()
    logger.info("serving metrics and health on http://%s:%d/metrics", addr, server.server_port)
    return server


def _on_fresh_connection(route: Check) -> tuple[bool, object]:
    """Each request thread has its own database connection: close it when done."""
    try:
        return route()
    finally:
        connections.close_all()


def _probe(result: Any) -> tuple[bool, object]:
    return bool(result.ok), result.checks


def start_for_beat(node: str) -> ThreadingHTTPServer | None:
    """Serve the beat's own registry and its node's probes (if a port is configured)."""
    port = configured_port()
    if port is None:
        return None
    return _start(
        port,
        registry=metrics.registry,
        healthz=lambda: _probe(health.liveness(node)),
        readyz=lambda: _probe(health.readiness(node)),
    )


def _start(port: int, **kwargs: Any) -> ThreadingHTTPServer | None:
    try:
        return serve(port, configured_addr(), **kwargs)
    except OSError as exc:  # e.g. the port is taken: metrics are not worth the process
        logger.error("metrics server not started on port %d: %s", port, exc)
        return None


# -- workers -------------------------------------------------------------------------------


def enable_multiprocess() -> Path:
    """Switch prometheus_client to per-process files and recreate our metrics on them."""
    raw = os.environ.get(MULTIPROC_ENV)
    if raw:
        path = Path(raw)
        path.mkdir(parents=True, exist_ok=True)
        for stale in path.glob("*.db"):  # a previous run's pids would be summed in
            stale.unlink()
    else:
        path = Path(tempfile.mkdtemp(prefix="celery-scheduler-metrics-"))
        os.environ[MULTIPROC_ENV] = str(path)  # inherited by the prefork children
    values.ValueClass = values.MultiProcessValue()
    metrics.reset()
    return path


def multiprocess_registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    return registry


def on_worker_init(**_: Any) -> None:
    """``worker_init`` (main process, before the pool forks)."""
    global _worker_server
    port = configured_port()
    if port is None:
        return
    enable_multiprocess()

    def ready() -> tuple[bool, object]:
        result = health.readiness_of_worker()
        return _probe(result)

    _worker_server = _start(
        port,
        registry=multiprocess_registry,
        healthz=lambda: (True, "ok"),
        readyz=ready,
    )


def on_worker_ready(**_: Any) -> None:
    """``worker_ready``: say where the worker serves, as beat does.

    ``worker_init`` (where the server starts) runs before Celery configures logging, so the
    line :func:`serve` logs there reaches no handler; logging is set up by ``worker_ready``.
    """
    server = _worker_server
    if server is None:
        return
    addr, port = server.server_address[:2]
    logger.info(
        "worker serving metrics and health on http://%s:%d/metrics",
        addr,
        port,
        extra={"event": "metrics_served", "port": port},
    )


def on_worker_process_init(**_: Any) -> None:
    """``worker_process_init`` (each prefork child): its samples go to its own pid's files."""
    if os.environ.get(MULTIPROC_ENV) and configured_port() is not None:
        metrics.reset()


def on_worker_process_shutdown(pid: int | None = None, **_: Any) -> None:
    """``worker_process_shutdown``: drop the child's live gauges."""
    if os.environ.get(MULTIPROC_ENV) and configured_port() is not None:
        mark_process_dead(pid or os.getpid())


def connect_worker_signals() -> None:
    signals.worker_init.connect(on_worker_init, weak=False, dispatch_uid="cs-metrics-init")
    signals.worker_ready.connect(on_worker_ready, weak=False, dispatch_uid="cs-metrics-ready")
    signals.worker_process_init.connect(
        on_worker_process_init, weak=False, dispatch_uid="cs-metrics-child"
    )
    signals.worker_process_shutdown.connect(
        on_worker_process_shutdown, weak=False, dispatch_uid="cs-metrics-child-exit"
    )
