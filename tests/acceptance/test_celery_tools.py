"""A scheduled run looks, to every Celery tool, like the task it runs (issue 23).

Differential, with real processes on PostgreSQL and Redis: one prefork worker (``-E``,
importing :mod:`tests.acceptance.tool_tasks`), a beat, Flower (from PyPI, on a free
loopback port) and, in this process, Celery's event receiver. The same five tasks (one
returns, one raises, one retries through ``autoretry_for``, one hits its soft time limit,
one its hard time limit)
are sent once with plain ``apply_async`` and fired once by the scheduler. Then what each
tool recorded is compared field by field:

- the result backend (Redis, ``result_extended``): state, result, traceback, name, args,
  kwargs, retries;
- Celery's events (``task-*``): the sequence, and name, args, kwargs, retries, result,
  exception, traceback of each;
- the worker log lines that name the task id;
- ``task_prerun``/``task_postrun``/``task_success``/``task_failure``/``task_retry``;
- Flower's HTTP API (``/api/task/info/<id>``);
- sentry-sdk's Celery integration (a test transport): errors and transactions;
- opentelemetry-instrumentation-celery (an in-memory exporter): spans and attributes.

A difference fails the test unless README.md's "What Celery tools see" table lists it (tool
and field): the README and the test share that one table.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import urllib.request
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance import support, tool_tasks

assert tool_tasks.returns.name == "tools.returns"  # registered here too, for validation

pytestmark = [pytest.mark.acceptance, pytest.mark.postgres, pytest.mark.timeout(300)]

README = support.ROOT / "README.md"
TABLE_HEADING = "## What Celery tools see"

#: (task, args, kwargs, extra create_schedule fields). One attempt for the two that fail
#: for good: a plain apply_async does not retry them either (the scheduler's own retry
#: policy, max_attempts, is a scheduler feature, not something Celery does).
CASES: list[tuple[str, list[Any], dict[str, Any], dict[str, Any]]] = [
    ("tools.returns", [21], {"label": "daily"}, {}),
    ("tools.raises", [42], {}, {"max_attempts": 1}),
    ("tools.retries", ["rss"], {}, {}),  # max_retries=1 on the task: two attempts
    ("tools.soft_limited", [5], {}, {"max_attempts": 1}),
    # Killed by the pool: reported by the worker's consumer, not by the task's tracer.
    ("tools.hard_limited", [5], {}, {"max_attempts": 1}),
]
#: Tools that see a task only through its traced run, which a hard time limit kills.
KILLED = {"tools.hard_limited"}
FINAL = {"SUCCESS", "FAILURE"}


def intended_differences(readme: Path = README) -> set[tuple[str, str]]:
    """(tool, field) of every row of the README's table of intended differences."""
    text = readme.read_text()
    assert TABLE_HEADING in text, f"README.md has no {TABLE_HEADING!r} section"
    section = text.split(TABLE_HEADING, 1)[1].split("\n## ", 1)[0]
    rows: set[tuple[str, str]] = set()
    for line in section.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or set(cells[0]) <= {"-", ":"} or cells[0] == "Tool":
            continue
        rows.add((cells[0], cells[1]))
    return rows


