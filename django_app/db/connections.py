"""Drop a database connection that an error left broken, so the next query reconnects.

Django reconnects on its own only when the first failing statement ran inside
``transaction.atomic()`` (its failed rollback closes the connection). When the statement
that met a killed backend ran in autocommit mode (ordinary task code does), Django keeps the
dead psycopg connection, and every later ``atomic()`` on it fails at once ("the connection
is lost", "can't change 'autocommit' now"): a retry loop that does not close it retries
nothing. Call :func:`reset_after_error` between retries of a database write.
"""

from __future__ import annotations

import logging

from django.db import connection

logger = logging.getLogger(__name__)


def reset_after_error() -> None:
    """Close this thread's connection unless a transaction of the caller still owns it.

    Cheap (the next query opens a new connection) and safe after any database error: the
    failed statement's transaction is gone either way.
    """
    if connection.in_atomic_block:  # the caller's transaction decides (tests run in one)
        return
    try:
        connection.close()
    except Exception:  # closing a dead connection may raise too; it is dropped regardless
        logger.debug("closing a broken database connection failed", exc_info=True)


def drop_if_broken() -> None:
    """Close this thread's connection if an earlier error left it unusable.

    Workers keep their connection across tasks (``CELERY_DB_REUSE_MAX``): a connection a
    task body broke (a killed backend, an error Django flagged) must not carry into the
    next claim. Costs nothing on a healthy connection: Django pings only after an error.
    """
    if connection.in_atomic_block or connection.connection is None:
        return
    if connection.errors_occurred and not connection.is_usable():
        reset_after_error()
