"""A compact text form of a set of instants (retention's record of pruned fire times).

The instants are integers (microseconds since the epoch, see :func:`to_int`), kept sorted
and unique. The text is comma-separated base-36 tokens: the first is the first instant,
each next one the step to the next instant; ``step*count`` stands for ``count`` equal steps.
A schedule firing at a fixed interval is one or two tokens however many of its times the
set holds (``"<first>,<step>*<count>"``); an irregular set costs one token (8 or 9
characters for steps of an hour to a year) per instant.

Pure: no Django. :func:`add` appends in time proportional to the tokens when the new
instants all come after the set's last (retention prunes oldest first), and rewrites the
whole set otherwise; :func:`members` answers "which of these are in the set" without
expanding the runs.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"

#: One token: (step, count); the first token's step is the first instant itself, count 1.
Token = tuple[int, int]


def to_int(at: datetime) -> int:
    """``at`` (aware) as microseconds since the epoch."""
    delta = at - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_int(value: int) -> datetime:
    return _EPOCH + timedelta(microseconds=value)


def _b36(n: int) -> str:
    if n < 0:
        return "-" + _b36(-n)
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = _DIGITS[r] + out
        if not n:
            return out


def parse(text: str) -> list[Token]:
    tokens: list[Token] = []
    for part in text.split(",") if text else ():
        step, _, count = part.partition("*")
        tokens.append((int(step, 36), int(count, 36) if count else 1))
    return tokens


def render(tokens: list[Token]) -> str:
    return ",".join(_b36(s) if c == 1 else f"{_b36(s)}*{_b36(c)}" for s, c in tokens)


def _extend(tokens: list[Token], last: int | None, values: Iterable[int]) -> None:
    """Append sorted ``values`` (each after ``last``) to ``tokens`` in place."""
    for value in values:
        if last is None:
            tokens.append((value, 1))
        else:
            step = value - last
            if len(tokens) > 1 and tokens[-1][0] == step:
                tokens[-1] = (step, tokens[-1][1] + 1)
            else:
                tokens.append((step, 1))
        last = value


def encode(values: Iterable[int]) -> str:
    tokens: list[Token] = []
    _extend(tokens, None, sorted(set(values)))
    return render(tokens)


def runs(text: str) -> list[tuple[int, int, int]]:
    """The set as runs ``(first, step, count)``: the instants ``first + step * k`` for
    ``k`` in ``range(count)``."""
    out: list[tuple[int, int, int]] = []
    value: int | None = None
    for step, count in parse(text):
        if value is None:
            value = step
            out.append((value, 0, 1))
            continue
        out.append((value + step, step, count))
        value += step * count
    return out


def decode(text: str) -> list[int]:
    return [first + step * k for first, step, count in runs(text) for k in range(count)]


def last(text: str) -> int | None:
    value: int | None = None
    for step, count in parse(text):
        value = step if value is None else value + step * count
    return value


def add(text: str, values: Iterable[int]) -> str:
    """The set ``text`` with ``values`` added."""
    new = sorted(set(values))
    if not new:
        return text
    tokens = parse(text)
    end = last(text)
    if end is None or new[0] > end:
        _extend(tokens, end, new)
        return render(tokens)
    return encode([*decode(text), *new])


def members(text: str, candidates: Iterable[int]) -> set[int]:
    """Those of ``candidates`` that are in the set ``text``."""
    wanted = sorted(set(candidates))
    found: set[int] = set()
    if not wanted:
        return found
    for first, step, count in runs(text):
        stop = first + step * (count - 1)
        for value in wanted[bisect_left(wanted, first) : bisect_right(wanted, stop)]:
            if value == first or (step and (value - first) % step == 0):
                found.add(value)
    return found
