"""``celery-scheduler-demo``: the whole system on one machine, with no servers.

It also runs the invoice example (``billing.create_invoice``, daily, concurrency cap 1)
twice by hand and shows that ``@idempotent_task`` created one invoice.

A fresh data directory holds a SQLite database and an embedded broker (kombu's SQLAlchemy
transport over SQLite). The demo migrates, creates a few example schedules (strict, flexible,
one-off, and a DST-sensitive cron it only previews), starts ``celery beat`` with the
DatabaseScheduler and a solo-pool worker as subprocesses, prints occurrences as they fire with
their lag (``enqueued_at - scheduled_for``) and state, and stops everything after
``--seconds``.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parent.parent
#: Seconds between creating the schedules (beat and worker already up) and their first run.
START_DELAY = 3


def _configure(data_dir: Path) -> dict[str, str]:
    """Point this process and the subprocesses at the embedded database and broker."""
    env = dict(os.environ)
    for name in ("DATABASE_URL", "CELERY_BROKER_URL", "CELERY_SCHEDULER_FAULT"):
        env.pop(name, None)
        os.environ.pop(name, None)
    settings = {
        "CELERY_SCHEDULER_DATA_DIR": str(data_dir),
        "DJANGO_SETTINGS_MODULE": "example_project.settings",
        "PYTHONUNBUFFERED": "1",
    }
    env.update(settings)
    os.environ.update(settings)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    return env


def _create_schedules(now: datetime) -> Any:
    """The example schedules; returns the daily invoice schedule."""
    from celery_scheduler import api

    # Start a few seconds out so beat and the worker are up before the first fire time.
    start = now + timedelta(seconds=START_DELAY)
    api.create_schedule(
        name="strict every 5 s", task="billing.ping", interval=5, start_at=start,
        args=["strict"], idempotency_key="demo:strict",
    )  # fmt: skip
    api.create_schedule(
        name="flexible every 15 s (10 s window)", task="billing.ping", interval=15,
        start_at=start, flexible_window=10, args=["flexible"], idempotency_key="demo:flexible",
    )  # fmt: skip
    api.create_schedule(
        name="one-off", task="billing.ping", run_at=start + timedelta(seconds=7),
        args=["one-off"], idempotency_key="demo:one-off",
    )  # fmt: skip
    api.create_schedule(
        name="daily 02:30 Europe/Berlin", task="billing.ping", cron="30 2 * * *",
        timezone="Europe/Berlin", args=["dst"], idempotency_key="demo:dst",
    )  # fmt: skip
    # The invoice job: daily, at most one run at a time across all workers.
    return api.create_schedule(
        name="daily invoice acme", task="billing.create_invoice",
        args=["acme", f"{now:%Y-%m}"], cron="0 6 * * *", timezone="Europe/Berlin",
        concurrency_limit=1, concurrency_group="invoices", idempotency_key="demo:invoice",
    )  # fmt: skip


def _print_invoices(invoice_schedule: Any) -> None:
    """Two manual runs of the invoice job, one invoice: the business key deduplicated."""
    from django_app.models import Occurrence
    from example_project.billing.models import Invoice

    customer, period = invoice_schedule.args
    runs = Occurrence.objects.filter(schedule=invoice_schedule, manual=True).order_by("created_at")
    results = [f"{o.state} -> {o.result}" for o in runs]
    count = Invoice.objects.filter(customer=customer, period=period).count()
    print(f"\ninvoice job ran {len(results)} times (run now, twice): {results}")
    print(f"invoices for ({customer}, {period}): {count}  <- @idempotent_task returned the "
          "stored result the second time")  # fmt: skip


def _print_dst_preview() -> None:
    from celery_scheduler import api
    from celery_scheduler.core.clock import SYSTEM_CLOCK

    year = SYSTEM_CLOCK.now().year + 1
    start = datetime.fromisoformat(f"{year}-03-27T00:00:00+00:00")
    print(f"\n'30 2 * * *' in Europe/Berlin around the {year} spring-forward change:")
    for row in api.preview(cron="30 2 * * *", timezone="Europe/Berlin", start=start, count=4):
        note = f"  <- {row.note}" if row.note else ""
        print(f"  {row.utc:%Y-%m-%d %H:%M} UTC = {row.local:%Y-%m-%d %H:%M %Z}{note}")
    print("  (02:30 does not exist on the change day: that day is skipped, not shifted)")


def _start(env: dict[str, str], data_dir: Path) -> list[subprocess.Popen[bytes]]:
    celery = [sys.executable, "-m", "celery", "-A", "example_project"]
    commands = {
        "beat": [*celery, "beat", "-S", "celery_scheduler.beat:DatabaseScheduler",
                 "--loglevel=INFO", f"--schedule={data_dir / 'beat-unused'}"],
        "worker": [*celery, "worker", "--pool=solo", "--concurrency=1", "--loglevel=INFO",
                   "--without-gossip", "--without-mingle", "--without-heartbeat",
                   f"--hostname=demo@{os.getpid()}"],
    }  # fmt: skip
    procs = []
    for name, command in commands.items():
        log = (data_dir / f"{name}.log").open("wb")
        procs.append(subprocess.Popen(command, cwd=PROJECT_ROOT, env=env, stdout=log, stderr=log))
    return procs


def _wait_until_ready(procs: list[subprocess.Popen[bytes]], data_dir: Path) -> bool:
    """Wait (up to 60 s) until beat holds its shards and the worker consumes."""
    from django.db import connection

    from django_app.models import BeatNode

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if any(proc.poll() is not None for proc in procs):
            break
        worker_log = (data_dir / "worker.log").read_text(errors="replace")
        beat_up = BeatNode.objects.exists()
        connection.close()  # SQLite: no read snapshot held across polls
        if beat_up and " ready." in worker_log:
            return True
        time.sleep(0.3)
    print(f"beat or worker did not start; see the logs in {data_dir}")
    return False


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 15
    for proc in procs:
        try:
            proc.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _fmt_lag(value: float | None) -> str:
    return "      -" if value is None else f"{value:6.2f}s"


def run_label(name: str, *, manual: bool, version: int) -> str:
    """The schedule's name, with why the run exists when not by the schedule.

    The two manual invoice runs otherwise read like the daily 06:00 run firing early. Told
    by the row's origin, not its ``reason`` (a claim clears that when the run starts).
    """
    if not manual:
        return name
    # Backfilled runs live under schedule_version 0 (django_app.schedules.backfill).
    return f"{name} ({'backfill' if version == 0 else 'run now'})"


def _watch(seconds: float, procs: list[subprocess.Popen[bytes]], data_dir: Path) -> bool:
    """Print each occurrence as it moves; False if beat or the worker died."""
    from django.db import connection

    from django_app.models import Occurrence

    seen: dict[Any, str] = {}
    deadline = time.monotonic() + seconds
    print(
        f"\n{'scheduled for (UTC)':<15} {'schedule':<36} {'state':<10} {'lag':>7}  "
        "(lag = enqueued_at - scheduled_for; a flexible run is due at +jitter)"
    )
    while time.monotonic() < deadline:
        for proc, name in zip(procs, ("beat", "worker"), strict=True):
            if proc.poll() is not None:
                print(f"\n{name} exited with {proc.returncode}; see {data_dir / (name + '.log')}")
                return False
        rows = Occurrence.objects.select_related("schedule").order_by("scheduled_for")
        for o in rows:
            if seen.get(o.id) == o.state:
                continue
            seen[o.id] = o.state
            if o.state == "SCHEDULED":
                continue  # materialized ahead; shown once it moves
            jitter = (o.available_at - o.scheduled_for).total_seconds()
            print(
                f"{o.scheduled_for:%H:%M:%S.%f}"[:-3].ljust(15),
                f"{run_label(o.schedule.name, manual=o.manual, version=o.schedule_version):<36} "
                f"{o.state:<10} {_fmt_lag(o.lag_seconds)}",
                f" jitter +{jitter:g}s" if jitter else "",
            )
        connection.close()  # SQLite: do not hold a read snapshot across polls
        time.sleep(0.5)
    return True


#: A strict run is on time when it reached the broker within this many seconds.
ON_TIME_SECONDS = 5.0


def _summary(stopped_at: datetime, invoice_schedule: Any) -> bool:
    """The final state of every occurrence that was due, in time order, and a verdict."""
    from django_app.models import Occurrence
    from example_project.billing.models import Invoice

    due = list(
        Occurrence.objects.select_related("schedule")
        .filter(scheduled_for__lte=stopped_at, manual=False)
        .order_by("scheduled_for", "schedule__name")
    )
    print(f"\nfinal state of the {len(due)} scheduled runs that were due, in time order:")
    counts: dict[str, int] = {}
    for o in due:
        counts[o.state] = counts.get(o.state, 0) + 1
        print(
            f"  {o.scheduled_for:%H:%M:%S}  {o.schedule.name:<36} {o.state:<10} "
            f"{_fmt_lag(o.lag_seconds)}"
        )
    # Runs due in the last seconds before the stop may still have been in flight.
    settled = [o for o in due if o.scheduled_for <= stopped_at - timedelta(seconds=3)]
    strict = [o for o in settled if o.schedule.name.startswith(("strict", "one-off"))]
    late = [o for o in strict if o.lag_seconds is None or o.lag_seconds > ON_TIME_SECONDS]
    failed = [o for o in strict if o.state != "SUCCEEDED"]
    customer, period = invoice_schedule.args
    invoices = Invoice.objects.filter(customer=customer, period=period).count()
    summary = ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) or "nothing"
    print(f"\nby final state: {summary}")
    checks = {
        f"strict and one-off runs fired ({len(strict)})": bool(strict) and not failed,
        f"all of them on time (lag <= {ON_TIME_SECONDS:g} s; late: {len(late)})": not late,
        f"exactly one invoice ({invoices})": invoices == 1,
    }
    for what, ok in checks.items():
        print(f"  {'ok  ' if ok else 'FAIL'} {what}")
    return all(checks.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--seconds", type=float, default=45, help="how long to run (45)")
    parser.add_argument("--data-dir", type=Path, help="where to keep the DB and broker files")
    args = parser.parse_args(argv)
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="celery-scheduler-demo-"))
    data_dir.mkdir(parents=True, exist_ok=True)
    env = _configure(data_dir)

    import django
    from django.core.management import call_command

    django.setup()
    print(f"data dir: {data_dir} (SQLite database + SQLite-backed broker; no servers)")
    call_command("migrate", verbosity=0)
    from celery_scheduler.core.clock import SYSTEM_CLOCK

    _print_dst_preview()
    procs = _start(env, data_dir)
    # Plan the first runs once beat and the worker are up, so that "on time" measures the
    # scheduler and not how long a cold interpreter takes to start on a busy machine.
    if not _wait_until_ready(procs, data_dir):
        _stop(procs)
        return 1
    invoice_schedule = _create_schedules(SYSTEM_CLOCK.now())
    from celery_scheduler import api

    for _ in range(2):  # the same business key twice: one invoice
        api.run_now(invoice_schedule.id)
    print(f"\nbeat + worker started (logs in {data_dir}); running {args.seconds:g} s ...")
    try:
        alive = _watch(args.seconds, procs, data_dir)
    except KeyboardInterrupt:
        alive = False
    finally:
        stopped_at = SYSTEM_CLOCK.now()
        print("\nstopping beat and worker ...")
        _stop(procs)
    _print_invoices(invoice_schedule)
    ok = _summary(stopped_at, invoice_schedule) and alive
    print(f"{'done' if ok else 'FAILED'}. Data kept in {data_dir}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
