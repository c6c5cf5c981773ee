"""Steady state at the top of the hour, as an operator runs it: N hourly crons, DEFAULT settings.

    python -m bench.steady_state --size 100000 --nodes 1 [--outage]

One run (see bench/README.md, "Steady state"):

1. recreate the PostgreSQL database ``cs_steady_bench`` and migrate; create 10 tenants
   (``api.create_tenant``, no quotas);
2. pick T = the next minute boundary at least ``--lead-beats`` (default 150) s plus the
   estimated creation time away, and create N schedules ``cron="M * * * *"`` (M = T's
   minute, UTC), task ``billing.ping``, spread round-robin over the tenants, through the
   public API: ``api.create_schedules`` (bulk) when the package has it, else
   ``api.create_schedule`` once per schedule in ``--create-procs`` parallel processes
   (default 2, each owning a disjoint set of tenants: a creation locks its tenant's row).
   ``--create mirror`` writes the same rows by bulk insert (see ``mirror_create``) when
   neither is fast enough on a loaded machine; The
   creation time is estimated by creating ``--calibrate`` schedules the same way in a scratch
   database first (``cs_steady_calib``), or given with ``--create-seconds``;
3. start the arrival sampler (``bench.arrivals``) on the empty Redis queue (db 11): it
   samples ``LLEN celery`` every 20 ms without consuming, and reads the messages afterwards;
4. at T - ``--lead-beats`` start K ``celery -A example_project beat -S
   celery_scheduler.beat:DatabaseScheduler`` processes with the project's DEFAULT settings:
   every ``CELERY_SCHEDULER*`` variable is removed from their environment, so
   ``CELERY_SCHEDULER`` is ``{}`` (the example project's settings only map those variables);
   ``--outage``: the beats start only 30 s before T and the schedules were created at
   least 330 s before T, i.e. no beat ran during the 5 minutes before (cold start with
   every occurrence of T still to materialize);
5. stop when N messages were counted and ``--settle`` more seconds passed, or
   ``--timeout`` seconds after T; wait for the beats' marks, read their peak RSS
   (``VmHWM``) and stop them.

Prints and writes to ``bench/results/steady-<UTC timestamp>.json``: N, K, arrived
(distinct occurrence ids), duplicates (deliveries of an occurrence id already seen, and
occurrences of one (schedule, instant) under two ids), early (arrived before T), lag =
arrival - T (p50/p95/p99/max and p99 over all N), on time within 1 s / 5 s, per-tenant
p99, each beat's peak RSS, which beat sent how many (``OutboxEntry.claimed_by`` of sent
rows), the database's ``enqueued_at - scheduled_for``, the occurrence states, and the load
average at T and at the end (the machine has two cores).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import redis

from bench.topofhour import peak_rss_mb, percentile, reset_database, stop, summary

ROOT = Path(__file__).resolve().parents[1]
PG = "postgres://postgres@127.0.0.1:5432"
DB = "cs_steady_bench"
CALIB_DB = "cs_steady_calib"
BROKER = "redis://127.0.0.1:6379/11"
TASK = "billing.ping"
BULK_CHUNK = 10_000
OUTAGE_S = 300


def base_env(db: str, broker: str, data_dir: Path) -> dict[str, str]:
    """The environment of every subprocess: our DB and broker, no scheduler overrides."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CELERY_SCHEDULER")}
    env.update(
        DATABASE_URL=f"{PG}/{db}",
        CELERY_BROKER_URL=broker,
        DJANGO_SETTINGS_MODULE="example_project.settings",
        # A data directory only (SQLite files of the example project's defaults, unused).
        CELERY_SCHEDULER_DATA_DIR=str(data_dir),
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
    )
    return env


# -- creation (subprocesses with Django set up) ----------------------------------------------


