"""Cron fields accept ASCII digits only; every other input is an InvalidCronExpression.

``str.isdigit`` is true for superscripts, circled and Arabic-Indic digits: ``int("²")``
raised a bare ValueError (the admin preview answered 500) and ``٣`` was read as 3.
"""

from __future__ import annotations

from datetime import datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_scheduler import errors
from celery_scheduler.core import timemath

FIELD_NAMES = ("minute", "hour", "day-of-month", "month", "day-of-week")


@pytest.mark.parametrize("digit", ["²", "①", "٣", "\uff13", "߃", "\U0001d7d1"])
@pytest.mark.parametrize("position", range(5))
@pytest.mark.parametrize("form", ["{d}", "*/{d}", "1-{d}", "{d}/2", "1,{d}"])
def test_non_ascii_digit_is_invalid_cron_naming_the_field(
    digit: str, position: int, form: str
) -> None:
    fields = ["*"] * 5
    fields[position] = form.format(d=digit)
    expression = " ".join(fields)
    with pytest.raises(errors.InvalidCronExpression) as caught:
        timemath.CronTrigger(expression=expression)
    assert caught.value.field == "cron"
    assert FIELD_NAMES[position] in str(caught.value)


def test_huge_numbers_are_out_of_range_not_a_conversion_error() -> None:
    with pytest.raises(errors.InvalidCronExpression, match="minute"):
        timemath.CronTrigger(expression="1" * 150 + " * * * *")


def test_expression_longer_than_the_column_is_refused_before_parsing() -> None:
    # 5000 digits: int() alone would raise ValueError (Python's 4300-digit limit).
    with pytest.raises(errors.InvalidCronExpression, match="at most 200"):
        timemath.CronTrigger(expression="1" * 5000 + " * * * *")


def test_huge_step_means_the_start_only() -> None:
    # As in Vixie cron, a step past the range keeps the first value: "*/999..." is minute 0.
    trigger = timemath.CronTrigger(expression="*/" + "9" * 150 + " * * * *")
    assert trigger._spec.minutes == (0,)


def test_ascii_digits_still_parse() -> None:
    trigger = timemath.CronTrigger(expression="3 */2 1-31/3 1,12 0-6")
    assert trigger.matches_wall(datetime(2026, 1, 1, 2, 3))


_CRON_ALPHABET = st.sampled_from([*"0123456789*/-, ", "²", "٣", "①", "\x00", "\t"])
_cron_like = st.lists(
    st.text(alphabet=_CRON_ALPHABET, min_size=0, max_size=6), min_size=0, max_size=7
).map(" ".join)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(max_size=60), _cron_like))
def test_parser_raises_only_cron_errors(text: str) -> None:
    """Over arbitrary text the parser returns or raises InvalidCronExpression (or CronNeverFires,
    its subclass); never ValueError, TypeError, IndexError or OverflowError."""
    try:
        trigger = timemath.CronTrigger(expression=text)
    except errors.InvalidCronExpression:
        return
    assert trigger.expression == text
