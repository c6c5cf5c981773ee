"""MySQL/MariaDB must run READ COMMITTED: anything else is refused where a run could start
twice (a worker's claim, beat's start) and warned about by ``manage.py check``."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connections

from celery_scheduler import errors
from django_app.db import checks

MYSQL = {"ENGINE": "django.db.backends.mysql", "NAME": "scheduler"}


@pytest.mark.parametrize("options", [{}, {"isolation_level": "read committed"},
                                     {"isolation_level": "READ COMMITTED"}])  # fmt: skip
def test_read_committed_is_safe(options: dict[str, Any]) -> None:
    assert checks.mysql_problems({**MYSQL, "OPTIONS": options}) == []


@pytest.mark.parametrize(
    ("level", "named"),
    [("repeatable read", "'repeatable read'"), ("serializable", "'serializable'"),
     ("read uncommitted", "'read uncommitted'"), (None, "the server's default")],
)  # fmt: skip
def test_another_isolation_level_is_refused_by_name(
    level: str | None, named: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings_dict = {**MYSQL, "OPTIONS": {"isolation_level": level}}
    [problem] = checks.mysql_problems(settings_dict)
    assert named in problem
    assert "READ COMMITTED" in problem
    default = connections["default"].settings_dict
    for key, value in settings_dict.items():
        monkeypatch.setitem(default, key, value)
    with pytest.raises(errors.UnsafeDatabase, match=r'\["OPTIONS"\]\["isolation_level"\]'):
        checks.require_safe_database.__wrapped__("default")  # uncached: this alias's now
    warnings = checks.check_database()
    assert [w.id for w in warnings if w.id == "django_app.W003"] == ["django_app.W003"]
