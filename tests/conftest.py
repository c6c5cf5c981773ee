"""Shared fixtures: database selection, service checks and factories.

The database comes from ``DATABASE_URL`` (default: SQLite). Tests marked ``concurrent_db``
prove concurrency claims with real concurrent connections or processes: they run on PostgreSQL
and on MySQL/MariaDB and skip on SQLite. Tests marked ``postgres`` cover a PostgreSQL-only fast
path (or a PostgreSQL-only tool) and skip elsewhere. A service that does not answer skips its tests
locally but fails them in CI (``CI=true``), so a green CI cannot hide a missing service.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.contracts import materializer, publisher, relay  # noqa: F401 (the port fixtures)

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def require_service(name: str, host: str, port: int) -> None:
    if _answers(host, port):
        return
    message = f"{name} is not answering on {host}:{port}"
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


def is_postgres() -> bool:
    from django.db import connection

    return connection.vendor == "postgresql"


def is_mysql() -> bool:
    """MySQL 8 or MariaDB 10.6+ (Django's ``mysql`` backend serves both)."""
    from django.db import connection

    return connection.vendor == "mysql"


def database_family() -> str:
    """``postgresql``, ``mysql`` or ``sqlite``, from ``DATABASE_URL`` (before Django is set up)."""
    url = os.environ.get("DATABASE_URL", "")
    if url.startswith(("postgres", "postgresql", "pgsql")):
        return "postgresql"
    if url.startswith(("mysql", "mariadb")):
        return "mysql"
    return "sqlite"


#: Not yet supported on MySQL/MariaDB, skipped there with the reason (node id -> reason).
NOT_YET_ON_MYSQL: dict[str, str] = {}

#: Integration modules that use no database at all (no ``django_db`` mark, no db fixture) and
#: whose settings do not depend on ``DATABASE_URL``: the broker clients and a command that
#: only computes. They give the same result on every database, so they run on SQLite only
#: (the pass that needs no server); a test of theirs that does use the database still runs
#: everywhere. Paths relative to tests/integration/.
ONE_DATABASE = (
    "publishers/test_amqp_fast_publisher.py",
    "publishers/test_redis_fast_publisher.py",
    "publishers/test_publisher_without_redis.py",
    "publishers/test_publisher_contract.py",
    "schedules/test_preview_command.py",
)
_DB_FIXTURES = {"db", "transactional_db", "django_db_setup", "client", "admin_client"}


def _uses_no_database(item: pytest.Item) -> bool:
    fixtures = set(getattr(item, "fixturenames", ()))
    return item.get_closest_marker("django_db") is None and not fixtures & _DB_FIXTURES


#: The integration tests marked ``django_lines``: what can differ between the supported Django
#: lines (4.2 LTS and 5.2 LTS), which the Django 4.2 pass of ``scripts/test`` runs (on SQLite).
#: What differs between the lines is Django's own code: the admin (views, templates, forms,
#: changelist filters), migrations and model constraints (``django_app.compat``, the SQLite
#: backend of ``django_app.sqlite3``), request handling and forms under the HTTP API, the ORM
#: as the public API, the tenancy rules and the management commands use it, and the query
#: counts that pin the hot paths' statements. Left to the 5.2 passes: the broker clients
#: (publishers/), the relay, worker, cluster and materializer internals beyond their main test
#: module (scheduler logic over ORM calls those modules already run), concurrency tests
#: (skipped on SQLite anyway) and the long property and fault walks. Paths are relative to
#: tests/integration/: a directory or one module.
DJANGO_LINES = (
    "admin/",
    "db/",
    "example/",
    "http/",
    "schedules/",
    "tenancy/",
    "beat/test_beat.py",
    "materialize/test_materializer.py",
    "operations/test_reconcile.py",
    "operations/test_retention.py",
    "relay/test_relay.py",
    "worker/test_worker_execute.py",
    "worker/test_worker_cost.py",
    "worker/test_idempotent_task.py",
    "worker/test_presentation.py",
)


#: ``TEST_PHASE`` (set by scripts/test): ``plain`` runs only the integration tests that run
#: inside one transaction (Django's ``db``: no other connection, no real process, no thread
#: racing, nothing held to a clock), which can share the machine with other work; ``real``
#: runs the rest (transactional tests, acceptance, browser, soak), one database at a time.
#: Unset: everything.
TEST_PHASE = os.environ.get("TEST_PHASE", "")
_TRANSACTIONAL_FIXTURES = {"transactional_db", "live_server", "django_db_reset_sequences"}


def _in_one_transaction(item: pytest.Item) -> bool:
    if not item.nodeid.startswith("tests/integration/"):
        return False
    marker = item.get_closest_marker("django_db")
    if marker is not None and (
        marker.kwargs.get("transaction") or (marker.args and marker.args[0])
    ):
        return False
    return not set(getattr(item, "fixturenames", ())) & _TRANSACTIONAL_FIXTURES


def _select_phase(config: pytest.Config, items: list[pytest.Item]) -> None:
    if TEST_PHASE not in {"plain", "real"}:
        if TEST_PHASE:
            raise pytest.UsageError(f"TEST_PHASE must be plain or real, not {TEST_PHASE!r}")
        return
    plain = TEST_PHASE == "plain"
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        (keep if _in_one_transaction(item) == plain else drop).append(item)
    config.hook.pytest_deselected(items=drop)
    items[:] = keep


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _select_phase(config, items)
    family = database_family()
    skip_pg = pytest.mark.skip(reason="needs PostgreSQL (set DATABASE_URL=postgres://...)")
    skip_concurrent = pytest.mark.skip(
        reason="needs a concurrent database: PostgreSQL or MySQL/MariaDB (set DATABASE_URL)"
    )
    lines = pytest.mark.django_lines
    skip_elsewhere = pytest.mark.skip(
        reason="uses no database: runs on the SQLite pass only (tests/conftest.py, ONE_DATABASE)"
    )
    for item in items:
        where = item.nodeid.split("::")[0]
        integration = (
            where.removeprefix("tests/integration/")
            if where.startswith("tests/integration/")
            else None
        )
        if integration is not None and integration.startswith(DJANGO_LINES):
            item.add_marker(lines)
        if family != "sqlite" and integration in ONE_DATABASE and _uses_no_database(item):
            item.add_marker(skip_elsewhere)
        if "postgres" in item.keywords and family != "postgresql":
            item.add_marker(skip_pg)
        elif "concurrent_db" in item.keywords and family == "sqlite":
            item.add_marker(skip_concurrent)
        if family == "mysql" and item.nodeid.split("[")[0] in NOT_YET_ON_MYSQL:
            item.add_marker(pytest.mark.skip(reason=NOT_YET_ON_MYSQL[item.nodeid.split("[")[0]]))


def pytest_configure(config: pytest.Config) -> None:
    if database_family() == "postgresql":
        _flush_postgres_cheaply()


def _flush_postgres_cheaply() -> None:
    """Empty the tables after a transactional test mostly with ``DELETE``, not ``TRUNCATE``.

    Django flushes with one ``TRUNCATE`` of every table, which on PostgreSQL replaces the
    files of every table, partition and index (~0.3 s here, whatever they hold): a tax on
    each of the PostgreSQL pass's ~300 transactional and real-process tests. ``DELETE`` of
    the tables that hold a few rows costs next to nothing; a table left with more than
    ``_TRUNCATE_ABOVE`` rows is still truncated, so the next test does not plan its
    statements over a table full of dead rows (two 20,000-row relay tests took 65 s instead
    of 25 s when every table was emptied by ``DELETE``). Django's foreign keys are
    ``DEFERRABLE INITIALLY DEFERRED`` (the schema has no other foreign keys and no triggers),
    so the order of the deletes does not matter. A flush that also resets sequences keeps
    Django's statement.
    """
    from django.db.backends.postgresql.operations import DatabaseOperations

    truncate = DatabaseOperations.sql_flush

    def sql_flush(
        self: DatabaseOperations,
        style: Any,
        tables: Any,
        *,
        reset_sequences: bool = False,
        allow_cascade: bool = False,
    ) -> list[str]:
        if reset_sequences or not tables:
            return truncate(
                self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
            )
        names = ", ".join("'" + table.replace("'", "''") + "'" for table in tables)
        return [_FLUSH_BLOCK.replace("{tables}", names).replace("{limit}", str(_TRUNCATE_ABOVE))]

    DatabaseOperations.sql_flush = sql_flush  # type: ignore[method-assign,assignment]


_TRUNCATE_ABOVE = 1000
_FLUSH_BLOCK = """
DO $flush$
DECLARE
    name text;
    large boolean;
    big text[] := '{}';
    small text[] := '{}';
BEGIN
    FOREACH name IN ARRAY ARRAY[{tables}]::text[] LOOP
        EXECUTE 'SELECT count(*) > {limit} FROM (SELECT 1 FROM ' || quote_ident(name)
            || ' LIMIT {limit} + 1) AS head' INTO large;
        IF large THEN big := big || quote_ident(name); ELSE small := small || name; END IF;
    END LOOP;
    IF cardinality(big) > 0 THEN
        EXECUTE 'TRUNCATE ' || array_to_string(big, ', ') || ' CASCADE';
    END IF;
    FOREACH name IN ARRAY small LOOP
        EXECUTE 'DELETE FROM ' || quote_ident(name);
    END LOOP;
END
$flush$;
"""


#: Written into the test Redis db after each flush: a db without it that holds keys is not
#: ours, and the suite refuses to flush it rather than wipe someone's data.
REDIS_OWNER_KEY = "celery-scheduler:test-suite-owns-this-db"


def claim_test_redis_db() -> None:
    """Flush the test Redis db (``TEST_REDIS_URL``), but only if it is empty or ours."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = client.dbsize()
        if keys and not client.exists(REDIS_OWNER_KEY):
            pytest.fail(
                f"{REDIS_URL} holds {keys} keys that this test suite did not write; "
                "point TEST_REDIS_URL at an empty Redis db (or flush this one yourself)"
            )
        client.flushdb()
        client.set(REDIS_OWNER_KEY, "1")
    finally:
        client.close()


@pytest.fixture
def redis_url() -> Iterator[str]:
    require_service("Redis", "127.0.0.1", 6379)
    claim_test_redis_db()
    yield REDIS_URL
    claim_test_redis_db()  # no stale messages left behind for the next test or user


@pytest.fixture
def tenant_factory(db: None) -> Callable[..., Any]:
    from django_app.models import Tenant

    def make(slug: str | None = None, **fields: Any) -> Tenant:
        return Tenant.objects.create(slug=slug or f"t-{uuid.uuid4().hex[:8]}", **fields)

    return make


@pytest.fixture
def tenant(tenant_factory: Callable[..., Any]) -> Any:
    return tenant_factory("acme")


@pytest.fixture
def frozen_clock() -> Any:
    from datetime import UTC, datetime

    from celery_scheduler.core.clock import FrozenClock

    return FrozenClock(datetime(2026, 3, 1, 12, 0, tzinfo=UTC))