class EventLog(threading.Thread):
    """Celery's own event receiver, in a thread, until :meth:`close`."""

    def __init__(self, broker_url: str) -> None:
        super().__init__(daemon=True)
        self.broker_url = broker_url
        self.events: list[dict[str, Any]] = []
        self.receiver: Any = None

    def run(self) -> None:
        from celery import Celery

        app = Celery("tools-events", broker=self.broker_url, set_as_current=False)
        with app.connection_for_read() as connection:
            self.receiver = app.events.Receiver(connection, handlers={"*": self.events.append})
            self.receiver.capture(limit=None, timeout=None, wakeup=False)

    def close(self) -> None:
        if self.receiver is not None:
            self.receiver.should_stop = True
        self.join(timeout=10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:  # loopback only
        return json.loads(response.read())


# -- what each tool recorded, with run-specific values (ids, times, pids) masked ------------


def masked(value: Any, task_id: str) -> Any:
    if isinstance(value, str):
        text = value.replace(task_id, "<id>")
        text = re.sub(r"\b\d+\.\d+s\b", "<t>s", text)  # runtimes
        return re.sub(r"line \d+", "line <n>", text)
    if isinstance(value, dict):
        return {k: masked(v, task_id) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [masked(v, task_id) for v in value]
    return value


def last_line(text: Any) -> Any:
    return text.strip().splitlines()[-1] if isinstance(text, str) and text.strip() else text


def from_backend(app: Any, task_id: str) -> dict[str, Any]:
    meta = app.backend.get_task_meta(task_id)
    return {
        "state": meta.get("status"),
        "result": repr(meta.get("result")),
        "traceback": last_line(meta.get("traceback")),
        "name": meta.get("name"),
        "args": meta.get("args"),
        "kwargs": meta.get("kwargs"),
        "retries": meta.get("retries"),
        "queue": meta.get("queue"),
    }


EVENT_FIELDS = ("name", "args", "kwargs", "retries", "result", "exception", "eta", "expires")


def from_events(events: list[dict[str, Any]], task_id: str) -> dict[str, Any]:
    mine = [e for e in events if e.get("uuid") == task_id and e["type"].startswith("task-")]
    out: dict[str, Any] = {"sequence": [e["type"] for e in mine]}
    seen: dict[str, int] = {}
    for event in mine:
        # Keyed "task-received #2": the order is compared once, in "sequence".
        seen[event["type"]] = seen.get(event["type"], 0) + 1
        fields = {k: event[k] for k in EVENT_FIELDS if k in event}
        if "traceback" in event:
            fields["traceback"] = last_line(event["traceback"])
        out[f"{event['type']} #{seen[event['type']]}"] = fields
    return out


def from_log(log: str, task_id: str) -> dict[str, Any]:
    lines = [
        line.split("] ", 1)[-1] for line in log.splitlines() if f"[{task_id}]" in line
    ]  # "[date: LEVEL/Process] text": the text
    return {"lines": sorted(lines)}  # the order is the events' "sequence"


def from_signals(records: list[dict[str, Any]], task_id: str) -> dict[str, Any]:
    mine = [r for r in records if r.get("task_id") == task_id]
    return {
        f"{i}:{r['signal']}": {k: v for k, v in r.items() if k not in ("signal", "task_id")}
        for i, r in enumerate(mine)
    }


FLOWER_FIELDS = ("name", "state", "args", "kwargs", "result", "exception", "retries", "root_id")


def from_flower(base: str, task_id: str) -> dict[str, Any]:
    info = http_json(f"{base}/api/task/info/{task_id}")
    fields = {k: info.get(k) for k in FLOWER_FIELDS}
    fields["traceback"] = last_line(info.get("traceback"))
    return fields


def from_sentry(items: list[dict[str, Any]], task_id: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        payload = item["payload"]
        if (payload.get("tags") or {}).get("celery_task_id") != task_id:
            continue
        if item["type"] == "transaction":
            trace = (payload.get("contexts") or {}).get("trace") or {}
            out["transaction"] = {
                "name": payload.get("transaction"),
                "status": trace.get("status"),
                "op": trace.get("op"),
                "spans": sorted(
                    (s.get("op"), s.get("description")) for s in payload.get("spans") or []
                ),
                "celery-job": (payload.get("extra") or {}).get("celery-job"),
            }
        elif item["type"] == "event":
            values = (payload.get("exception") or {}).get("values") or [{}]
            out.setdefault("errors", []).append(
                {
                    "type": values[-1].get("type"),
                    "value": values[-1].get("value"),
                    "transaction": payload.get("transaction"),
                    "celery-job": (payload.get("extra") or {}).get("celery-job"),
                }
            )
    return out


OTEL_ATTRIBUTES = ("celery.task_name", "celery.action", "celery.state", "messaging.message.id")


def from_otel(spans: list[dict[str, Any]], task_id: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for span in spans:
        attributes = span["attributes"]
        if attributes.get("messaging.message.id") != task_id:
            continue
        out[f"span {span['name']}"] = {
            "kind": span["kind"],
            "status": span["status"],
            "events": span["events"],
            **{k: attributes.get(k) for k in OTEL_ATTRIBUTES},
        }
    return out


def differences(plain: Any, scheduled: Any, path: str = "") -> list[str]:
    """Field paths where two records differ (a key present on one side only included)."""
    if isinstance(plain, dict) and isinstance(scheduled, dict):
        found: list[str] = []
        for key in sorted(set(plain) | set(scheduled)):
            sub = f"{path} > {key}" if path else key
            if key not in plain or key not in scheduled:
                found.append(sub)
            else:
                found.extend(differences(plain[key], scheduled[key], sub))
        return found
    return [] if plain == scheduled else [path]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.django_db(transaction=True)
def test_a_scheduled_run_looks_like_apply_async_to_every_celery_tool(
    redis_url: str, tmp_path: Path
) -> None:
    from celery import Celery

    from celery_scheduler import api
    from celery_scheduler.core.clock import SYSTEM_CLOCK
    from django_app.models import Occurrence

    probes = tmp_path / "probes"
    probes.mkdir()
    port = free_port()
    env = support.process_env(
        redis_url,
        CELERY_RESULT_BACKEND=redis_url,
        CELERY_RESULT_EXTENDED="1",
        TOOLS_PROBE_DIR=str(probes),
        FLOWER_UNAUTHENTICATED_API="true",
    )
    listener = EventLog(redis_url)
    listener.start()
    worker_log = tmp_path / "worker.log"
    with worker_log.open("ab") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "example_project", "worker", "-E",
             "-c", "1", "-I", "tests.acceptance.tool_tasks", "-n", "tools@%h",
             "--loglevel", "INFO", "--without-gossip", "--without-mingle"],
            cwd=support.ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    with (tmp_path / "flower.log").open("ab") as log:
        flower = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "example_project", "flower",
             "--address=127.0.0.1", f"--port={port}", "--persistent=False"],
            cwd=support.ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    beat = support.start_beat(env, tmp_path / "beat.log")
    client = Celery("tools-client", broker=redis_url, backend=redis_url, set_as_current=False)
    base = f"http://127.0.0.1:{port}"
    ids: dict[tuple[str, str], str] = {}
    with support.running(beat, worker, flower):
        support.wait_until(
            lambda: " ready." in worker_log.read_text(errors="replace"),
            timeout=60, what="worker ready",
        )  # fmt: skip
        support.wait_until(lambda: _up(base), timeout=60, what="Flower up")
        run_at = SYSTEM_CLOCK.now() + timedelta(seconds=4)
        schedules = {}
        for task, args, kwargs, extra in CASES:
            schedules[task] = api.create_schedule(
                name=f"tools {task}", task=task, args=args, kwargs=kwargs, run_at=run_at, **extra
            )
        for task, args, kwargs, _ in CASES:
            ids[(task, "plain")] = client.tasks[task].apply_async(args, kwargs).id  # type: ignore[arg-type]

        def occurrences_known() -> bool:
            for task, schedule in schedules.items():
                occurrence = Occurrence.objects.filter(schedule=schedule).first()
                if occurrence is None:
                    return False
                ids[(task, "scheduled")] = str(occurrence.id)
            return True

        support.wait_until(occurrences_known, timeout=60, what="the occurrences")

        def all_final() -> bool:
            events = listener.events
            for task_id in ids.values():
                done = [
                    e for e in events
                    if e.get("uuid") == task_id and e["type"] in ("task-succeeded", "task-failed")
                ]  # fmt: skip
                if not done or client.backend.get_task_meta(task_id)["status"] not in FINAL:
                    return False
                if http_json(f"{base}/api/task/info/{task_id}").get("state") not in FINAL:
                    return False
            return True

        try:
            support.wait_until(all_final, timeout=120, what="every run final in every tool")
        except AssertionError:
            pytest.fail(
                f"ids: {ids}\n"
                + "\n".join(f"{i}: {client.backend.get_task_meta(i)}" for i in ids.values())
                + "\n"
                + support.tail(worker_log, 80)
            )
        flower_seen = {task_id: from_flower(base, task_id) for task_id in ids.values()}
    listener.close()
    log_text = worker_log.read_text(errors="replace")
    signal_records = read_jsonl(probes / "signals.jsonl")
    sentry_items = read_jsonl(probes / "sentry.jsonl")
    spans = read_jsonl(probes / "otel.jsonl")

    def seen(task_id: str) -> dict[str, Any]:
        return masked(
            {
                "result backend": from_backend(client, task_id),
                "events": from_events(listener.events, task_id),
                "worker log": from_log(log_text, task_id),
                "signals": from_signals(signal_records, task_id),
                "Flower": flower_seen[task_id],
                "Sentry": from_sentry(sentry_items, task_id),
                "OpenTelemetry": from_otel(spans, task_id),
            },
            task_id,
        )

    allowed = intended_differences()
    unexpected: list[str] = []
    observed: set[tuple[str, str]] = set()
    for task, *_ in CASES:
        plain = seen(ids[(task, "plain")])
        scheduled = seen(ids[(task, "scheduled")])
        # Each tool recorded the plain run as that task (else equality proves nothing).
        assert plain["result backend"]["name"] == task  # result_extended is on
        assert plain["Flower"]["name"] == task
        assert plain["worker log"]["lines"]
        if task in KILLED:
            assert plain["result backend"]["state"] == "FAILURE", plain["result backend"]
            assert any(k.endswith(":task_failure") for k in plain["signals"])
        else:
            assert plain["Sentry"]["transaction"]["name"] == task
            assert f"span run/{task}" in plain["OpenTelemetry"]
            assert any(k.endswith(":task_prerun") for k in plain["signals"])
        for tool in plain:
            for field in differences(plain[tool], scheduled[tool]):
                line = (
                    f"{task} | {tool} | {field} | plain: {_at(plain[tool], field)!r} "
                    f"| scheduled: {_at(scheduled[tool], field)!r}"
                )
                observed.add((tool, _generic(field, task)))
                if (tool, _generic(field, task)) not in allowed:
                    unexpected.append(line)
    assert not unexpected, "differences not in README's table:\n" + "\n".join(unexpected)
    # The table lists only differences that happen: a stale row would mislead users.
    assert not allowed - observed, f"README rows never observed: {sorted(allowed - observed)}"


def _generic(field: str, task: str) -> str:
    """The table names fields with ``<task>`` for the task name."""
    return field.replace(task, "<task>")


def _at(record: Any, path: str) -> Any:
    node = record
    for key in path.split(" > "):
        if not isinstance(node, dict) or key not in node:
            return "<absent>"
        node = node[key]
    return node


def _up(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/healthcheck", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False
