"""Top-of-the-hour benchmark: N strict jobs due at one instant T, K beat processes.

    python -m bench.topofhour --sizes 10000 --nodes 1,2 --systems ours,dcb,redbeat

For every (system, N, K): fresh database / Redis dbs, seed N jobs due at T = now + lead,
start a drain consumer (``bench.drain``), start K ``celery beat`` processes, wait until all
N task ids reached the broker or ``--timeout`` seconds after T, then stop everything.
Lag of a message = its arrival on the Redis queue - T. Prints N, K, p50/p95/p99/max lag,
time to drain, peak RSS (VmHWM) of each beat process, messages/s, and for ``ours`` the
database's own ``enqueued_at - scheduled_for`` as a cross-check; writes all of it to
``bench/results/<timestamp>.json``. See bench/README.md.

``--broker rabbitmq`` publishes to RabbitMQ (vhost ``bench``) instead of Redis db 9 (redbeat
keeps its own keys in Redis db 10). The arrival clock (``--clock``) is ``sample`` by default:
``bench.arrivals`` samples the queue length without consuming and reads the messages after
the run; ``drain`` (Redis only) is the earlier ``bench.drain`` consumer.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import redis

ROOT = Path(__file__).resolve().parents[1]
PG = "postgres://postgres@127.0.0.1:5432"
BROKERS = {
    "redis": "redis://127.0.0.1:6379/9",
    # Its own vhost: rabbitmqctl add_vhost bench; set_permissions -p bench guest ".*" ".*" ".*"
    "rabbitmq": "amqp://guest:guest@127.0.0.1:5672/bench",
}
BROKER = BROKERS["redis"]
REDBEAT = "redis://127.0.0.1:6379/10"

SYSTEMS: dict[str, dict[str, str]] = {
    # Our defaults on PostgreSQL + Redis: set-based materializer, burst relay, fast publisher.
    "ours": {"scheduler": "celery_scheduler.beat:DatabaseScheduler", "db": "cs_scale_bench_ours"},
    # The same scheduler with the per-schedule materializer and the lookahead relay pinned.
    "ours-classic": {
        "scheduler": "celery_scheduler.beat:DatabaseScheduler",
        "db": "cs_scale_bench_ours",
        "env": "CELERY_SCHEDULER_BULK_MATERIALIZE=0 CELERY_SCHEDULER_BURST_RELAY=0",
    },
    # RabbitMQ with publisher confirms: kombu waits for the broker's ack of every message,
    # so "published" means the broker took responsibility for it (persisted: the default
    # queue is durable and Celery's messages persistent). kombu's default does not confirm.
    "ours-confirm": {
        "scheduler": "celery_scheduler.beat:DatabaseScheduler",
        "db": "cs_scale_bench_ours",
        "settings": "bench.confirm_settings",
    },
    "dcb": {
        "scheduler": "django_celery_beat.schedulers:DatabaseScheduler",
        "db": "cs_scale_bench_dcb",
        "settings": "bench.dcb_settings",
    },
    "redbeat": {
        "scheduler": "redbeat.RedBeatScheduler",
        "db": "cs_scale_bench_redbeat",
        "settings": "bench.redbeat_settings",
    },
}
#: One process at a time may run these (no leader election of their own, or a lock).
SINGLE_NODE = {"dcb", "redbeat"}


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def summary(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    return {
        "p50": percentile(values, 0.50),
        "p95": percentile(values, 0.95),
        "p99": percentile(values, 0.99),
        "max": values[-1] if values else float("nan"),
    }


def p99_all(lags: list[float], n: int) -> float | None:
    """p99 over all N jobs, or None when more than 1% never arrived (p99 > timeout)."""
    if not lags or len(lags) < 0.99 * n:
        return None
    return percentile(sorted(lags) + [float("inf")] * (n - len(lags)), 0.99)


def reset_database(name: str) -> None:
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def env_for(
    system: str, lead: float, extra: dict[str, str] | None = None, *, broker: str = BROKER
) -> dict[str, str]:
    spec = SYSTEMS[system]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CELERY_SCHEDULER_FAULT")}
    env.update(
        DATABASE_URL=f"{PG}/{spec['db']}",
        CELERY_BROKER_URL=broker,
        DJANGO_SETTINGS_MODULE=spec.get("settings", "example_project.settings"),
        BENCH_REDBEAT_URL=REDBEAT,
        # Materialize from the start: the whole lead time is inside the horizon.
        CELERY_SCHEDULER_HORIZON=str(int(lead) + 60),
        # Claim + prepare as soon as rows exist: one process prepares ~10-25k rows/s here,
        # so the default 30 s window is too short for N = 500,000 on one node.
        CELERY_SCHEDULER_BURST_LOOKAHEAD=str(int(lead)),
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
    )
    env.update(item.partition("=")[::2] for item in spec.get("env", "").split())
    env.update(extra or {})
    return env


def peak_rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def stop(process: subprocess.Popen[bytes], timeout: float = 15) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout)


def db_lag(system: str) -> dict[str, Any] | None:
    """Our own record of the lag: Occurrence.enqueued_at - scheduled_for (set after publish)."""
    if not system.startswith("ours"):
        return None
    with psycopg.connect(f"{PG}/{SYSTEMS[system]['db']}") as conn:
        row = conn.execute(
            "SELECT count(*), percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP "
            "(ORDER BY extract(epoch FROM enqueued_at - scheduled_for)), "
            "max(extract(epoch FROM enqueued_at - scheduled_for)) "
            "FROM django_app_occurrence WHERE enqueued_at IS NOT NULL"
        ).fetchone()
        # Which beat sent each row (claimed_by stays on a sent row): how K beats split it.
        split = conn.execute(
            "SELECT split_part(claimed_by, '/', 1), count(*) FROM django_app_outboxentry "
            "WHERE sent_at IS NOT NULL GROUP BY 1 ORDER BY 2 DESC"
        ).fetchall()
    assert row is not None
    count, (p50, p95, p99), worst = row[0], row[1] or (None, None, None), row[2]
    as_float = [None if v is None else float(v) for v in (p50, p95, p99, worst)]
    return {
        "enqueued": count,
        **dict(zip(("p50", "p95", "p99", "max"), as_float, strict=True)),
        "sent_by": [n for _, n in split],
    }


def wait_for_marks(system: str, arrived: int, *, deadline: float) -> None:
    if not system.startswith("ours"):
        return
    with psycopg.connect(f"{PG}/{SYSTEMS[system]['db']}", autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM django_app_occurrence WHERE enqueued_at IS NOT NULL"
            ).fetchone()
            if row is not None and row[0] >= arrived:
                return
            time.sleep(0.2)


def reset_broker(broker: str) -> None:
    if broker.startswith("redis"):
        redis.Redis.from_url(broker).flushdb()
        return
    from bench.arrivals import open_queue

    queue = open_queue(broker)
    queue.purge()
    queue.close()


def run_one(
    system: str,
    n: int,
    k: int,
    *,
    lead: float,
    timeout: float,
    logdir: Path,
    broker: str = BROKER,
    clock: str = "sample",
) -> dict:
    spec = SYSTEMS[system]
    kind = "redis" if broker.startswith("redis") else "rabbitmq"
    print(
        f"\n== {system} on {kind}: N={n} K={k} (lead {lead:.0f}s, timeout {timeout:.0f}s, "
        f"clock {clock})  load {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        flush=True,
    )
    reset_database(spec["db"])
    reset_broker(broker)
    redis.Redis.from_url(REDBEAT).flushdb()
    at = (datetime.now(UTC) + timedelta(seconds=lead)).replace(microsecond=0)
    env = env_for(system, lead, broker=broker)
    subprocess.run(
        [sys.executable, "-m", "bench.seed", system.split("-")[0], str(n), at.isoformat()],
        cwd=ROOT,
        env=env,
        check=True,
    )
    if datetime.now(UTC) > at - timedelta(seconds=5):
        raise SystemExit(f"seeding {n} took past T - 5s; raise --lead")
    t_epoch = at.timestamp()
    out = logdir / f"{system}-{kind}-{n}-{k}-arrivals.json"
    deadline = str(t_epoch + timeout)
    if clock == "drain":
        command = ["bench.drain", broker, str(n), deadline, str(out)]
    else:
        command = ["bench.arrivals", broker, "celery", str(n), deadline, str(out), "--settle", "10"]
    drain = subprocess.Popen([sys.executable, "-m", *command], cwd=ROOT, env=env)
    beats = []
    for i in range(k):
        log = (logdir / f"{system}-{kind}-{n}-{k}-beat{i}.log").open("wb")
        beats.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "example_project",
                    "beat",
                    "-S",
                    spec["scheduler"],
                    "--loglevel",
                    "INFO" if system.startswith("ours") else "WARNING",
                    "--pidfile=",
                    "-s",
                    str(logdir / f"{system}-beat{i}.schedule"),
                ],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        log.close()
    started = time.time()
    drain.wait()
    load_end = " ".join(f"{x:.2f}" for x in os.getloadavg())
    data = json.loads(out.read_text())
    if clock == "sample":
        # Same shape as bench.drain's output: first arrival per task id, deliveries.
        first: dict[str, float] = {}
        for message in data["messages"]:
            first.setdefault(message[1], message[0])
        data = {"arrivals": first, "deliveries": len(data["messages"])}
    # The broker has every message; our beats mark them sent right after (same wave
    # transaction). Stopping a beat before that commit rolls the marks back (and re-sends
    # on restart, at-least-once), so wait for the marks before stopping it.
    wait_for_marks(system, len(data["arrivals"]), deadline=time.monotonic() + 60)
    rss = [peak_rss_mb(b.pid) for b in beats]
    alive = [b.poll() is None for b in beats]
    for beat in beats:
        stop(beat)
    arrivals = sorted(data["arrivals"].values())
    lags = [a - t_epoch for a in arrivals]
    span = (arrivals[-1] - arrivals[0]) if len(arrivals) > 1 else 0.0
    result = {
        "system": system,
        "broker": kind,
        "clock": clock,
        "load_at_end": load_end,
        "N": n,
        "K": k,
        "T": at.isoformat(),
        "lead_s": lead,
        "timeout_s": timeout,
        "arrived": len(arrivals),
        "deliveries": data["deliveries"],
        "duplicates": data["deliveries"] - len(arrivals),
        "lag_s": summary(lags),
        "drain_s": lags[-1] if lags else None,
        # Over all N: a job that never arrived counts as later than any that did.
        "p99_all_s": p99_all(lags, n),
        "msgs_per_s": (len(arrivals) / span) if span else None,
        "beat_peak_rss_mb": rss,
        "beats_alive_at_end": alive,
        "beat_start_before_T_s": round(t_epoch - started, 1),
        "db_lag_s": db_lag(system),
    }
    print_result(result)
    return result


def print_result(r: dict) -> None:
    lag = r["lag_s"]
    rate = f"{r['msgs_per_s']:.0f}" if r["msgs_per_s"] else "-"
    print(
        f"{r['system']:>9} {r.get('broker', 'redis')} N={r['N']:<7} K={r['K']} "
        f"arrived {r['arrived']}/{r['N']} "
        f"(dups {r['duplicates']})  lag p50 {lag['p50']:.2f}s p95 {lag['p95']:.2f}s "
        f"p99 {lag['p99']:.2f}s max {lag['max']:.2f}s  drain {r['drain_s'] or 0:.2f}s  "
        f"{rate} msg/s  beat RSS MB {[round(x or 0) for x in r['beat_peak_rss_mb']]}",
        flush=True,
    )
    if r["db_lag_s"]:
        d = r["db_lag_s"]
        print(
            f"{'':>9} db enqueued_at-scheduled_for: {d['enqueued']} rows, p99 {d['p99']}s; "
            f"sent per beat {d['sent_by']}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000")
    parser.add_argument("--nodes", default="1")
    parser.add_argument("--systems", default="ours,dcb,redbeat")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds after T")
    parser.add_argument("--lead", type=float, default=0.0, help="seconds to T (0: auto)")
    parser.add_argument("--broker", default="redis", help="redis, rabbitmq or both: redis,rabbitmq")
    parser.add_argument("--clock", choices=("sample", "drain"), default="sample")
    args = parser.parse_args()
    brokers = args.broker.split(",")
    if set(brokers) - set(BROKERS):
        parser.error(f"--broker: one of {sorted(BROKERS)}")
    if args.clock == "drain" and "rabbitmq" in brokers:
        parser.error("--clock drain reads Redis only")
    sizes = [int(x) for x in args.sizes.split(",")]
    nodes = [int(x) for x in args.nodes.split(",")]
    systems = args.systems.split(",")
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        parser.error(f"unknown systems {sorted(unknown)}; known: {sorted(SYSTEMS)}")
    logdir = Path(tempfile.mkdtemp(prefix="cs_bench_"))
    print(f"logs and arrival files: {logdir}")
    results = []
    for n in sizes:
        lead = args.lead or max(30.0, 20.0 + n / 2000)
        for system in systems:
            for k in [1] if system in SINGLE_NODE else nodes:
                for broker in brokers:
                    if system == "ours-confirm" and broker != "rabbitmq":
                        continue  # confirm_publish is an AMQP option
                    results.append(
                        run_one(
                            system,
                            n,
                            k,
                            lead=lead,
                            timeout=args.timeout,
                            logdir=logdir,
                            broker=BROKERS[broker],
                            clock=args.clock,
                        )
                    )
    print("\n== p99 ratios (other system / ours) at the same N, K=1")
    for r in results:
        if r["system"] in SINGLE_NODE:
            for ours in (x for x in results if x["system"].startswith("ours")):
                same = ours["N"] == r["N"] and ours["broker"] == r["broker"]
                if same and ours["K"] == 1 and ours["p99_all_s"]:
                    if r["p99_all_s"] is None:
                        print(
                            f"  {r['broker']} N={r['N']}: {r['system']} p99 > "
                            f"{r['timeout_s']:.0f}s (only "
                            f"{r['arrived']}/{r['N']} arrived); {ours['system']} p99 "
                            f"{ours['p99_all_s']:.2f}s"
                        )
                        continue
                    ratio = r["p99_all_s"] / ours["p99_all_s"]
                    print(
                        f"  {r['broker']} N={r['N']}: {r['system']} / {ours['system']} = "
                        f"{ratio:.1f}x"
                        f" (arrived {r['arrived']}/{r['N']} within {r['timeout_s']:.0f}s)"
                    )
    outdir = ROOT / "bench" / "results"
    outdir.mkdir(exist_ok=True)
    path = outdir / f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    path.write_text(json.dumps({"results": results, "logdir": str(logdir)}, indent=2))
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
