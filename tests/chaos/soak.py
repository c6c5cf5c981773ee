"""Run a chaos soak and judge it.

Long run (a dedicated database, created and migrated afresh)::

    python -m tests.chaos.soak --minutes 25 --seed 7 [--database cs_soak] [--schedules 240]

Short run: ``pytest -m chaos`` (``tests/chaos/test_chaos_soak.py``) on the test database.
Both print the seed first; the same seed replays the same schedule mix and the same plan of
lifecycle calls and faults at the same offsets (process timing still varies).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tests.chaos import effects as effect_log
from tests.chaos.cluster import ROOT, Cluster
from tests.chaos.driver import Driver, History
from tests.chaos.judge import JudgeConfig, Verdict, judge
from tests.chaos.plan import make_plan

#: A fire time must have had this long to run before the processes are stopped to be judged.
TAIL_SECONDS = 20
#: After the processes are up: beats take their shards, workers connect.
WARMUP_SECONDS = 10


@dataclass(frozen=True, kw_only=True)
class SoakConfig:
    seed: int
    chaos_seconds: float
    quiet_seconds: float
    schedules: int
    database_url: str
    log_dir: Path
    fallback_redis_url: str
    occurrence_lease: int = 6
    shard_lease: int = 6
    redelivery: int = 10
    shard_count: int = 16


@dataclass
class SoakResult:
    seed: int
    verdict: Verdict
    faults: dict[str, int]
    calls: dict[str, int]
    stops: dict[str, Any]
    driver_errors: list[str] = field(default_factory=list)
    reconcile_exit: int | None = None
    report: str = ""


def scheduler_settings(cfg: SoakConfig) -> dict[str, Any]:
    """Short leases so recovery happens within the run; only settings this code knows."""
    from django_app.conf import SchedulerSettings

    known = set(SchedulerSettings.__dataclass_fields__)
    wanted: dict[str, Any] = {
        "shard_count": cfg.shard_count,
        "occurrence_lease_seconds": cfg.occurrence_lease,
        "lease_seconds": cfg.shard_lease,
    }
    for name in known:
        if "redeliver" in name and name.endswith("seconds"):
            wanted[name] = cfg.redelivery
    return {k: v for k, v in wanted.items() if k in known}


def log(message: str) -> None:
    print(f"{datetime.now(UTC):%H:%M:%S} chaos: {message}", flush=True)


def run_soak(cfg: SoakConfig) -> SoakResult:
    """Drive, fault, quiet down, stop, reconcile and judge. Django must be set up already,
    on ``cfg.database_url``, with :func:`scheduler_settings` applied."""
    from django.db import connection

    cfg.log_dir.mkdir(parents=True, exist_ok=True)
    for stale in [*cfg.log_dir.glob("*.log"), *cfg.log_dir.glob("attempts-*.jsonl")]:
        stale.unlink()  # a reused folder: "ready." in an old log must not count
    plan = make_plan(cfg.seed, chaos_seconds=cfg.chaos_seconds, schedules=cfg.schedules)
    log(f"SEED {cfg.seed} -- {plan.summary()}; logs in {cfg.log_dir}")
    settings = scheduler_settings(cfg)
    log(f"settings {settings}")
    with connection.cursor() as cursor:
        effect_log.create(cursor)
        cursor.execute(f"TRUNCATE {effect_log.SCHEMA}.effect, {effect_log.SCHEMA}.cured")
        # A lifecycle call blocked by a stopped process's row lock gives up instead of
        # freezing the driver's plan.
        cursor.execute("SET lock_timeout = '5s'")
    history = History(cfg.log_dir / "history.jsonl")
    history.path.write_text("")
    cluster = Cluster(
        database_url=cfg.database_url,
        log_dir=cfg.log_dir,
        env_extra={
            "CELERY_SCHEDULER_SETTINGS": json.dumps(settings),
            "CHAOS_LOG_DIR": str(cfg.log_dir),
        },
        fallback_redis_url=cfg.fallback_redis_url,
    )
    driver = Driver(plan, cluster, history, lease=cfg.occurrence_lease)
    stops: dict[str, Any] = {}
    try:
        cluster.start_redis()
        driver.setup_tenants()
        driver.create_all()
        log(f"{len(driver.models)} schedules created; starting 3 beats and 3 workers")
        cluster.start_all()
        cluster.wait_workers_ready()
        ready = datetime.now(UTC)
        history.add({"type": "ready", "at": ready})
        log(f"cluster ready; chaos for {cfg.chaos_seconds:.0f}s")
        driver.run(cfg.chaos_seconds)
        log(f"faults over ({driver.faults}); quiet for {cfg.quiet_seconds:.0f}s")
        time.sleep(cfg.quiet_seconds)
        snapshot_activity(cfg)
    finally:
        stop_at = datetime.now(UTC)
        stops = cluster.stop_all()
        history.add({"type": "stopped", "at": stop_at, "outcome": stops})
    judge_from = ready + timedelta(seconds=WARMUP_SECONDS)
    judge_to = stop_at - timedelta(seconds=TAIL_SECONDS)
    exit_code, report = run_reconcile(cfg, settings, judge_from, judge_to)
    with connection.cursor() as cursor:
        effects = effect_log.read(cursor)
    with (cfg.log_dir / "effects.jsonl").open("w") as out:
        for e in effects:
            out.write(json.dumps(e.__dict__, default=str) + "\n")
    attempts = read_attempts(cfg.log_dir)
    verdict = judge(
        history.records,
        effects,
        JudgeConfig(
            judge_from=judge_from,
            judge_to=judge_to,
            occurrence_lease=cfg.occurrence_lease,
            redelivery=cfg.redelivery,
        ),
        end=stop_at,
        reconcile=report,
        attempts=attempts,
    )
    if report is None:
        verdict.add("reconcile", f"manage.py reconcile failed (exit {exit_code})")
    for name, outcome in stops.items():
        if outcome != "stopped":
            verdict.add("stop_hang", f"{name} did not stop within 40 s of SIGTERM: {outcome}")
    result = SoakResult(
        seed=cfg.seed,
        verdict=verdict,
        faults=driver.faults,
        calls=driver.calls,
        stops=stops,
        driver_errors=[r["error"] for r in history.records if r["type"] == "driver_error"],
        reconcile_exit=exit_code,
    )
    result.report = render(result, cfg, judge_from, judge_to)
    (cfg.log_dir / "report.txt").write_text(result.report)
    print(result.report, flush=True)
    return result


def read_attempts(folder: Path) -> list[dict[str, Any]]:
    """Every body start the workers noted (``attempts-<pid>.jsonl``)."""
    out = []
    for path in sorted(folder.glob("attempts-*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                record["scheduled_for"] = datetime.fromisoformat(
                    record["scheduled_for"].replace("Z", "+00:00")
                )
                record["started_at"] = datetime.fromisoformat(record["started_at"])
                out.append(record)
    return out


def snapshot_activity(cfg: SoakConfig) -> None:
    """What every soak connection is doing just before the stop (for diagnosing hangs)."""
    import psycopg

    with psycopg.connect(
        cfg.database_url.replace("postgres://", "postgresql://", 1), autocommit=True
    ) as conn:
        rows = conn.execute(
            "SELECT application_name, pid, state, wait_event_type, wait_event,"
            " pg_blocking_pids(pid), now() - xact_start, left(query, 200)"
            " FROM pg_stat_activity WHERE datname = current_database() ORDER BY 1"
        ).fetchall()
    (cfg.log_dir / "activity.txt").write_text("\n".join(repr(r) for r in rows) + "\n")


def run_reconcile(
    cfg: SoakConfig, settings: dict[str, Any], start: datetime, end: datetime
) -> tuple[int, dict[str, Any] | None]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CELERY_SCHEDULER_FAULT")}
    env.update(
        DATABASE_URL=cfg.database_url,
        DJANGO_SETTINGS_MODULE="example_project.settings",
        CELERY_SCHEDULER_SETTINGS=json.dumps(settings),
        PYTHONPATH=str(ROOT),
    )
    proc = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "reconcile",
            "--from",
            start.isoformat(),
            "--to",
            end.isoformat(),
            "--json",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    (cfg.log_dir / "reconcile.json").write_text(proc.stdout)
    (cfg.log_dir / "reconcile.err").write_text(proc.stderr)
    try:
        return proc.returncode, json.loads(proc.stdout)
    except json.JSONDecodeError:
        return proc.returncode, None


def render(result: SoakResult, cfg: SoakConfig, judge_from: datetime, judge_to: datetime) -> str:
    v = result.verdict
    lines = [
        f"==== chaos soak seed={result.seed} chaos={cfg.chaos_seconds:.0f}s "
        f"quiet={cfg.quiet_seconds:.0f}s judged [{judge_from:%H:%M:%S}, {judge_to:%H:%M:%S}] UTC",
        "faults injected: "
        + (", ".join(f"{k}={n}" for k, n in sorted(result.faults.items())) or "none"),
        "lifecycle calls: " + ", ".join(f"{k}={n}" for k, n in sorted(result.calls.items())),
        "counts: " + ", ".join(f"{k}={n}" for k, n in v.counts.items()),
        f"reconcile exit status: {result.reconcile_exit}",
        "violations by kind: "
        + (", ".join(f"{k}={n}" for k, n in sorted(v.by_kind().items())) or "none"),
    ]
    if result.driver_errors:
        lines.append(f"driver errors (harness): {len(result.driver_errors)}")
        lines += [f"  {e.splitlines()[-1]}" for e in result.driver_errors[:5]]
    for item in v.violations[:200]:
        lines.append(item.render())
    if len(v.violations) > 200:
        lines.append(f"... {len(v.violations) - 200} more")
    for item in v.excused[:50]:
        lines.append("(excused) " + item.render())
    lines.append(f"==== seed={result.seed} violations={len(v.violations)}")
    return "\n".join(lines)


_TIMES = ("start", "end", "at", "scheduled_for", "start_at", "run_at")


def _revive(value: Any, key: str = "") -> Any:
    if isinstance(value, dict):
        return {k: _revive(v, k) for k, v in value.items()}
    if isinstance(value, str) and key in _TIMES:
        return datetime.fromisoformat(value)
    return value


def rejudge(folder: Path) -> Verdict:
    """Judge a finished run again from its files (history, effects, attempts, reconcile)."""
    history = [_revive(json.loads(line)) for line in (folder / "history.jsonl").open()]
    effects = []
    for line in (folder / "effects.jsonl").open():
        raw = json.loads(line)
        for key in ("scheduled_for", "delivered_at", "started_at", "ended_at"):
            raw[key] = None if raw[key] in (None, "None") else datetime.fromisoformat(raw[key])
        effects.append(effect_log.Effect(**raw))
    report = json.loads((folder / "reconcile.json").read_text() or "null")
    ready = next(r["at"] for r in history if r["type"] == "ready")
    stop = next(r["at"] for r in history if r["type"] == "stopped")
    lease = float(json.loads(os.environ.get("CHAOS_LEASE", "6")))
    return judge(
        history,
        effects,
        JudgeConfig(
            judge_from=ready + timedelta(seconds=WARMUP_SECONDS),
            judge_to=stop - timedelta(seconds=TAIL_SECONDS),
            occurrence_lease=lease,
            redelivery=float(os.environ.get("CHAOS_REDELIVERY", SoakConfig.redelivery)),
        ),
        end=stop,
        reconcile=report,
        attempts=read_attempts(folder),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=25, help="chaos phase length")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--schedules", type=int, default=200)
    parser.add_argument("--quiet", type=float, default=120, help="quiet seconds after faults")
    parser.add_argument("--database", default="cs_soak", help="dedicated database (recreated)")
    parser.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432")
    parser.add_argument(
        "--redis",
        default=os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/8"),
        help="broker when redis-server is not installed (FLUSHDB'd!)",
    )
    parser.add_argument("--log-dir", default=None)
    parser.add_argument("--rejudge", default=None, help="judge a finished run's folder again")
    args = parser.parse_args(argv)
    if args.rejudge:
        verdict = rejudge(Path(args.rejudge))
        print(verdict.counts, verdict.by_kind())
        for item in verdict.violations:
            print(item.render())
        return 1 if verdict.violations else 0
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(3), "big")
    url = f"{args.pg}/{args.database}"
    recreate_database(args.pg, args.database)
    log_dir = Path(args.log_dir or ROOT / ".data" / f"soak-{seed}")
    cfg = SoakConfig(
        seed=seed,
        chaos_seconds=args.minutes * 60,
        quiet_seconds=args.quiet,
        schedules=args.schedules,
        database_url=url,
        log_dir=log_dir,
        fallback_redis_url=args.redis,
    )
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
    os.environ["CELERY_SCHEDULER_SETTINGS"] = json.dumps(
        {
            "shard_count": cfg.shard_count,
            "occurrence_lease_seconds": cfg.occurrence_lease,
            "lease_seconds": cfg.shard_lease,
        }
    )
    import django

    django.setup()
    from django.conf import settings as django_settings
    from django.core.management import call_command

    django_settings.CELERY_SCHEDULER = scheduler_settings(cfg)
    call_command("migrate", verbosity=0)
    import tests.chaos.tasks  # noqa: F401  (registers chaos.effect for validation)

    result = run_soak(cfg)
    return 1 if result.verdict.violations or result.driver_errors else 0


def recreate_database(pg: str, name: str) -> None:
    import psycopg

    if not name.replace("_", "").isalnum():
        raise SystemExit(f"refusing odd database name {name!r}")
    with psycopg.connect(
        f"{pg.replace('postgres://', 'postgresql://', 1)}/postgres", autocommit=True
    ) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


if __name__ == "__main__":
    sys.exit(main())
