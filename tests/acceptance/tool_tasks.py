"""Tasks and Celery-tool probes for the differential test (``celery worker -I`` imports it).

Set ``TOOLS_PROBE_DIR`` and the worker records, one JSON line each, what three tools saw:

- ``signals.jsonl``: every ``task_prerun``/``task_postrun``/``task_success``/
  ``task_failure``/``task_retry`` (the sender's task name, task id, args, kwargs, outcome);
- ``sentry.jsonl``: the envelopes sentry-sdk's Celery integration sends (a test transport);
- ``otel.jsonl``: the spans opentelemetry-instrumentation-celery ends (an in-memory
  exporter that also writes each batch out: the pool child's memory is not the test's).

Sentry is initialised at import, in the worker's main process before the pool forks (as
Sentry documents for Celery); OpenTelemetry in each pool process (``worker_process_init``,
as its documentation says).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from celery import shared_task, signals
from celery.exceptions import SoftTimeLimitExceeded

PROBE_DIR = os.environ.get("TOOLS_PROBE_DIR", "")


def _write(name: str, record: dict[str, Any]) -> None:
    with open(Path(PROBE_DIR) / name, "a") as out:
        out.write(json.dumps(record, default=repr) + "\n")


# -- the tasks: the same five sent by apply_async and fired by the scheduler ----------------


@shared_task(name="tools.returns")
def returns(x: int, label: str = "") -> dict[str, Any]:
    return {"x": x, "double": 2 * x, "label": label}


@shared_task(name="tools.raises")
def raises(customer: int) -> None:
    raise ValueError(f"customer {customer} has no billing address")


@shared_task(
    name="tools.retries",
    bind=True,
    autoretry_for=(ConnectionError,),
    max_retries=1,
    default_retry_delay=1,
)
def retries(self: Any, feed: str) -> str:
    """Fails its first try (ConnectionError), succeeds the second: counted per task id."""
    marker = Path(PROBE_DIR) / f"tries-{self.request.id}"
    tries = int(marker.read_text()) + 1 if marker.exists() else 1
    marker.write_text(str(tries))
    if tries == 1:
        raise ConnectionError(f"{feed}: upstream reset the connection")
    return f"polled {feed}"


@shared_task(name="tools.soft_limited", soft_time_limit=1)
def soft_limited(seconds: float) -> str:
    try:
        time.sleep(seconds)
    except SoftTimeLimitExceeded:
        raise
    return "finished"  # pragma: no cover - the soft limit always hits first


@shared_task(name="tools.hard_limited", time_limit=1)
def hard_limited(seconds: float) -> str:
    time.sleep(seconds)  # the pool kills the process after time_limit
    return "finished"  # pragma: no cover - the hard limit always hits first


# -- probes -----------------------------------------------------------------------------


def _on(kind: str) -> Any:
    def handler(sender: Any = None, **kw: Any) -> None:
        if not PROBE_DIR:
            return
        task = kw.get("task") or sender
        request = kw.get("request")
        task_id = kw.get("task_id") or getattr(request, "id", None)
        if task_id is None and task is not None:
            task_id = task.request.id
        record: dict[str, Any] = {
            "signal": kind,
            "sender": getattr(sender, "name", repr(sender)),
            "task_id": task_id,
        }
        if kind in ("task_prerun", "task_postrun", "task_failure"):
            record["args"] = kw.get("args")
            record["kwargs"] = kw.get("kwargs")
        if kind == "task_postrun":
            record["state"] = kw.get("state")
            record["retval"] = repr(kw.get("retval"))
        if kind == "task_success":
            record["result"] = repr(kw.get("result"))
        if kind == "task_failure":
            record["exception"] = repr(kw.get("exception"))
        if kind == "task_retry":
            record["reason"] = repr(getattr(kw.get("reason"), "exc", None))
            record["request_args"] = getattr(request, "args", None)
            record["request_kwargs"] = getattr(request, "kwargs", None)
        _write("signals.jsonl", record)

    return handler


_HANDLERS = {
    name: _on(name)
    for name in ("task_prerun", "task_postrun", "task_success", "task_failure", "task_retry")
}
for _name, _handler in _HANDLERS.items():
    getattr(signals, _name).connect(_handler, weak=False)


def _init_sentry() -> None:
    import sentry_sdk
    from sentry_sdk.integrations.celery import CeleryIntegration
    from sentry_sdk.transport import Transport

    class FileTransport(Transport):
        """A test transport: every envelope item as one JSON line, nothing sent."""

        def capture_envelope(self, envelope: Any) -> None:
            for item in envelope.items:
                payload = item.payload.json
                if payload is not None:
                    _write("sentry.jsonl", {"type": item.type, "payload": payload})

    sentry_sdk.init(
        dsn="http://public@127.0.0.1:9/1",  # never contacted: the transport writes files
        transport=FileTransport,
        integrations=[CeleryIntegration()],
        traces_sample_rate=1.0,
        send_default_pii=True,  # Sentry's task args/kwargs are then comparable too
        default_integrations=False,
    )


def _init_otel(**_: Any) -> None:
    from opentelemetry import trace
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    class WritingExporter(InMemorySpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            for span in spans:
                _write(
                    "otel.jsonl",
                    {
                        "name": span.name,
                        "kind": str(span.kind),
                        "status": str(span.status.status_code),
                        "attributes": dict(span.attributes or {}),
                        "events": [e.name for e in span.events],
                    },
                )
            return super().export(spans)

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(WritingExporter()))
    trace.set_tracer_provider(provider)
    CeleryInstrumentor().instrument(tracer_provider=provider)


if PROBE_DIR:
    _init_sentry()
    signals.worker_process_init.connect(_init_otel, weak=False)