def _worker(argv: list[str]) -> None:
    """``--worker migrate TENANTS`` or ``--worker create MODE N MINUTE TENANTS PROCS P``."""
    import django

    django.setup()
    from celery_scheduler import api

    if argv[0] == "migrate":
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)
        for i in range(int(argv[1])):
            api.create_tenant(f"t{i}", name=f"tenant {i}")
        return
    mode = argv[1]
    n, minute, tenants, procs, p = (int(x) for x in argv[2:7])
    # Process p creates the schedules of the tenants t with t % procs == p: creation locks
    # the tenant row (quota check), so processes sharing tenants would wait for each other.
    specs = [
        {
            "name": f"hourly-{i}",
            "task": TASK,
            "tenant": f"t{i % tenants}",
            "cron": f"{minute} * * * *",
            "args": [i],
        }
        for i in range(n)
        if (i % tenants) % procs == p
    ]
    if mode == "mirror":
        for at in range(0, len(specs), BULK_CHUNK):
            mirror_create(specs[at : at + BULK_CHUNK])
    elif mode == "bulk":
        # create_schedules takes the tenant once per call: one call per tenant and chunk.
        by_tenant: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for spec in specs:
            item = dict(spec)
            by_tenant[item.pop("tenant")].append(item)
        for slug, items in by_tenant.items():
            for at in range(0, len(items), BULK_CHUNK):
                api.create_schedules(items[at : at + BULK_CHUNK], tenant=slug)
    else:
        for spec in specs:
            api.create_schedule(**spec)


def mirror_create(specs: list[dict[str, Any]]) -> None:
    """``--create mirror``: the rows ``api.create_schedule`` writes, by bulk insert.

    Per spec the same steps as ``lifecycle.create_schedule`` (validate, content hash, shard,
    first run, version 1 valid from now, the "create" audit entry), then one bulk insert per
    table and chunk. For when the one-call-per-schedule API is too slow to create 100,000+
    schedules on a loaded machine and ``api.create_schedules`` does not exist yet: the beats
    see the same rows either way (no quota is set on the bench's tenants).
    """
    from django_app.schedules import validation

    # Before the registry was cached per process, validate() asked Celery for the task
    # names on every call and that import step re-ran Django's system checks (~10-40 ms):
    # read it once per chunk (the same names; the same validation otherwise).
    names = validation.registered_task_names()
    real = validation.registered_task_names
    validation.registered_task_names = lambda **_: names
    try:
        _mirror_chunk(specs)
    finally:
        validation.registered_task_names = real


def _mirror_chunk(specs: list[dict[str, Any]]) -> None:
    from django.db import transaction

    from celery_scheduler.core import ids
    from celery_scheduler.core.clock import SYSTEM_CLOCK
    from django_app import conf
    from django_app.models import AuditEntry, Schedule, ScheduleVersion, Tenant
    from django_app.schedules import lifecycle, validation

    now = SYSTEM_CLOCK.now()
    shard_count = conf.get().shard_count
    tenants = {t.slug: t for t in Tenant.objects.all()}
    schedules, versions, entries = [], [], []
    for values in specs:
        values = dict(values)
        tenant = tenants[values.pop("tenant")]
        extras = validation.validate_extras({})
        spec = validation.validate(now=now, **values)
        schedule = Schedule(
            tenant=tenant, idempotency_key=None, content_hash=lifecycle.content_hash(spec, extras),
            source="api", max_runs=None, pause_after_failures=None, **spec.model_fields(),
        )  # fmt: skip
        schedule.shard = ids.shard_for(schedule.id, shard_count)
        schedule.next_run_at = lifecycle.first_run(spec, schedule.start_at, now)
        schedules.append(schedule)
        versions.append(
            ScheduleVersion(
                schedule=schedule, version=schedule.version, kind=schedule.kind,
                cron=schedule.cron, timezone=schedule.timezone,
                interval_seconds=schedule.interval_seconds, run_at=schedule.run_at,
                start_at=schedule.start_at, end_at=schedule.end_at,
                valid_from=min(now, schedule.next_run_at or now), valid_to=None,
            )
        )  # fmt: skip
        entries.append(
            AuditEntry(at=now, tenant_id=tenant.pk, schedule=schedule, action="create",
                       actor="", reason="", detail={})
        )  # fmt: skip
    with transaction.atomic():
        Schedule.objects.bulk_create(schedules)
        ScheduleVersion.objects.bulk_create(versions)
        AuditEntry.objects.bulk_create(entries)


