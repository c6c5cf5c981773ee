"""The ports are contracts: every member says what it promises, and no signature is ``Any``."""

from __future__ import annotations

import inspect

import pytest

from celery_scheduler import ports
from django_app.conf import SchedulerSettings

PROTOCOLS = [
    ports.Relay,
    ports.Materializer,
    ports.ShardLeases,
    ports.Stoppable,
    ports.IdempotencyStore,
    ports.BeatSettings,
    ports.Backend,
]


def _members(protocol: type) -> dict[str, object]:
    return {
        name: value
        for name, value in vars(protocol).items()
        if not name.startswith("_") and (callable(value) or isinstance(value, property))
    }


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=lambda p: p.__name__)
def test_every_member_has_a_contract_docstring(protocol: type) -> None:
    missing = [name for name, member in _members(protocol).items() if not inspect.getdoc(member)]
    assert not missing, f"{protocol.__name__}: members without a docstring: {missing}"


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=lambda p: p.__name__)
def test_no_signature_names_any(protocol: type) -> None:
    loose = []
    for name, member in _members(protocol).items():
        function = member.fget if isinstance(member, property) else member
        annotations = getattr(function, "__annotations__", {})
        loose += [f"{name}: {key}" for key, value in annotations.items() if "Any" in str(value)]
    assert not loose, f"{protocol.__name__} members typed Any: {loose}"


def test_the_django_settings_value_has_every_beat_setting() -> None:
    fields = {
        name for name, value in vars(ports.BeatSettings).items() if isinstance(value, property)
    }
    assert fields <= set(SchedulerSettings.__dataclass_fields__)
