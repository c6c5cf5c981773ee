"""``@idempotent_task``: one effect per business key, stored results, rollback on failure."""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from typing import Any

import pytest
from celery import Celery
from django.db import connection

from celery_scheduler import errors, idempotent_task
from celery_scheduler.tasks import current_idempotency_key, occurrence_context
from django_app.models import IdempotencyRecord
from example_project.billing.models import Invoice
from example_project.billing.tasks import create_invoice

app = Celery("idempotent-tests", set_as_current=False)
app.conf.task_always_eager = True


@idempotent_task(app=app, name="tests.charge")
def charge(customer: str) -> dict[str, Any]:
    invoice = Invoice.objects.create(customer=customer, period="charge")
    return {"invoice_id": invoice.pk, "key": current_idempotency_key()}


@idempotent_task(app=app, name="tests.returns_object")
def returns_object(customer: str) -> object:
    Invoice.objects.create(customer=customer, period="object")
    return object()


@idempotent_task(app=app, name="tests.explodes")
def explodes(customer: str) -> None:
    Invoice.objects.create(customer=customer, period="boom")
    raise ConnectionError("downstream went away")


@idempotent_task
def bare(customer: str) -> str:
    return customer


@pytest.mark.django_db
def test_business_key_dedupes_and_returns_the_stored_result() -> None:
    first = create_invoice("acme", "2026-03")
    second = create_invoice("acme", "2026-03")
    other = create_invoice("acme", "2026-04")
    assert first == second == {"invoice_id": first["invoice_id"], "key": "invoice:acme:2026-03"}
    assert other["invoice_id"] != first["invoice_id"]
    assert Invoice.objects.filter(customer="acme", period="2026-03").count() == 1
    record = IdempotencyRecord.objects.get(key="invoice:acme:2026-03")
    assert (record.task_name, record.result) == ("billing.create_invoice", first)


@pytest.mark.django_db
def test_default_key_is_the_celery_task_id() -> None:
    a = charge.apply(args=("c1",), task_id="task-1").get()
    again = charge.apply(args=("c1",), task_id="task-1").get()
    b = charge.apply(args=("c1",), task_id="task-2").get()
    assert a == again
    assert a["key"] == "task-1"
    assert b["key"] == "task-2"
    assert Invoice.objects.filter(customer="c1").count() == 2


@pytest.mark.django_db
def test_default_key_is_the_occurrence_id_under_the_scheduler() -> None:
    occurrence = str(uuid.uuid4())
    with occurrence_context(occurrence):
        first = charge("c2")
    with occurrence_context(occurrence):  # another delivery of the run: a context of its own
        second = charge.apply(args=("c2",), task_id="another-delivery").get()
    assert first["key"] == occurrence
    assert second == first
    assert IdempotencyRecord.objects.get(key=occurrence).occurrence_id == uuid.UUID(occurrence)


@pytest.mark.django_db
def test_direct_call_without_a_key_says_how_to_fix_it() -> None:
    with pytest.raises(errors.MissingIdempotencyKey, match="pass key="):
        charge("c3")


@pytest.mark.django_db
def test_non_json_result_is_refused_and_rolled_back() -> None:
    with pytest.raises(errors.NotJSONSerializable, match=r"builtins\.object.*JSON"):
        returns_object.apply(args=("c4",), task_id="t-obj", throw=True)
    assert not Invoice.objects.filter(customer="c4").exists()
    assert not IdempotencyRecord.objects.filter(key="t-obj").exists()


@pytest.mark.django_db
def test_failed_body_rolls_back_effect_and_record_so_a_retry_runs_again() -> None:
    for _ in range(2):
        with pytest.raises(ConnectionError):
            explodes.apply(args=("c5",), task_id="t-boom", throw=True)
    assert not Invoice.objects.filter(customer="c5").exists()
    assert not IdempotencyRecord.objects.filter(key="t-boom").exists()


@pytest.mark.django_db
def test_key_must_be_a_non_empty_string_and_long_keys_are_hashed() -> None:
    def echo(customer: str) -> str:
        return customer

    def not_a_key(customer: str) -> Any:
        return None

    bad = idempotent_task(key=not_a_key, app=app, name="tests.bad_key")(echo)
    with pytest.raises(errors.ValidationError, match="non-empty str"):
        bad("x")
    long = idempotent_task(key=lambda customer: customer * 300, app=app, name="tests.long")(echo)
    assert long("ab") == "ab"
    assert IdempotencyRecord.objects.get().key.startswith("sha256:")


def test_bare_decorator_registers_a_shared_task() -> None:
    assert bare.name.endswith("test_idempotent_task.bare")
    assert bare.__wrapped__.__name__ == "bare"  # type: ignore[attr-defined]


def test_package_import_does_not_import_django_or_celery() -> None:
    code = (
        "import sys, celery_scheduler; "
        "assert 'django' not in sys.modules and 'celery' not in sys.modules, 'eager import'; "
        "from celery_scheduler import idempotent_task; "
        "assert callable(idempotent_task) and 'django' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.concurrent_db
@pytest.mark.django_db(transaction=True)
def test_fifty_concurrent_duplicate_deliveries_make_exactly_one_effect() -> None:
    deliveries = 50
    barrier = threading.Barrier(deliveries)
    results: list[Any] = []
    failures: list[BaseException] = []

    def deliver() -> None:
        try:
            barrier.wait(timeout=30)
            results.append(create_invoice("race", "2026-03"))
        except BaseException as exc:
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=deliver) for _ in range(deliveries)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not failures
    assert len(results) == deliveries
    assert Invoice.objects.filter(customer="race", period="2026-03").count() == 1
    assert len({r["invoice_id"] for r in results}) == 1
