"""The backport: on Django 4.2, read the two SQLite OPTIONS that Django 5.1 added.

Without them several processes on one file fail each other's writes ("database is locked",
see :mod:`django_app.db.checks`); 4.2's own backend would pass them to
``sqlite3.connect`` and fail. This mirrors Django 5.1's implementation of the same options.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db.backends.sqlite3 import base

from django_app.compat import DJANGO_51

TRANSACTION_MODES = frozenset(["DEFERRED", "EXCLUSIVE", "IMMEDIATE"])


class DatabaseWrapper(base.DatabaseWrapper):
    def get_connection_params(self) -> dict[str, Any]:
        params: dict[str, Any] = super().get_connection_params()
        if DJANGO_51:
            return params
        mode = params.pop("transaction_mode", None)
        if mode is not None and str(mode).upper() not in TRANSACTION_MODES:
            raise ImproperlyConfigured(
                f"settings.DATABASES[{self.alias!r}]['OPTIONS']['transaction_mode'] is "
                f"improperly configured to {mode!r}. Use one of "
                f"{', '.join(sorted(TRANSACTION_MODES))}, or None."
            )
        self.transaction_mode = str(mode).upper() if mode else None
        self.init_commands = str(params.pop("init_command", "") or "").split(";")
        return params

    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        conn = super().get_new_connection(conn_params)
        if not DJANGO_51:
            for command in self.init_commands:
                if command := command.strip():
                    conn.execute(command)
        return conn

    def _start_transaction_under_autocommit(self) -> None:
        # Django 4.2 always says plain BEGIN (DEFERRED); 5.1+ says what this says.
        mode = self.transaction_mode
        self.cursor().execute("BEGIN" if mode is None else f"BEGIN {mode}")
