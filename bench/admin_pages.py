"""The admin at production size: server time and query count of every admin page.

``python -m bench.admin_pages [--schedules 1000000] [--occurrences 10000000] [--reuse]
[--db cs_admin_bench] [--repeat 3] [--readme]``

1. (unless ``--reuse`` finds the database already seeded at these sizes) drops and creates
   the PostgreSQL database, migrates it and seeds it by set-based SQL (``INSERT ... SELECT
   generate_series``; table names from ``Model._meta.db_table``): 10 tenants, the schedules
   (cron / interval / one-off, every state), their version rows and some tags, the
   occurrences (every state, spread over the past week and the next hour) with an outbox row
   for every occurrence not yet finished, and attempts for the failed and retrying ones;
   then VACUUM ANALYZE. ``--reuse`` still migrates (new indexes get built on the data).
2. Requests every admin page through Django's test ``Client`` as a superuser and as a
   tenant-scoped staff user, ``--repeat`` times each; reports the median server time
   (time around ``client.get``) and the query count (``CaptureQueriesContext``).

Needs PostgreSQL on 127.0.0.1:5432 (trust auth, user ``postgres``). Prints a table;
``--readme`` also writes it into ``bench/README.md`` between the admin-bench markers.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

PG = "postgres://postgres@127.0.0.1:5432"
README = Path(__file__).with_name("README.md")
BEGIN, END = "<!-- admin-bench:begin -->", "<!-- admin-bench:end -->"
TENANTS = 10
TASKS = 40


def _setup(db: str) -> None:
    os.environ["DATABASE_URL"] = f"{PG}/{db}"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
    import django

    django.setup()


def _admin_connection(sql: str) -> None:
    import psycopg

    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(sql)


def _seeded_sizes() -> tuple[int, int] | None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass('bench_admin_sizes')")
        if cursor.fetchone()[0] is None:
            return None
        cursor.execute("SELECT schedules, occurrences FROM bench_admin_sizes")
        row = cursor.fetchone()
    return (int(row[0]), int(row[1])) if row else None


def _insert(model: Any, expressions: dict[str, str], source: str) -> str:
    """INSERT INTO <table> (every concrete column) SELECT <expression or default> <source>.

    Columns the seed does not set get the field's default as a literal (Django keeps
    defaults in Python, not in the schema)."""
    from django.db import connection

    columns, values = [], []
    for field in model._meta.concrete_fields:
        if field.primary_key and field.get_internal_type().endswith("AutoField"):
            continue  # the identity column numbers the rows
        columns.append(connection.ops.quote_name(field.column))
        if field.name in expressions or field.attname in expressions:
            values.append(expressions.get(field.name) or expressions[field.attname])
            continue
        default = field.get_default()
        if default is None:
            values.append("NULL")
        elif isinstance(default, bool):
            values.append("true" if default else "false")
        elif isinstance(default, int):
            values.append(str(default))
        elif isinstance(default, list | dict):
            import json

            values.append(f"'{json.dumps(default)}'::jsonb")
        else:
            values.append("'" + str(default).replace("'", "''") + "'")
    table = connection.ops.quote_name(model._meta.db_table)
    return f"INSERT INTO {table} ({', '.join(columns)}) SELECT {', '.join(values)} {source}"


def _ts(when: datetime) -> str:
    return f"'{when.isoformat()}'::timestamptz"


def _bind(sql: str, *, now: datetime, n: int) -> str:
    # Literals, not driver parameters: the SQL is full of % (modulo).
    return sql.replace("%(now)s", _ts(now)).replace("%(n)s", str(n))


def seed(n_schedules: int, n_occurrences: int) -> None:
    from django.core.management import call_command
    from django.db import connection

    from django_app.models import (
        Attempt,
        Occurrence,
        OutboxEntry,
        Schedule,
        ScheduleCursor,
        ScheduleTag,
        ScheduleVersion,
        Tenant,
    )

    call_command("migrate", verbosity=0)
    now = datetime.now(UTC).replace(microsecond=0)
    with connection.cursor() as cursor:
        t0 = time.perf_counter()
        tenant_ids = [
            Tenant.objects.create(slug=f"tenant-{i}", name=f"Tenant {i}").pk for i in range(TENANTS)
        ]
        tenant_of = f"(ARRAY{tenant_ids})[(g % {TENANTS}) + 1]"
        # g: schedule number; tenant g % 10, kind and state from g / 10. Kinds: 60 % cron,
        # 30 % interval, 10 % one-off; states: mostly ACTIVE, some PAUSED / CANCELED /
        # PARKED, one-offs that ran are COMPLETED.
        kind = (
            "CASE WHEN (g / 10) % 10 < 6 THEN 'CRON' "
            "WHEN (g / 10) % 10 < 9 THEN 'INTERVAL' ELSE 'ONE_OFF' END"
        )
        state = (
            "CASE WHEN (g / 10) % 10 = 9 AND g % 3 > 0 THEN 'COMPLETED' "
            "WHEN (g / 10) % 100 < 6 THEN 'PAUSED' WHEN (g / 10) % 100 < 10 THEN 'CANCELED' "
            "WHEN (g / 10) % 100 = 10 THEN 'PARKED' ELSE 'ACTIVE' END"
        )
        words = "(ARRAY['billing','report','sync','cleanup','notify','export','digest','backup'])"
        schedule_sql = _insert(
            Schedule,
            {
                "id": "md5('s' || g)::uuid",
                "tenant": tenant_of,
                "name": f"{words}[(g / 7) % 8 + 1] || ' ' || (g / 7 % 1000) || '-' || g",
                "task": f"'app.tasks.job_' || (hashtext(g::text) & 1023) % {TASKS}",
                "kind": kind,
                "cron": "CASE WHEN (g / 10) % 10 < 6 THEN (g % 60) || ' * * * *' ELSE '' END",
                "interval_seconds": (
                    "CASE WHEN (g / 10) % 10 BETWEEN 6 AND 8 THEN 60 * (1 + g % 30) END"
                ),
                "run_at": (
                    "CASE WHEN (g / 10) % 10 = 9 THEN %(now)s + (g % 86400) * interval '1 s' END"
                ),
                "state": state,
                "shard": "g % 64",
                "parked_reason": f"CASE WHEN ({state}) = 'PARKED' THEN 'timing error' ELSE '' END",
                "source": "'bench'",
                "created_at": "%(now)s - (g % 86400) * interval '1 min'",
                "updated_at": "%(now)s - (g % 86400) * interval '1 min'",
            },
            "FROM generate_series(0, %(n)s - 1) AS g",
        )
        cursor.execute(_bind(schedule_sql, now=now, n=n_schedules))
        cursor_sql = _insert(
            ScheduleCursor,
            {
                "schedule": "s.id",
                "shard": "s.shard",
                "version": "s.version",
                "active": "s.state = 'ACTIVE'",
                "next_run_at": (
                    "CASE WHEN s.state IN ('ACTIVE', 'PAUSED') "
                    "THEN %(now)s + (abs(hashtext(s.id::text)) % 3600) * interval '1 s' END"
                ),
            },
            f"FROM {Schedule._meta.db_table} s",
        )
        cursor.execute(_bind(cursor_sql, now=now, n=n_schedules))
        cursor.execute(
            _insert(
                ScheduleVersion,
                {
                    "schedule": "s.id",
                    "version": "1",
                    "kind": "s.kind",
                    "cron": "s.cron",
                    "interval_seconds": "s.interval_seconds",
                    "run_at": "s.run_at",
                    "valid_from": "s.created_at",
                },
                f"FROM {Schedule._meta.db_table} s",
            )
        )
        # Tags on every fifth schedule: team=<8 teams>, tier=gold|silver.
        for key, value in (
            ("team", "'team-' || (g % 8)"),
            ("tier", "CASE WHEN g % 2 = 0 THEN 'gold' ELSE 'silver' END"),
        ):
            cursor.execute(
                _insert(
                    ScheduleTag,
                    {
                        "schedule": "md5('s' || g)::uuid",
                        "tenant": tenant_of,
                        "key": f"'{key}'",
                        "value": value,
                    },
                    "FROM generate_series(0, %(n)s - 1, 5) AS g",
                ).replace("%(n)s", str(n_schedules))
            )
        print(f"  schedules, versions, tags: {time.perf_counter() - t0:.0f} s", flush=True)

        # i: occurrence number; schedule i % S, its k-th occurrence (k = i / S), so
        # (schedule, version, scheduled_for) is unique. Past rows spread over a week; about
        # 3 % are still to come (SCHEDULED, within the next hour).
        t0 = time.perf_counter()
        n_per = f"(%(o)s / {n_schedules})"
        occ_state = (
            "CASE WHEN r < 30 THEN 'SCHEDULED' WHEN r < 35 THEN 'ENQUEUED' "
            "WHEN r < 37 THEN 'RUNNING' WHEN r < 40 THEN 'RETRY_WAIT' WHEN r < 50 THEN 'DEAD' "
            "WHEN r < 70 THEN 'MISSED' WHEN r < 80 THEN 'CANCELED' "
            "WHEN r < 85 THEN 'SKIPPED_OVERLAP' ELSE 'SUCCEEDED' END"
        )
        # Future rows: the next hour; the rest: the past week, k-th row k slots back.
        when = (
            f"CASE WHEN r < 30 THEN %(now)s + (1 + (i / {n_schedules}) * 360 "
            f"+ (i % {n_schedules}) % 360) * interval '1 s' "
            f"ELSE %(now)s - ((i / {n_schedules}) * (604800 / GREATEST({n_per}, 1)) "
            "+ (i % 600) + 5) * interval '1 s' END"
        )
        cursor.execute(
            _insert(
                Occurrence,
                {
                    "id": "md5('o' || i)::uuid",
                    "schedule": f"md5('s' || (i % {n_schedules}))::uuid",
                    "schedule_version": "1",
                    "tenant": f"(ARRAY{tenant_ids})[((i % {n_schedules}) % {TENANTS}) + 1]",
                    "scheduled_for": "w",
                    "available_at": "w",
                    "state": "st",
                    "manual": "(i % 997 = 0)",
                    "attempt_count": "CASE WHEN st IN ('SCHEDULED','MISSED','CANCELED',"
                    "'SKIPPED_OVERLAP') THEN 0 WHEN st = 'DEAD' THEN 3 ELSE 1 END",
                    "created_at": "w - interval '1 min'",
                    "enqueued_at": "CASE WHEN st IN ('SCHEDULED','MISSED','CANCELED',"
                    "'SKIPPED_OVERLAP') THEN NULL ELSE w + (i % 4000) * interval '1 ms' END",
                    "started_at": "CASE WHEN st IN ('RUNNING','RETRY_WAIT','DEAD','SUCCEEDED') "
                    "THEN w + interval '1 s' END",
                    "finished_at": "CASE WHEN st IN ('DEAD','SUCCEEDED') "
                    "THEN w + interval '3 s' END",
                    "retry_at": "CASE WHEN st = 'RETRY_WAIT' THEN %(now)s + interval '5 min' END",
                    "last_error": "CASE WHEN st IN ('DEAD','RETRY_WAIT') "
                    "THEN 'Traceback ...' || chr(10) || 'ValueError: bad row ' || i ELSE '' END",
                    "reason": "CASE WHEN st = 'MISSED' THEN 'late' ELSE '' END",
                },
                f"FROM (SELECT i, ({occ_state}) AS st, ({when}) AS w FROM "
                "(SELECT i, (hashtext('r' || i) & 1023) % 1000 AS r "
                "FROM generate_series(0, %(o)s - 1) AS i) AS x) AS y",
            )
            .replace("%(o)s", str(n_occurrences))
            .replace("%(now)s", _ts(now))
        )
        print(f"  occurrences: {time.perf_counter() - t0:.0f} s", flush=True)
        t0 = time.perf_counter()
        occ = Occurrence._meta.db_table
        cursor.execute(
            _insert(
                OutboxEntry,
                {
                    "occurrence": "o.id",
                    "tenant": "o.tenant_id",
                    "shard": "hashtext(o.schedule_id::text) & 63",
                    "available_at": "o.available_at",
                    "sent_at": "o.enqueued_at",
                    "publish_count": "CASE WHEN o.enqueued_at IS NULL THEN 0 ELSE 1 END",
                    "created_at": "o.created_at",
                },
                f"FROM {occ} o WHERE o.state IN ('SCHEDULED','ENQUEUED','RUNNING','RETRY_WAIT')",
            )
        )
        cursor.execute(
            _insert(
                Attempt,
                {
                    "occurrence": "o.id",
                    "number": "n",
                    "fencing_token": "n",
                    "worker": "'worker-' || (n % 4)",
                    "started_at": "o.scheduled_for + n * interval '10 s'",
                    "finished_at": "o.scheduled_for + n * interval '10 s' + interval '1 s'",
                    "outcome": "CASE WHEN n < o.attempt_count OR o.state = 'RETRY_WAIT' "
                    "THEN 'RETRY' ELSE 'FAILED' END",
                    "error": "'ValueError: bad row'",
                },
                f"FROM {occ} o, generate_series(1, o.attempt_count) AS n "
                "WHERE o.state IN ('DEAD', 'RETRY_WAIT')",
            )
        )
        print(f"  outbox, attempts: {time.perf_counter() - t0:.0f} s", flush=True)
        cursor.execute("CREATE TABLE bench_admin_sizes (schedules bigint, occurrences bigint)")
        cursor.execute(
            "INSERT INTO bench_admin_sizes VALUES (%s, %s)", [n_schedules, n_occurrences]
        )
    t0 = time.perf_counter()
    connection.ensure_connection()
    connection.connection.autocommit = True
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    print(f"  vacuum analyze: {time.perf_counter() - t0:.0f} s", flush=True)


def _users() -> tuple[Any, Any, Any]:
    from django.contrib.auth.models import Permission, User

    from django_app.models import Tenant, TenantMembership

    root, _ = User.objects.get_or_create(
        username="bench-root", defaults={"is_staff": True, "is_superuser": True}
    )
    staff, created = User.objects.get_or_create(username="bench-staff", defaults={"is_staff": True})
    tenant = Tenant.objects.get(slug="tenant-0")
    if created:
        staff.user_permissions.set(
            Permission.objects.filter(
                content_type__app_label="django_app", codename__startswith="view_"
            )
        )
        TenantMembership.objects.create(user=staff, tenant=tenant)
    return root, staff, tenant


def pages(tenant: Any) -> list[tuple[str, str, str]]:
    """(who, label, url) of every page measured.

    ``?o=`` counts the action checkbox as column 0 when the user may run an action (the
    superuser); the view-only staff user has no checkbox, so its columns start at 0."""
    from django.urls import reverse

    from django_app.models import Occurrence, Schedule

    schedules = reverse("admin:django_app_schedule_changelist")
    occurrences = reverse("admin:django_app_occurrence_changelist")
    # A schedule of the measured tenant with history, and a dead occurrence with attempts.
    schedule = Schedule.objects.filter(tenant=tenant, kind="INTERVAL").order_by("pk").first()
    occurrence = Occurrence.objects.filter(tenant=tenant, state="DEAD").order_by("pk").first()
    assert schedule is not None
    assert occurrence is not None
    today = datetime.now(UTC)
    day = (
        f"scheduled_for__year={today.year}&scheduled_for__month={today.month}"
        f"&scheduled_for__day={today.day}"
    )
    one = f"{occurrences}?schedule={schedule.pk}"
    schedule_page = reverse("admin:django_app_schedule_change", args=[schedule.pk])
    occurrence_page = reverse("admin:django_app_occurrence_change", args=[occurrence.pk])
    rows = [
        ("schedule list", schedules),
        ("schedule list, tenant filter", f"{schedules}?tenant__id__exact={tenant.pk}"),
        ("schedule list, state=PAUSED", f"{schedules}?state__exact=PAUSED"),
        ("schedule list, task filter", f"{schedules}?task=app.tasks.job_7"),
        ("schedule list, tag filter", f"{schedules}?tag=team%3Dteam-3"),
        ("schedule list, search 'digest 17'", f"{schedules}?q=digest+17"),
        ("schedule list, search 'digest 417'", f"{schedules}?q=digest+417"),
        ("schedule list, page 2", f"{schedules}?p=2"),
        ("schedule list, page 1000", f"{schedules}?p=1000"),
        ("schedule list, sorted by next run", f"{schedules}?o={{next}}"),
        ("schedule list, sorted by state", f"{schedules}?o={{state}}"),
        ("schedule list, sorted by name desc", f"{schedules}?o=-{{name}}"),
        ("schedule change page + history", schedule_page),
        ("occurrence list (All)", occurrences),
        ("occurrence list, Dead letters", f"{occurrences}?state__exact=DEAD"),
        ("occurrence list, Running", f"{occurrences}?state__exact=RUNNING"),
        ("occurrence list, Retry wait", f"{occurrences}?state__exact=RETRY_WAIT"),
        ("occurrence list, Missed", f"{occurrences}?state__exact=MISSED"),
        ("occurrence list, manual", f"{occurrences}?manual__exact=1"),
        ("occurrence list, tenant filter", f"{occurrences}?tenant__id__exact={tenant.pk}"),
        ("occurrence list, one schedule", one),
        ("occurrence list, one schedule, Dead", f"{one}&state__exact=DEAD"),
        ("occurrence list, today", f"{occurrences}?{day}"),
        ("occurrence list, search 'digest 17'", f"{occurrences}?q=digest+17"),
        ("occurrence list, search 'digest 417'", f"{occurrences}?q=digest+417"),
        ("occurrence list, page 1000", f"{occurrences}?p=1000"),
        ("occurrence change page", occurrence_page),
        ("overview", reverse("admin:django_app_overview")),
        ("admin index", reverse("admin:index")),
    ]
    columns = {
        "superuser": {"name": 1, "state": 2, "next": 4},
        "tenant staff": {"name": 0, "state": 1, "next": 3},
    }
    return [
        (who, label, url.format(**columns[who]) if "{" in url else url)
        for who in ("superuser", "tenant staff")
        for label, url in rows
    ]


def measure(
    repeat: int, *, only: str = "", slowest: bool = False
) -> list[tuple[str, str, float, int, int]]:
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    root, staff, tenant = _users()
    clients = {"superuser": Client(), "tenant staff": Client()}
    clients["superuser"].force_login(root)
    clients["tenant staff"].force_login(staff)
    results = []
    for who, label, url in pages(tenant):
        if who == "tenant staff" and "tenant filter" in label:
            continue  # a tenant user has no tenant filter
        if only and only not in f"{who} {label}":
            continue
        client = clients[who]
        times, queries, status = [], 0, 0
        for _ in range(repeat + 1):  # the first request warms caches and is not counted
            with CaptureQueriesContext(connection) as captured:
                start = time.perf_counter()
                response = client.get(url)
                if hasattr(response, "render") and not response.is_rendered:
                    response.render()
                times.append((time.perf_counter() - start) * 1000)
            queries, status = len(captured), response.status_code
        ms = statistics.median(times[1:])
        results.append((who, label, ms, queries, status))
        print(f"  {who:13} {label:42} {ms:8.0f} ms {queries:3} q  {status}", flush=True)
        if slowest:  # the query to look at first when a page is slow
            worst = max(captured.captured_queries, key=lambda q: float(q["time"]))
            print(f"      slowest {float(worst['time']) * 1000:.0f} ms: {worst['sql'][:400]}")
    return results


def table(results: list[tuple[str, str, float, int, int]], sizes: tuple[int, int]) -> str:
    lines = [
        f"{sizes[0]:,} schedules, {sizes[1]:,} occurrences "
        f"(median of the timed requests; HTTP status in the last column)",
        "",
        "| user | page | server ms | queries | status |",
        "|---|---|---:|---:|---:|",
    ]
    for who, label, ms, queries, status in results:
        lines.append(f"| {who} | {label} | {ms:.0f} | {queries} | {status} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=1_000_000)
    parser.add_argument("--occurrences", type=int, default=10_000_000)
    parser.add_argument("--db", default="cs_admin_bench")
    parser.add_argument(
        "--reuse", action="store_true", help="keep a database seeded at these sizes"
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--readme", action="store_true", help="write the table into bench/README.md"
    )
    parser.add_argument("--only", default="", help="measure the pages whose label holds this")
    parser.add_argument("--slowest", action="store_true", help="print each page's slowest query")
    args = parser.parse_args(argv)
    sizes = (args.schedules, args.occurrences)

    _setup(args.db)
    from django.core.management import call_command
    from django.db import connection

    fresh = True
    if args.reuse:
        try:
            fresh = _seeded_sizes() != sizes
        except Exception:
            fresh = True
    if fresh:
        connection.close()
        print(f"seeding {args.db}: {sizes[0]:,} schedules, {sizes[1]:,} occurrences", flush=True)
        _admin_connection(f'DROP DATABASE IF EXISTS "{args.db}"')
        _admin_connection(f'CREATE DATABASE "{args.db}"')
        t0 = time.perf_counter()
        seed(*sizes)
        print(f"seeded in {time.perf_counter() - t0:.0f} s", flush=True)
    else:
        t0 = time.perf_counter()
        call_command("migrate", verbosity=1)  # indexes added since the seed are built here
        connection.ensure_connection()
        print(f"reusing {args.db}; migrate took {time.perf_counter() - t0:.0f} s", flush=True)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_size_pretty(pg_database_size(current_database()))")
        print(f"database size: {cursor.fetchone()[0]}", flush=True)
    from django.conf import settings

    settings.ALLOWED_HOSTS = ["*"]
    results = measure(args.repeat, only=args.only, slowest=args.slowest)
    text = table(results, sizes)
    print()
    print(text)
    if args.readme:
        readme = README.read_text()
        start, end = readme.index(BEGIN) + len(BEGIN), readme.index(END)
        README.write_text(readme[:start] + "\n" + text + "\n" + readme[end:])
    return 0 if all(status == 200 for *_, status in results) else 1


if __name__ == "__main__":
    sys.exit(main())
