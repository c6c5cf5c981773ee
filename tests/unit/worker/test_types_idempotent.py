"""``@idempotent_task`` keeps the task's signature for mypy (checked by ``mypy`` in lint).

At runtime this only checks the decorated objects are Celery tasks; the real assertions are
the ``assert_type`` calls and the ``type: ignore[...]`` lines, which mypy verifies (an
unneeded ignore is an error under ``warn_unused_ignores``).
"""

from __future__ import annotations

from typing import assert_type

from celery import Celery, Task

from celery_scheduler import idempotent_task

app = Celery("typing", set_as_current=False)


@idempotent_task
def plain(customer: str, period: str) -> dict[str, int]:
    return {"n": 1}


@idempotent_task(key=lambda customer, cents: f"charge:{customer}", app=app, name="types.charge")
def charge(customer: str, cents: int) -> int:
    return cents


def check_signatures() -> None:
    as_plain: Task[[str, str], dict[str, int]] = plain
    as_charge: Task[[str, int], int] = charge
    wrong: Task[[int], int] = charge  # type: ignore[assignment]
    assert_type(plain("acme", "2026-03"), dict[str, int])
    assert_type(charge("acme", 5), int)
    charge("acme", "five")  # type: ignore[arg-type]
    plain("acme")  # type: ignore[call-arg]
    del as_plain, as_charge, wrong


def test_decorated_functions_are_celery_tasks() -> None:
    assert isinstance(plain, Task)
    assert charge.name == "types.charge"
    assert plain.__wrapped__.__name__ == "plain"  # type: ignore[attr-defined]
