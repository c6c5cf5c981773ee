"""The schedule filters are one spec (``api_types.ScheduleFilter``) on every surface."""

from __future__ import annotations

import pytest

from celery_scheduler import api
from celery_scheduler.api_types import SCHEDULE_FILTERS
from django_app.http.serializers import FilterFields
from django_app.management.commands.schedules import Command


def test_the_http_filter_fields_are_the_schedule_filters() -> None:
    assert tuple(FilterFields().fields) == SCHEDULE_FILTERS


def test_the_cli_list_options_are_the_schedule_filters() -> None:
    parser = Command().create_parser("manage.py", "schedules")
    common = {action.dest for action in parser._actions}  # --verbosity, ..., the sub-command
    listed = set(vars(parser.parse_args(["list"]))) - common - {"limit", "cursor", "json"}
    assert listed == set(SCHEDULE_FILTERS)


@pytest.mark.parametrize(
    ("verb", "kwargs"),
    [
        (api.list_schedules, {"colour": "red"}),
        (api.bulk_pause, {"state": "ACTIVE", "colour": "red"}),
        (api.bulk_resume, {"state": "PAUSED", "note": "not for a resume"}),
        (api.bulk_cancel, {"colour": "red"}),
    ],
)
def test_a_keyword_that_is_no_filter_is_a_type_error(verb: object, kwargs: dict) -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        verb(**kwargs)  # type: ignore[operator]
