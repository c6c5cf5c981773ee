"""Trigger time math: cron, fixed-rate interval and one-off instants, all answered in UTC.

The DST contract is ours, whatever croniter would do:

* Cron expressions are evaluated in the schedule's LOCAL wall time (naive local datetimes
  stepped field by field), then converted to UTC with ``zoneinfo``.
* A local wall time that does not exist (spring-forward gap) is skipped by default
  (``dst_gap=SKIP``); with ``dst_gap=SHIFT`` it fires at the first existing instant after the
  gap, once however many matching wall times the gap swallowed.
* A wall time that repeats (fall-back) fires once, at its first instant (``fold=0``), by
  default (``dst_fold=FIRST``); ``SECOND`` fires it once at its second instant (``fold=1``),
  ``BOTH`` at each. With the default, for hourly or minutely expressions *each distinct wall
  time* fires once: with a one-hour fall-back at 03:00 an hourly job fires at 02:00 (first
  pass) and next at 03:00, so a 25-hour day has 24 runs and a 23-hour day has 23.
  Elapsed-time spacing is the job of :class:`IntervalTrigger`.
* Fire times are distinct instants in increasing order: a shifted run that lands on a
  matching wall time's own instant (03:00 after a 02:00-03:00 gap) is one run.
* A daily job keeps its wall-clock time across DST (the next time is never ``+24 h``).
* Intervals are elapsed time from an anchor and ignore DST entirely.

Cron is five-field Vixie cron (minute hour day-of-month month day-of-week) with ranges,
steps (``a-b/n``, ``*/n`` and the common ``a/n`` = ``a-max/n``), lists, month and weekday
names, ``0`` or ``7`` for Sunday, and the macros ``@yearly @annually @monthly @weekly @daily
@midnight @hourly``. As in Vixie cron, when both day fields are restricted (neither starts
with ``*``) a day matches if EITHER matches; otherwise both must. Every returned instant is an
aware UTC datetime, and naive inputs are rejected.
"""

from __future__ import annotations

import bisect
import calendar
import difflib
import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

import cron_descriptor

from celery_scheduler import errors
from celery_scheduler.core.enums import DstFold, DstGap, ScheduleKind

__all__ = [
    "CronTrigger",
    "DstFold",
    "DstGap",
    "IntervalTrigger",
    "OneOffTrigger",
    "PreviewRow",
    "Trigger",
    "check_instant",
    "cron_fields",
    "describe_cron",
    "describe_dst",
    "dst_policy",
    "fire_times",
    "parse_interval",
    "parse_timezone",
    "preview",
    "wall_instant",
]

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_FIELDS = (  # (name, low, high, names)
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day-of-month", 1, 31, ()),
    ("month", 1, 12, tuple(m.lower() for m in calendar.month_abbr[1:])),
    ("day-of-week", 0, 7, ("sun", "mon", "tue", "wed", "thu", "fri", "sat")),
)
_MONTH_MAX_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # Feb 29 exists some years
# With the never-fires check done statically, a match is at most ~28 years away (a date on a
# given weekday); the bound only guards against the datetime range and pathological zones.
_SEARCH_YEARS = 50
MAX_PREVIEW = 1000
#: Longest expression (the Schedule.cron column): refused, never truncated or stored longer.
MAX_CRON_LENGTH = 200


#: Instants accepted from callers (run_at, start_at, end_at, preview starts, command
#: arguments). Far from datetime's year 1 and 9999 so that no arithmetic on them (intervals,
#: lateness, windows, local-time conversion) can leave datetime's range.
MIN_INSTANT = datetime(1900, 1, 1, tzinfo=UTC)
MAX_INSTANT = datetime(9000, 1, 1, tzinfo=UTC)


def _require_aware(value: datetime, name: str) -> datetime:
    if not isinstance(value, datetime):
        raise errors.ValidationError(f"{name} must be a datetime, got {value!r}", field=name)
    if value.tzinfo is None or value.utcoffset() is None:
        raise errors.ValidationError(
            f"{name} must be timezone-aware (got naive {value.isoformat()}); pass an aware UTC "
            "datetime such as datetime(..., tzinfo=UTC)",
            field=name,
        )
    try:
        return value.astimezone(UTC)
    except OverflowError:  # e.g. 0001-01-01T00:00+01:00 is before year 1 in UTC
        raise errors.InvalidTiming(
            f"{name} {value.isoformat()} is outside the supported range "
            f"{MIN_INSTANT:%Y-%m-%d} to {MAX_INSTANT:%Y-%m-%d} (UTC)",
            field=name,
        ) from None