def create_mode(requested: str) -> str:
    """``api``: ``api.create_schedules`` if the package has it (``bulk``), else per call."""
    from celery_scheduler import api

    if requested == "api":
        return "bulk" if hasattr(api, "create_schedules") else "each"
    return requested


def run_django(env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.steady_state", "--worker", *args], cwd=ROOT, env=env
    )


def create(env: dict[str, str], mode: str, n: int, minute: int, tenants: int, procs: int) -> float:
    """Create N schedules in ``procs`` processes; returns the wall time."""
    started = time.monotonic()
    procs = min(procs, tenants)
    workers = [
        run_django(env, "create", mode, str(n), str(minute), str(tenants), str(procs), str(p))
        for p in range(procs)
    ]
    for w in workers:
        if w.wait() != 0:
            raise SystemExit(f"a creating process failed ({w.returncode})")
    return time.monotonic() - started


def prepare_db(db: str, env: dict[str, str], tenants: int) -> None:
    reset_database(db)
    if run_django(env, "migrate", str(tenants)).wait() != 0:
        raise SystemExit("migrate failed")


def start_beat(env: dict[str, str], log: Path, schedule: Path) -> subprocess.Popen[bytes]:
    """``celery -A example_project beat -S celery_scheduler.beat:DatabaseScheduler``,
    logging at INFO into ``log``."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "example_project", "beat",
             "-S", "celery_scheduler.beat:DatabaseScheduler", "--loglevel", "INFO",
             "--pidfile=", "-s", str(schedule)],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


# -- analysis -----------------------------------------------------------------------------


def db_report(db: str) -> dict[str, Any]:
    with psycopg.connect(f"{PG}/{db}") as conn:
        row = conn.execute(
            "SELECT count(*), percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP "
            "(ORDER BY extract(epoch FROM enqueued_at - scheduled_for)), "
            "max(extract(epoch FROM enqueued_at - scheduled_for)), "
            "count(*) FILTER (WHERE enqueued_at < scheduled_for) "
            "FROM django_app_occurrence WHERE enqueued_at IS NOT NULL"
        ).fetchone()
        states = dict(
            conn.execute("SELECT state, count(*) FROM django_app_occurrence GROUP BY 1").fetchall()
        )
        split = conn.execute(
            "SELECT split_part(claimed_by, '/', 1), count(*) FROM django_app_outboxentry "
            "WHERE sent_at IS NOT NULL GROUP BY 1 ORDER BY 2 DESC"
        ).fetchall()
    assert row is not None
    p50, p95, p99 = row[1] or (None, None, None)
    values = [None if v is None else round(float(v), 3) for v in (p50, p95, p99, row[2])]
    return {
        "enqueued": row[0],
        **dict(zip(("p50", "p95", "p99", "max"), values, strict=True)),
        "enqueued_before_scheduled_for": row[3],
        "states": states,
        "sent_by": dict(split),
    }


def analyse(messages: list[list[Any]], t_epoch: float, n: int) -> dict[str, Any]:
    first: dict[str, float] = {}
    tenant_of: dict[str, str] = {}
    by_instant: dict[tuple[str, str], set[str]] = defaultdict(set)
    early = 0
    for arrival, task_id, tenant, scheduled_for, schedule_id in messages:
        if arrival < t_epoch:
            early += 1
        first.setdefault(task_id, arrival)
        tenant_of[task_id] = tenant or "?"
        by_instant[(schedule_id, scheduled_for)].add(task_id)
    lags = [a - t_epoch for a in first.values()]
    per_tenant: dict[str, list[float]] = defaultdict(list)
    for task_id, arrival in first.items():
        per_tenant[tenant_of[task_id]].append(arrival - t_epoch)
    padded = sorted(lags) + [float("inf")] * max(0, n - len(lags))
    return {
        "deliveries": len(messages),
        "arrived": len(first),
        "duplicates": len(messages) - len(first),
        "same_instant_other_id": sum(len(ids) - 1 for ids in by_instant.values()),
        "scheduled_for": sorted({k[1] for k in by_instant})[:5],
        "early": early,
        "lag_s": {k: round(v, 3) for k, v in summary(lags).items()},
        "p99_all_s": percentile(padded, 0.99) if padded else None,
        "on_time_1s": sum(1 for x in lags if x <= 1),
        "on_time_5s": sum(1 for x in lags if x <= 5),
        "tenant_p99_s": {
            t: round(percentile(sorted(v), 0.99), 3) for t, v in sorted(per_tenant.items())
        },
        "tenant_arrived": {t: len(v) for t, v in sorted(per_tenant.items())},
    }


WAVE = re.compile(r"burst relay: (\d+) row\(s\) due (\S+) sent (\S+) after due")


def burst_waves(log: Path) -> list[str]:
    """The beat's burst waves from its log: ``rows@due sent <first>-<last>s after``."""
    text = log.read_text(errors="replace") if log.exists() else ""
    return [f"{n}@{due} sent {span}" for n, due, span in WAVE.findall(text)]


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def wait_for_marks(db: str, arrived: int, deadline: float) -> None:
    with psycopg.connect(f"{PG}/{db}", autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM django_app_occurrence WHERE enqueued_at IS NOT NULL"
            ).fetchone()
            if row is not None and row[0] >= arrived:
                return
            time.sleep(0.5)


