"""The soak's processes: 3 ``celery beat``, 3 ``celery worker -P solo``, a private Redis.

Each process connects to PostgreSQL with its own ``application_name`` (``chaos-beat0``...),
so a fault can terminate exactly its connections. The broker is a ``redis-server`` of our
own on a free port without persistence, so restarting it loses the queue as a real outage
would, without touching the shared Redis other people use; without ``redis-server`` the
broker is the given Redis database and a "restart" becomes a FLUSHDB of that database.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Proc:
    name: str
    role: str  # "beat" | "worker"
    process: subprocess.Popen[bytes] | None = None
    stopped_since: float | None = None  # monotonic time of the SIGSTOP, if stopped
    starts: int = 0

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class Cluster:
    database_url: str
    log_dir: Path
    env_extra: dict[str, str]
    fallback_redis_url: str
    beats: int = 3
    workers: int = 3
    procs: dict[str, Proc] = field(default_factory=dict)
    redis_port: int | None = None
    redis_process: subprocess.Popen[bytes] | None = None

    # -- broker ---------------------------------------------------------------------------

    @property
    def private_redis(self) -> bool:
        return shutil.which("redis-server") is not None

    @property
    def broker_url(self) -> str:
        if self.private_redis:
            return f"redis://127.0.0.1:{self.redis_port}/0"
        return self.fallback_redis_url

    def start_redis(self) -> None:
        if not self.private_redis:
            return
        if self.redis_port is None:
            self.redis_port = free_port()
        log = (self.log_dir / "redis.log").open("ab")
        self.redis_process = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.redis_port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.log_dir),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.redis_port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server did not come up on port {self.redis_port}")

    def stop_redis(self) -> None:
        if self.redis_process is not None and self.redis_process.poll() is None:
            self.redis_process.kill()
            self.redis_process.wait(10)
        self.redis_process = None

    def restart_redis(self, down_seconds: float) -> str:
        """Kill the broker (no persistence: queued messages are lost) and start it again."""
        if not self.private_redis:
            self.flush_broker()
            return "flushdb (no redis-server binary: restart simulated)"
        self.stop_redis()
        time.sleep(down_seconds)
        self.start_redis()
        return f"redis-server on :{self.redis_port} killed and restarted"

    def flush_broker(self) -> None:
        import redis

        client = redis.Redis.from_url(self.broker_url, socket_timeout=5)
        try:
            client.flushdb()  # our own database only: never FLUSHALL
        finally:
            client.close()

    # -- beats and workers ----------------------------------------------------------------

    def env_for(self, name: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CELERY_SCHEDULER_FAULT")}
        sep = "&" if "?" in self.database_url else "?"
        env.update(
            DATABASE_URL=f"{self.database_url}{sep}application_name=chaos-{name}",
            CELERY_BROKER_URL=self.broker_url,
            DJANGO_SETTINGS_MODULE="example_project.settings",
            PYTHONPATH=str(ROOT),
            PYTHONUNBUFFERED="1",
        )
        env.update(self.env_extra)
        return env

    def start_all(self) -> None:
        for i in range(self.beats):
            self.procs[f"beat{i}"] = Proc(f"beat{i}", "beat")
        for i in range(self.workers):
            self.procs[f"worker{i}"] = Proc(f"worker{i}", "worker")
        for proc in self.procs.values():
            self.start(proc)

    def start(self, proc: Proc) -> None:
        log_path = self.log_dir / f"{proc.name}.log"
        if proc.role == "beat":
            command = [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "example_project",
                "beat",
                "-S",
                "celery_scheduler.beat:DatabaseScheduler",
                "--loglevel",
                "INFO",
                "--pidfile=",
                "-s",
                str(self.log_dir / f"{proc.name}.db"),
            ]
        else:
            command = [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "example_project",
                "worker",
                "-P",
                "solo",
                "-n",
                f"{proc.name}@%h",
                "--loglevel",
                "INFO",
                "--prefetch-multiplier",
                "1",
                "-I",
                "tests.chaos.tasks",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ]
        with log_path.open("ab") as log:
            log.write(f"\n==== start {time.strftime('%H:%M:%S')} ====\n".encode())
            log.flush()
            proc.process = subprocess.Popen(
                command,
                cwd=ROOT,
                env=self.env_for(proc.name),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        proc.stopped_since = None
        proc.starts += 1

    def signal(self, proc: Proc, sig: signal.Signals) -> bool:
        if not proc.alive():
            return False
        assert proc.process is not None
        try:
            os.kill(proc.process.pid, sig)
        except ProcessLookupError:
            return False
        if sig is signal.SIGSTOP:
            proc.stopped_since = time.monotonic()
        elif sig in (signal.SIGCONT, signal.SIGKILL):
            proc.stopped_since = None
        if sig is signal.SIGKILL:
            proc.process.wait(10)
        return True

    def terminate_connections(self, proc: Proc) -> int:
        """``pg_terminate_backend`` every connection of ``proc`` (by application_name)."""
        import psycopg

        with psycopg.connect(_conninfo(self.database_url), autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = %s AND datname = current_database()",
                [f"chaos-{proc.name}"],
            ).fetchall()
        return sum(1 for (ok,) in rows if ok)

    def revive_all(self) -> list[str]:
        """SIGCONT the stopped, restart the dead; returns what was done."""
        done = []
        for proc in self.procs.values():
            if proc.alive() and proc.stopped_since is not None:
                self.signal(proc, signal.SIGCONT)
                done.append(f"SIGCONT {proc.name}")
            elif not proc.alive():
                self.start(proc)
                done.append(f"restart {proc.name}")
        return done

    def wait_workers_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        for proc in self.procs.values():
            if proc.role != "worker":
                continue
            log = self.log_dir / f"{proc.name}.log"
            while " ready." not in log.read_text(errors="replace"):
                if time.monotonic() > deadline or not proc.alive():
                    raise RuntimeError(f"{proc.name} did not become ready:\n{tail(log)}")
                time.sleep(0.2)

    def stop_all(self, timeout: float = 40) -> dict[str, Any]:
        """SIGCONT + SIGTERM everything; SIGKILL what does not stop within ``timeout``.

        A worker's warm shutdown finishes its current body first (up to ~24 s here).
        """
        outcome: dict[str, Any] = {}
        for proc in self.procs.values():
            if proc.alive():
                assert proc.process is not None
                proc.process.send_signal(signal.SIGCONT)
                proc.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in self.procs.values():
            if proc.process is None:
                continue
            try:
                proc.process.wait(max(0.1, deadline - time.monotonic()))
                outcome[proc.name] = "stopped"
            except subprocess.TimeoutExpired:
                proc.process.kill()
                proc.process.wait(10)
                outcome[proc.name] = "SIGKILLed after SIGTERM timeout"
        self.stop_redis()
        return outcome


def _conninfo(url: str) -> str:
    return url.replace("postgres://", "postgresql://", 1)


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"