def check_instant(value: datetime, name: str) -> datetime:
    """``value`` as aware UTC if it lies in [MIN_INSTANT, MAX_INSTANT), else InvalidTiming."""
    utc = _require_aware(value, name)
    if not MIN_INSTANT <= utc < MAX_INSTANT:
        raise errors.InvalidTiming(
            f"{name} {value.isoformat()} is outside the supported range "
            f"{MIN_INSTANT:%Y-%m-%d} to {MAX_INSTANT:%Y-%m-%d} (UTC)",
            field=name,
        )
    return utc


# --- time zones ---------------------------------------------------------------------------


#: Files in the zoneinfo directory that are not IANA zone names: ``localtime`` is the host's
#: own zone (it differs between machines, so beats on two hosts would disagree).
_NOT_IANA = frozenset({"localtime", "posixrules"})


@functools.cache
def _zone_names() -> tuple[str, ...]:
    return tuple(sorted(available_timezones() - _NOT_IANA))


@functools.cache
def _zone_set() -> frozenset[str]:
    return frozenset(_zone_names())


def parse_timezone(name: str) -> ZoneInfo:
    """Return the IANA zone ``name`` or raise :class:`errors.UnknownTimeZone` with suggestions."""
    if isinstance(name, str) and name in _zone_set():
        try:
            return ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError, OSError):
            pass
    text = name if isinstance(name, str) else repr(name)
    names = _zone_names()
    by_lower = {n.lower(): n for n in names}
    exact = by_lower.get(text.strip().lower())
    close = [exact] if exact else difflib.get_close_matches(text.strip(), names, n=1, cutoff=0.6)
    hint = close[0] if close else "Europe/Berlin"
    raise errors.UnknownTimeZone(f"Unknown time zone {text!r}. Use an IANA name such as {hint!r}.")


# --- cron parsing ---------------------------------------------------------------------------


def _is_number(text: str) -> bool:
    """ASCII digits only: ``str.isdigit`` also accepts "²" (int() fails) and "٣" (read as 3)."""
    return text.isascii() and text.isdigit()


def _number(text: str) -> int:
    # Past four digits every field is out of range anyway; capping keeps int() away from
    # Python's 4300-digit conversion limit (a ValueError) and from huge range() steps.
    return int(text) if len(text) <= 4 else 10_000


def _parse_value(text: str, index: int, fieldtext: str) -> int:
    name, low, high, names = _FIELDS[index]
    if _is_number(text):
        value = _number(text)
    elif text.lower() in names:
        value = names.index(text.lower()) + (1 if index == 3 else 0)
    else:
        allowed = f"{low}-{high}" + (f" or a name ({', '.join(names[:3])}, ...)" if names else "")
        raise errors.InvalidCronExpression(
            f"Invalid {name} field {fieldtext!r}: {text!r} is not a number in {allowed}."
        )
    if not low <= value <= high:
        raise errors.InvalidCronExpression(
            f"Invalid {name} field {fieldtext!r}: {value} is out of range {low}-{high}."
        )
    return value


def _parse_field(text: str, index: int) -> frozenset[int]:
    name, low, high, _ = _FIELDS[index]
    values: set[int] = set()
    for item in text.split(","):
        base, slash, step_text = item.partition("/")
        step = 1
        if slash:
            if not _is_number(step_text) or _number(step_text) == 0:
                raise errors.InvalidCronExpression(
                    f"Invalid {name} field {text!r}: step {step_text!r} must be a positive integer."
                )
            step = _number(step_text)
        # The implicit end of the week is Saturday (6): "1/2" is Mon, Wed, Fri, not also Sunday.
        implicit_high = 6 if index == 4 else high
        if base == "*":
            start, stop = low, implicit_high
        elif "-" in base:
            first, _, last = base.partition("-")
            start, stop = _parse_value(first, index, text), _parse_value(last, index, text)
            if index == 4 and stop == 0 and start > 0:  # "mon-sun": Sunday as 7
                stop = 7
            if start > stop:
                raise errors.InvalidCronExpression(
                    f"Invalid {name} field {text!r}: range {base!r} runs backwards; "
                    "write it as two ranges joined by ','."
                )
        else:
            start = _parse_value(base, index, text)
            stop = implicit_high if slash else start  # "a/n" means a-max/n (cronie, croniter)
            if index == 4 and start == 7 and slash:  # Sunday as 7: "7/2" is "0/2"
                start = 0
        values.update(range(start, stop + 1, step))
    if index == 4 and 7 in values:  # 7 is Sunday too
        values.discard(7)
        values.add(0)
    return frozenset(values)