# -- one run ------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    n, k = args.size, args.nodes
    logdir = Path(tempfile.mkdtemp(prefix="cs_steady_"))
    print(f"logs: {logdir}  load {load()}", flush=True)
    env = base_env(DB, BROKER, logdir)
    mode = create_mode(args.create)
    procs = args.create_procs or (2 if mode == "each" else 1)
    path = {
        "bulk": "api.create_schedules",
        "each": f"api.create_schedule x {procs} processes",
        "mirror": "mirror of create_schedule's rows (bulk insert)",
    }[mode]
    lead_beats = 30.0 if args.outage else args.lead_beats
    # Schedules must exist this long before T: the beats' lead, or the outage + its end.
    before_t = OUTAGE_S + 30.0 if args.outage else lead_beats

    estimate = args.create_seconds
    if estimate is None:
        m = min(n, args.calibrate)
        calib_env = base_env(CALIB_DB, BROKER, logdir)
        prepare_db(CALIB_DB, calib_env, args.tenants)
        took = create(calib_env, mode, m, 0, args.tenants, procs)
        estimate = took * n / m * 1.2 + 10
        print(f"calibration: {m} schedules via {path} in {took:.1f}s -> estimate {estimate:.0f}s")

    prepare_db(DB, env, args.tenants)
    earliest = datetime.now(UTC) + timedelta(seconds=estimate + before_t + 5)
    at = earliest.replace(second=0, microsecond=0) + timedelta(minutes=1)
    t_epoch = at.timestamp()
    print(f"== steady state N={n} K={k}{' outage' if args.outage else ''}: T={at:%H:%M:%S} "
          f"cron '{at.minute} * * * *', creating via {path}", flush=True)  # fmt: skip
    create_s = create(env, mode, n, at.minute, args.tenants, procs)
    rate = n / create_s
    print(f"created {n} in {create_s:.1f}s ({rate:.0f}/s); T in {t_epoch - time.time():.0f}s")
    if time.time() > t_epoch - before_t:
        raise SystemExit(
            f"creation overran the estimate ({create_s:.0f}s > {estimate:.0f}s): "
            "pass a larger --create-seconds"
        )
    redis.Redis.from_url(BROKER).flushdb()
    out = logdir / "arrivals.json"
    sampler = subprocess.Popen(
        [sys.executable, "-m", "bench.arrivals", BROKER, "celery", str(n),
         str(t_epoch + args.timeout), str(out), "--settle", str(args.settle)],
        cwd=ROOT, env=env,
    )  # fmt: skip
    time.sleep(max(0.0, t_epoch - lead_beats - time.time()))
    beats = []
    started = time.time()
    for i in range(k):
        beats.append(start_beat(env, logdir / f"beat{i}.log", logdir / f"beat{i}.schedule"))
    print(f"beats started {t_epoch - started:.1f}s before T  load {load()}", flush=True)
    time.sleep(max(0.0, t_epoch - time.time()))
    load_at_t = load()
    sampler.wait()
    load_end = load()
    data = json.loads(out.read_text())
    result = analyse(data["messages"], t_epoch, n)
    # A 250,000-row wave's marks take minutes here; stopping the beats before they commit
    # would leave the database cross-check reading SCHEDULED rows.
    wait_for_marks(DB, result["arrived"], time.monotonic() + args.marks_timeout)
    rss = [peak_rss_mb(b.pid) for b in beats]
    alive = [b.poll() is None for b in beats]
    for beat in beats:
        stop(beat)
    report = {
        "scenario": "steady_state" + ("+outage" if args.outage else ""),
        "N": n,
        "K": k,
        "T": at.isoformat(),
        "tenants": args.tenants,
        "create_path": path,
        "create_s": round(create_s, 1),
        "beats_started_before_T_s": round(t_epoch - started, 1),
        "timeout_s": args.timeout,
        **result,
        "beat_peak_rss_mb": [round(x or 0) for x in rss],
        "beats_alive_at_end": alive,
        # Rows the burst relay sent per beat (one log line per wave); the rest went out
        # through the general relay, whose sent rows keep claimed_by = "".
        "burst_waves": [burst_waves(logdir / f"beat{i}.log") for i in range(k)],
        "db": db_report(DB),
        "load_at_T": load_at_t,
        "load_at_end": load_end,
        "samples": len(data["samples"]),
        "logdir": str(logdir),
    }
    print_report(report)
    outdir = ROOT / "bench" / "results"
    outdir.mkdir(exist_ok=True)
    path_out = outdir / f"steady-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    path_out.write_text(json.dumps(report, indent=2))
    print(f"wrote {path_out}")
    return report