@dataclass(frozen=True)
class _CronSpec:
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: tuple[int, ...]
    weekdays: frozenset[int]  # cron numbering: 0 = Sunday
    day_or: bool  # Vixie: both day fields restricted -> either may match

    def day_matches(self, day: date) -> bool:
        dom = day.day in self.days
        dow = (day.weekday() + 1) % 7 in self.weekdays
        return (dom or dow) if self.day_or else (dom and dow)

    def matches(self, wall: datetime) -> bool:
        return (
            wall.minute in self.minutes
            and wall.hour in self.hours
            and wall.month in self.months
            and self.day_matches(wall.date())
        )

    def next_wall(self, wall: datetime) -> datetime | None:
        """First matching naive wall time at or after ``wall`` (whole minutes), else None."""
        cur = wall.replace(second=0, microsecond=0, fold=0)
        if cur != wall:
            cur += timedelta(minutes=1)
        day, hour, minute = cur.date(), cur.hour, cur.minute
        try:
            for _ in range(366 * _SEARCH_YEARS):
                if day.month not in self.months:
                    i = bisect.bisect_right(self.months, day.month)
                    if i < len(self.months):
                        day = date(day.year, self.months[i], 1)
                    else:
                        day = date(day.year + 1, self.months[0], 1)
                    hour = minute = 0
                    continue
                if self.day_matches(day):
                    found = self._time_at_or_after(hour, minute)
                    if found is not None:
                        return datetime.combine(day, found)
                day += timedelta(days=1)
                hour = minute = 0
        except (OverflowError, ValueError):  # ran past year 9999
            return None
        return None

    def _time_at_or_after(self, hour: int, minute: int) -> time | None:
        h = bisect.bisect_left(self.hours, hour)
        if h < len(self.hours) and self.hours[h] == hour:
            m = bisect.bisect_left(self.minutes, minute)
            if m < len(self.minutes):
                return time(hour, self.minutes[m])
            h += 1
        return time(self.hours[h], self.minutes[0]) if h < len(self.hours) else None


def cron_fields(expression: str) -> tuple[frozenset[int], ...]:
    """The values each field of ``expression`` allows: minutes, hours, days of the month,
    months, weekdays (0 = Sunday). ``ValidationError`` when it is not a valid expression."""
    spec = _compile_cron(expression)
    return (
        frozenset(spec.minutes), frozenset(spec.hours), spec.days, frozenset(spec.months),
        spec.weekdays,
    )  # fmt: skip


def _compile_cron(expression: str) -> _CronSpec:
    if not isinstance(expression, str):
        raise errors.InvalidCronExpression("Cron expression is empty; expected five fields.")
    return _compile_cron_text(expression)


#: Parsed expressions are immutable and schedules share a handful of them ("0 * * * *"):
#: parsing was most of the per-schedule planning cost, so each text is parsed once.
@functools.lru_cache(maxsize=65536)
def _compile_cron_text(expression: str) -> _CronSpec:
    if not expression.strip():
        raise errors.InvalidCronExpression("Cron expression is empty; expected five fields.")
    text = expression.strip()
    if len(text) > MAX_CRON_LENGTH:
        raise errors.InvalidCronExpression(
            f"Cron expression is {len(text)} characters long; at most {MAX_CRON_LENGTH} (the "
            "length of the stored column)."
        )
    if text.startswith("@"):
        macro = text.lower()
        if macro == "@reboot":
            raise errors.InvalidCronExpression(
                "'@reboot' is not a schedule: it has no fire times. Use a five-field expression."
            )
        if macro not in MACROS:
            raise errors.InvalidCronExpression(
                f"Unknown cron macro {text!r}; use one of {', '.join(MACROS)}."
            )
        text = MACROS[macro]
    parts = text.split()
    if len(parts) != 5:
        extra = " (seconds or year fields are not supported)" if len(parts) in (6, 7) else ""
        raise errors.InvalidCronExpression(
            f"Cron expression {expression!r} has {len(parts)} fields; expected five "
            f"(minute hour day-of-month month day-of-week){extra}."
        )
    sets = [_parse_field(part, i) for i, part in enumerate(parts)]
    spec = _CronSpec(
        minutes=tuple(sorted(sets[0])),
        hours=tuple(sorted(sets[1])),
        days=sets[2],
        months=tuple(sorted(sets[3])),
        weekdays=sets[4],
        day_or=not parts[2].startswith("*") and not parts[4].startswith("*"),
    )
    # Exact and cheap: with OR semantics every month has every weekday; otherwise some
    # (month, day) must exist, and every calendar date falls on every weekday eventually.
    if not spec.day_or and not any(
        d <= _MONTH_MAX_DAYS[m - 1] for m in spec.months for d in spec.days
    ):
        raise errors.CronNeverFires(
            f"Cron expression {expression!r} never fires: no month in its month field has "
            f"day {'/'.join(str(d) for d in sorted(spec.days))}."
        )
    return spec