def print_report(r: dict[str, Any]) -> None:
    lag, d = r["lag_s"], r["db"]
    p99_all = "> timeout" if r["p99_all_s"] in (None, float("inf")) else f"{r['p99_all_s']:.2f}s"
    print(
        f"\n{r['scenario']} N={r['N']} K={r['K']}: arrived {r['arrived']}/{r['N']}, "
        f"duplicates {r['duplicates']} (other id same instant {r['same_instant_other_id']}), "
        f"early {r['early']}\n"
        f"  lag p50 {lag['p50']}s p95 {lag['p95']}s p99 {lag['p99']}s max {lag['max']}s; "
        f"p99 over all N {p99_all}; on time <=1s {r['on_time_1s']}, <=5s {r['on_time_5s']}\n"
        f"  per-tenant p99 s: {r['tenant_p99_s']}\n"
        f"  beat peak RSS MB {r['beat_peak_rss_mb']}; sent per beat {d['sent_by']}\n"
        f"  burst waves per beat: {r['burst_waves']}\n"
        f"  db enqueued_at - scheduled_for: {d['enqueued']} rows p50 {d['p50']} p99 {d['p99']} "
        f"max {d['max']} (before T: {d['enqueued_before_scheduled_for']}); states {d['states']}\n"
        f"  load (1/5/15 min) at T {r['load_at_T']}, at end {r['load_at_end']}",
        flush=True,
    )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _worker(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--tenants", type=int, default=10)
    parser.add_argument("--lead-beats", type=float, default=150.0, help="beats start at T - this")
    parser.add_argument("--outage", action="store_true", help="beats start at T - 30 s only")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds after T")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds after all arrived")
    parser.add_argument(
        "--marks-timeout", type=float, default=600.0,
        help="seconds to wait for the beats' marks after the arrivals",
    )  # fmt: skip
    parser.add_argument("--create", choices=("api", "each", "bulk", "mirror"), default="api")
    parser.add_argument("--create-procs", type=int, default=0, help="0: 2 (each) else 1")
    parser.add_argument("--create-seconds", type=float, default=None, help="skip calibration")
    parser.add_argument("--calibrate", type=int, default=2000, help="schedules to time first")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