# --- triggers ---------------------------------------------------------------------------------


def _policy(enum: type[DstGap] | type[DstFold], value: object, name: str) -> Any:
    """``value`` as a member of ``enum`` (its name in any case), else InvalidPolicy on ``name``."""
    if isinstance(value, enum):
        return value
    try:
        return enum(value.upper() if isinstance(value, str) else str(value))
    except ValueError:
        choices = ", ".join(m.value for m in enum)
        raise errors.InvalidPolicy(
            f"{name} {short_repr(value)} is not one of {choices}", field=name
        ) from None


def dst_policy(
    dst_gap: object = None, dst_fold: object = None, *, cron: bool
) -> tuple[DstGap, DstFold]:
    """The DST policy given (None: the default), checked; ``cron=False`` allows only defaults.

    An interval counts elapsed time and a one-off is one instant: neither reads a wall clock,
    so none of their times is missing or repeated, and a policy given for them would silently
    do nothing. It is refused instead, naming the field.
    """
    gap = DstGap.SKIP if dst_gap is None or dst_gap == "" else _policy(DstGap, dst_gap, "dst_gap")
    fold = (
        DstFold.FIRST
        if dst_fold is None or dst_fold == ""
        else _policy(DstFold, dst_fold, "dst_fold")
    )
    if not cron:
        for name, value, default in (
            ("dst_gap", gap, DstGap.SKIP),
            ("dst_fold", fold, DstFold.FIRST),
        ):
            if value is not default:
                raise errors.InvalidPolicy(
                    f"{name} applies to cron schedules only: an interval counts elapsed time "
                    f"and a one-off is one instant, so none of their times is missing or "
                    f"repeated; leave {name} at {default.value}",
                    field=name,
                )
    return gap, fold


#: What one matching naive wall time fires under a trigger's DST policy: (earliest,
#: instants). ``earliest`` bounds every instant of this and of every later wall time from
#: below: the instant of a time that exists once, the first of a repeated one, the end of the
#: gap for a missing one. It grows with the wall time, which is what lets the search stop. A
#: plain tuple: this is the materializer's hot path, where a frozen dataclass costs more.
_Wall = tuple[datetime, tuple[datetime, ...]]


@functools.lru_cache(maxsize=4096)
def _gap_end(zone: ZoneInfo, wall: datetime) -> datetime:
    """The first existing instant after the gap that contains the missing wall time ``wall``.

    With fold=1 (the offset after the change) ``wall`` maps before the change, with fold=0
    (the offset before it) at or after it: the change is in between, found to the second
    (zone changes happen on whole seconds).
    """
    lo = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    hi = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    second = timedelta(seconds=1)
    while hi - lo > second:
        mid = lo + ((hi - lo) // second // 2) * second
        if mid.astimezone(zone).replace(tzinfo=None) > wall:
            hi = mid
        else:
            lo = mid
    return hi


def wall_instant(wall: datetime, zone: ZoneInfo) -> tuple[datetime, bool]:
    """The instant a naive wall time names in ``zone``, and whether it was missing.

    A repeated wall time names its first occurrence (fold=0). A missing one (in a gap) names
    the gap's end, the first instant whose wall time is later: ``replace(tzinfo=zone)``
    alone reads it with the offset before the change, an hour (the gap) past that.
    """
    local = wall.replace(tzinfo=zone, fold=0)
    try:
        exists = local.astimezone(UTC).astimezone(zone).replace(tzinfo=None) == local.replace(
            tzinfo=None
        )
    except OverflowError:  # year 1 or 9999: out of range, which check_instant then says
        return local, False
    if exists:
        return local, False
    return _gap_end(zone, local.replace(tzinfo=None)).astimezone(zone), True


@dataclass(frozen=True, kw_only=True)
class CronTrigger:
    """A five-field cron expression evaluated in the IANA zone ``timezone``.

    ``dst_gap`` and ``dst_fold`` choose what a wall time that does not exist (spring forward)
    or exists twice (fall back) fires; the defaults keep the contract of the module docstring.
    """

    expression: str
    timezone: str = "UTC"
    dst_gap: DstGap = DstGap.SKIP
    dst_fold: DstFold = DstFold.FIRST
    _spec: _CronSpec = field(init=False, repr=False, compare=False)
    _zone: ZoneInfo = field(init=False, repr=False, compare=False)
    _default: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_spec", _compile_cron(self.expression))
        object.__setattr__(self, "_zone", parse_timezone(self.timezone))
        object.__setattr__(self, "dst_gap", _policy(DstGap, self.dst_gap, "dst_gap"))
        object.__setattr__(self, "dst_fold", _policy(DstFold, self.dst_fold, "dst_fold"))
        default = self.dst_gap is DstGap.SKIP and self.dst_fold is DstFold.FIRST
        object.__setattr__(self, "_default", default)

    def _search(self, at: datetime, *, inclusive: bool) -> datetime | None:
        if inclusive:
            # The end of a gap is the instant of wall times before wall(at) (SHIFT): asking
            # for the first fire time after the instant just before ``at`` finds it.
            try:
                at -= timedelta(microseconds=1)
            except OverflowError:
                pass
            else:
                inclusive = False
        local = at.astimezone(self._zone)
        wall = local.replace(tzinfo=None, fold=0)
        if self._default:
            return self._search_default(at, wall, inclusive=inclusive)
        if self.dst_fold is not DstFold.FIRST and local.fold == 0:
            # ``at`` may be in the first pass of a repeated hour: the second instants of the
            # repeated wall times before it are still ahead, so the walk starts that much
            # earlier (width 0 outside a repeated hour).
            later = local.replace(fold=1).utcoffset()
            width = (local.utcoffset() or timedelta(0)) - (later or timedelta(0))
            if width > timedelta(0):
                wall -= width
        candidate = self._spec.next_wall(wall)
        best: datetime | None = None
        while candidate is not None:
            earliest, instants = self._resolve(candidate)
            for instant in instants:
                if (instant >= at if inclusive else instant > at) and (
                    best is None or instant < best
                ):
                    best = instant
            # One instant per wall time grows with the wall time, so the first one found is
            # the answer; with BOTH a second instant can follow a later wall time's first.
            if best is not None and (self.dst_fold is not DstFold.BOTH or earliest >= best):
                return best
            candidate = self._spec.next_wall(candidate + timedelta(minutes=1))
        return best

    def _search_default(self, at: datetime, wall: datetime, *, inclusive: bool) -> datetime | None:
        """SKIP and FIRST (nearly every schedule): each wall time has at most one instant and
        they grow with it, so the first one past ``at`` is the answer. The general walk gives
        the same (the policy test checks both), but costs more per call on the hot path
        (bench/README.md, "Cron next fire time per DST policy")."""
        candidate = self._spec.next_wall(wall)
        while candidate is not None:
            try:
                instant = candidate.replace(tzinfo=self._zone, fold=0).astimezone(UTC)
                exists = instant.astimezone(self._zone).replace(tzinfo=None) == candidate
            except OverflowError:  # the edge of datetime's range
                return None
            if exists and (instant >= at if inclusive else instant > at):
                return instant
            # Only gaps and the second pass of a fall-back get here: a few iterations.
            candidate = self._spec.next_wall(candidate + timedelta(minutes=1))
        return None

    def _resolve(self, wall: datetime) -> _Wall:
        """The instants the naive wall time ``wall`` fires under this trigger's policy."""
        try:
            first = wall.replace(tzinfo=self._zone, fold=0).astimezone(UTC)
            if first.astimezone(self._zone).replace(tzinfo=None) != wall:
                # A spring-forward gap: the round trip lands elsewhere.
                end = _gap_end(self._zone, wall)
                return end, ((end,) if self.dst_gap is DstGap.SHIFT else ())
            if self.dst_fold is DstFold.FIRST:  # the hot path: no second conversion
                return first, (first,)
            second = wall.replace(tzinfo=self._zone, fold=1).astimezone(UTC)
        except OverflowError:  # the edge of datetime's range
            return MAX_INSTANT, ()
        if second == first:
            return first, (first,)
        if self.dst_fold is DstFold.SECOND:
            return first, (second,)
        return first, (first, second)

    def exists(self, wall: datetime) -> bool:
        """Whether the naive local wall time ``wall`` exists in the zone (not in a gap)."""
        try:
            utc = wall.replace(tzinfo=self._zone, fold=0).astimezone(UTC)
            return utc.astimezone(self._zone).replace(tzinfo=None) == wall
        except OverflowError:
            return False

    def next_after(self, after: datetime) -> datetime | None:
        return self._search(_require_aware(after, "after"), inclusive=False)

    def first_at_or_after(self, at: datetime) -> datetime | None:
        return self._search(_require_aware(at, "at"), inclusive=True)

    def matches_wall(self, wall: datetime) -> bool:
        """Whether a naive local wall time matches the expression's fields."""
        return self._spec.matches(wall)

    @property
    def zone(self) -> ZoneInfo:
        return self._zone


#: Longest interval: anything longer is better said with a cron (and stays far from
#: datetime's range when multiplied by a preview count).
MAX_INTERVAL = timedelta(days=366)


def parse_interval(value: object, name: str = "interval") -> timedelta:
    """Whole seconds (int, integral float, timedelta or a string of ASCII digits) from 1 s
    to MAX_INTERVAL, else :class:`errors.InvalidTiming` naming ``name``."""
    seconds: int | None = None
    if isinstance(value, str) and _is_number(value.strip()) and len(value.strip()) > 12:
        seconds = 10**12  # far out of range; keeps int() away from huge digit strings
    elif isinstance(value, timedelta):
        total = value.total_seconds()
        seconds = int(total) if total == int(total) else None
    elif isinstance(value, float) and value.is_integer():
        seconds = int(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        seconds = value
    elif isinstance(value, str) and _is_number(value.strip()):
        seconds = int(value.strip())
    if seconds is None:
        raise errors.InvalidTiming(
            f"{name} must be a whole number of seconds, got {short_repr(value)}", field=name
        )
    if not 1 <= seconds <= MAX_INTERVAL.total_seconds():
        raise errors.InvalidTiming(
            f"{name} must be from 1 second to {MAX_INTERVAL.days} days "
            f"({int(MAX_INTERVAL.total_seconds())} s), got {short_repr(value)}; use a cron "
            "for longer periods",
            field=name,
        )
    return timedelta(seconds=seconds)


def short_repr(value: object) -> str:
    """``repr(value)`` cut to 40 characters, for messages that quote a refused value."""
    try:
        text = repr(value)
    except ValueError:  # an int past Python's 4300-digit str() limit
        return "a number too large to print"
    return text if len(text) <= 40 else text[:37] + "..."


@dataclass(frozen=True, kw_only=True)
class IntervalTrigger:
    """Fires at ``anchor + k * every`` for k >= 0: elapsed time, DST plays no part."""

    every: timedelta
    anchor: datetime

    def __post_init__(self) -> None:
        if not isinstance(self.every, timedelta) or self.every < timedelta(seconds=1):
            raise errors.InvalidTiming(
                f"Interval must be a timedelta of at least 1 second, got {self.every!r}.",
                field="interval",
            )
        object.__setattr__(self, "anchor", _require_aware(self.anchor, "anchor"))

    def next_after(self, after: datetime) -> datetime | None:
        after = _require_aware(after, "after")
        if after < self.anchor:
            return self.anchor
        try:
            return self.anchor + ((after - self.anchor) // self.every + 1) * self.every
        except OverflowError:  # past year 9999: no further fire time, as for cron
            return None

    def first_at_or_after(self, at: datetime) -> datetime | None:
        at = _require_aware(at, "at")
        if at <= self.anchor:
            return self.anchor
        try:
            return self.anchor + -((self.anchor - at) // self.every) * self.every
        except OverflowError:
            return None


@dataclass(frozen=True, kw_only=True)
class OneOffTrigger:
    """Fires once, at ``run_at``."""

    run_at: datetime

    def __post_init__(self) -> None:
        object.__setattr__(self, "run_at", _require_aware(self.run_at, "run_at"))

    def next_after(self, after: datetime) -> datetime | None:
        return self.run_at if self.run_at > _require_aware(after, "after") else None

    def first_at_or_after(self, at: datetime) -> datetime | None:
        return self.run_at if self.run_at >= _require_aware(at, "at") else None


Trigger = CronTrigger | IntervalTrigger | OneOffTrigger


def trigger_of(
    kind: ScheduleKind | str,
    *,
    cron: str | None = None,
    timezone: str = "UTC",
    dst_gap: DstGap | str = DstGap.SKIP,
    dst_fold: DstFold | str = DstFold.FIRST,
    every: timedelta | None = None,
    anchor: datetime | None = None,
    run_at: datetime | None = None,
) -> Trigger:
    """The one place a schedule kind becomes a trigger: CRON -> ``CronTrigger(cron, timezone,
    dst_gap, dst_fold)``, INTERVAL -> ``IntervalTrigger(every, anchor)``, ONE_OFF ->
    ``OneOffTrigger(run_at)``; the fields of the other kinds are ignored."""
    kind = ScheduleKind(kind)
    if kind is ScheduleKind.CRON:
        assert cron is not None
        return CronTrigger(
            expression=cron, timezone=timezone, dst_gap=DstGap(dst_gap), dst_fold=DstFold(dst_fold)
        )
    if kind is ScheduleKind.INTERVAL:
        assert every is not None
        assert anchor is not None
        return IntervalTrigger(every=every, anchor=anchor)
    assert run_at is not None
    return OneOffTrigger(run_at=run_at)


def fire_times(
    trigger: Trigger,
    after: datetime,
    *,
    until: datetime | None = None,
    limit: int | None = None,
) -> Iterator[datetime]:
    """Fire times strictly after ``after`` and at or before ``until``, at most ``limit``."""
    current = _require_aware(after, "after")
    end = _require_aware(until, "until") if until is not None else None
    produced = 0
    while limit is None or produced < limit:
        nxt = trigger.next_after(current)
        if nxt is None or (end is not None and nxt > end):
            return
        yield nxt
        produced += 1
        current = nxt


def describe_cron(expression: str) -> str:
    """Human text for a validated cron expression, e.g. "At 09:00, Monday through Friday"."""
    spec = _compile_cron(expression)
    text = MACROS.get(expression.strip().lower(), expression.strip())
    options = cron_descriptor.Options()
    options.use_24hour_time_format = True
    descriptor = cron_descriptor.ExpressionDescriptor(text, options)
    described = str(descriptor.get_description())
    if spec.day_or:
        # Both day fields restricted: Vixie cron runs on a day either one matches, where
        # cron-descriptor words them as both ("..., only on Monday").
        weekdays = str(descriptor.get_description(cron_descriptor.DescriptionTypeEnum.DAYOFWEEK))
        if weekdays and weekdays in described:
            days = weekdays.removeprefix(", ").removeprefix("only on ")
            described = described.replace(weekdays, f", or on {days}", 1)
    return described


def describe_dst(trigger: CronTrigger) -> str:
    """A cron's non-default DST policy in words, as "; DST: ..." ("" for the defaults)."""
    parts = []
    if trigger.dst_gap is DstGap.SHIFT:
        parts.append("a missing wall time runs at the end of the gap (dst_gap=SHIFT)")
    if trigger.dst_fold is DstFold.SECOND:
        parts.append("a repeated wall time runs at its second instant (dst_fold=SECOND)")
    elif trigger.dst_fold is DstFold.BOTH:
        parts.append("a repeated wall time runs twice (dst_fold=BOTH)")
    return f"; DST: {', '.join(parts)}" if parts else ""


# --- preview --------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PreviewRow:
    utc: datetime
    local: datetime
    note: str


def _hm(delta: timedelta) -> str:
    minutes = int(abs(delta).total_seconds()) // 60
    return f"{minutes // 60}:{minutes % 60:02d}"


def _transition_note(zone: ZoneInfo, before: datetime, after: datetime) -> str:
    """Describe the (last) offset change between two UTC instants, or "" if none."""
    old, new = before.astimezone(zone).utcoffset(), after.astimezone(zone).utcoffset()
    if old is None or new is None or old == new:
        return ""
    lo, hi = before, after  # invariant: offset(lo) != new, offset(hi) == new
    while hi - lo > timedelta(seconds=1):
        mid = lo + (hi - lo) / 2
        if mid.astimezone(zone).utcoffset() == new:
            hi = mid
        else:
            lo = mid
    change = hi.replace(microsecond=0)
    prev = lo.astimezone(zone).utcoffset() or old
    wall_old, wall_new = (change + prev).strftime("%H:%M"), (change + new).strftime("%H:%M")
    direction = "forward" if new > prev else "back"
    return (
        f"DST change: clocks move {direction} {_hm(new - prev)} ({wall_old} -> {wall_new}) "
        "before this run"
    )


def _span(walls: list[datetime]) -> str:
    return f"{walls[0]:%H:%M}" + (f"-{walls[-1]:%H:%M}" if len(walls) > 1 else "")


def _matching_walls(trigger: CronTrigger, lo: datetime, hi: datetime) -> list[datetime]:
    """Matching naive wall times in [lo, hi), at most 120 (a note, not a listing)."""
    found: list[datetime] = []
    cursor = lo
    for _ in range(120):
        cand = trigger._spec.next_wall(cursor)
        if cand is None or cand >= hi:
            break
        found.append(cand)
        cursor = cand + timedelta(minutes=1)
    return found


def _fold_note(trigger: CronTrigger, local: datetime) -> str:
    """The note of a run at a repeated wall time: which instant, and which policy chose it."""
    wall = f"{local:%H:%M}"
    if trigger.dst_fold is DstFold.FIRST:
        return f"repeated wall time {wall} runs once (first instant)"
    if trigger.dst_fold is DstFold.SECOND:
        return f"repeated wall time {wall} runs once (second instant, dst_fold=SECOND)"
    which = "second" if local.fold else "first"
    return f"repeated wall time {wall} runs twice: the {which} run (dst_fold=BOTH)"


def _row_note(trigger: Trigger, previous: datetime, instant: datetime) -> str:
    if not isinstance(trigger, CronTrigger):
        return ""
    zone = trigger.zone
    notes = [_transition_note(zone, previous, instant)]
    local = instant.astimezone(zone)
    wall = local.replace(tzinfo=None, fold=0)
    before = (instant - timedelta(seconds=1)).astimezone(zone).replace(tzinfo=None, fold=0)
    if trigger.dst_gap is DstGap.SHIFT and before + timedelta(seconds=1) < wall:
        # ``instant`` ends a gap: the matching wall times inside it were moved here.
        gap_start = before.replace(second=0) + timedelta(minutes=1)
        moved = [w for w in _matching_walls(trigger, gap_start, wall) if not trigger.exists(w)]
        if moved:
            notes.append(
                f"{_span(moved)} did not exist; runs at the end of the gap, {wall:%H:%M} "
                "(dst_gap=SHIFT)"
            )
    if wall.replace(tzinfo=zone, fold=1).utcoffset() != wall.replace(tzinfo=zone).utcoffset():
        notes.append(_fold_note(trigger, local))
    elif notes[0] and "back" in notes[0] and trigger.dst_fold is DstFold.FIRST:
        notes.append("after fall-back; repeated wall time runs once")
    if trigger.dst_gap is DstGap.SKIP:
        # Wall times between the two runs that matched but do not exist were skipped.
        start = previous.astimezone(zone).replace(tzinfo=None, fold=0) + timedelta(minutes=1)
        skipped = [w for w in _matching_walls(trigger, start, wall) if not trigger.exists(w)]
        if skipped:
            notes.append(f"{_span(skipped)} did not exist and was skipped")
    return "; ".join(n for n in notes if n)


def preview(trigger: Trigger, *, start: datetime, count: int = 10) -> list[PreviewRow]:
    """The next ``count`` fire times strictly after ``start``, with DST notes per run."""
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_PREVIEW:
        raise errors.ValidationError(
            f"count must be an integer from 1 to {MAX_PREVIEW}, got {count!r}.", field="count"
        )
    start = _require_aware(start, "start")
    zone = trigger.zone if isinstance(trigger, CronTrigger) else UTC
    rows: list[PreviewRow] = []
    previous = start
    for instant in fire_times(trigger, start, limit=count):
        note = _row_note(trigger, previous, instant)
        rows.append(PreviewRow(utc=instant, local=instant.astimezone(zone), note=note))
        previous = instant
    return rows
