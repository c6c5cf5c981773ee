"""Turn caller input into a validated :class:`ScheduleSpec`, writing nothing.

Every rejection is a specific ``celery_scheduler.errors.ValidationError`` subclass whose
``field`` names the argument, so the admin form and the CLI put the message in the right
place. The database constraints stay the final word; this module exists for precise errors.
"""

from __future__ import annotations

import copy
import difflib
import functools
import hashlib
import json
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from celery._state import get_current_app
from django.db import connection

from celery_scheduler import errors
from celery_scheduler.core import timemath
from celery_scheduler.core.enums import DstFold, DstGap, MisfirePolicy, OverlapPolicy, ScheduleKind
from django_app import conf

if TYPE_CHECKING:
    from django_app.models import Schedule

MAX_INTERVAL = timemath.MAX_INTERVAL
#: Deepest nesting of args/kwargs (PostgreSQL's jsonb and json.dumps both have limits).
MAX_JSON_DEPTH = 100
#: MariaDB's JSON columns are checked with JSON_VALID, which refuses 32 or more nested levels.
MAX_JSON_DEPTH_MARIADB = 30


def max_json_depth() -> int:
    """The deepest args/kwargs nesting the configured database stores."""
    if connection.vendor == "mysql" and getattr(connection, "mysql_is_mariadb", False):
        return MAX_JSON_DEPTH_MARIADB
    return MAX_JSON_DEPTH


MAX_CONCURRENCY_LIMIT = 100_000
MAX_ATTEMPTS_LIMIT = 1_000


@dataclass(frozen=True, kw_only=True)
class ScheduleSpec:
    """Everything that defines a schedule's behaviour, validated."""

    name: str
    task: str
    kind: ScheduleKind
    cron: str = ""
    timezone: str = "UTC"
    dst_gap: DstGap = DstGap.SKIP
    dst_fold: DstFold = DstFold.FIRST
    interval_seconds: int | None = None
    run_at: datetime | None = None
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    queue: str = ""
    priority: int = 0
    misfire_policy: MisfirePolicy = MisfirePolicy.SKIP
    max_lateness_seconds: int = 300
    catchup_cap: int = 10
    overlap_policy: OverlapPolicy = OverlapPolicy.ALLOW
    flexible_window_seconds: int = 0
    concurrency_limit: int | None = None
    concurrency_group: str = ""
    max_attempts: int | None = None
    deadline_seconds: int | None = None
    start_at: datetime | None = None
    end_at: datetime | None = None

    def trigger(self, *, anchor: datetime) -> timemath.Trigger:
        """The time rule of this spec; ``anchor`` starts an interval without a start_at."""
        every = self.interval_seconds
        return timemath.trigger_of(
            self.kind, cron=self.cron, timezone=self.timezone, dst_gap=self.dst_gap,
            dst_fold=self.dst_fold, every=None if every is None else timedelta(seconds=every),
            anchor=self.start_at or anchor, run_at=self.run_at,
        )  # fmt: skip

    def _values(self) -> dict[str, Any]:
        # dataclasses.asdict deep-copies every value; the fields are flat (args and kwargs
        # are already the spec's own copies), so a shallow read gives the same dict at a
        # fraction of the cost (a bulk create computes it twice per item).
        fields = self.__dict__  # a frozen dataclass's values; getattr per field is slower
        return {name: fields[name] for name in _SPEC_FIELDS}

    def content_hash(self) -> str:
        """Stable digest of the spec, to tell a replayed create from a conflicting one."""
        values = self._values()
        # The DST policy joined the spec in migration 0018: left out at its defaults, the
        # digest of every schedule created before stays what it was, so a replayed create
        # with the same key and content is still a replay, not a conflict.
        if values["dst_gap"] is DstGap.SKIP:
            del values["dst_gap"]
        if values["dst_fold"] is DstFold.FIRST:
            del values["dst_fold"]
        payload = json.dumps(values, sort_keys=True, default=str, separators=(",", ":"))
        return hashlib.sha256(payload.encode()).hexdigest()

    def model_fields(self, *, copy_arguments: bool = True) -> dict[str, Any]:
        """The Schedule model columns this spec sets (args and kwargs copied, unless the
        caller only serialises them)."""
        values = self._values()
        if copy_arguments:
            values["args"] = copy.deepcopy(self.args)
            values["kwargs"] = copy.deepcopy(self.kwargs)
        values["kind"] = self.kind.value
        values["dst_gap"] = self.dst_gap.value
        values["dst_fold"] = self.dst_fold.value
        values["misfire_policy"] = self.misfire_policy.value
        values["overlap_policy"] = self.overlap_policy.value
        return values


_SPEC_FIELDS = tuple(f.name for f in fields(ScheduleSpec))

#: Keyword arguments of create_schedule/update_schedule that map onto a ScheduleSpec.
INPUT_FIELDS = frozenset(
    {
        "name", "task", "cron", "timezone", "dst_gap", "dst_fold", "interval", "run_at",
        "args", "kwargs", "queue",
        "priority", "misfire_policy", "max_lateness", "catchup_cap", "overlap_policy",
        "flexible_window", "concurrency_limit", "concurrency_group", "max_attempts",
        "deadline", "start_at", "end_at",
    }
)  # fmt: skip


def spec_of(schedule: Schedule) -> ScheduleSpec:
    """The validated spec a stored schedule carries (no re-validation)."""
    return ScheduleSpec(
        name=schedule.name,
        task=schedule.task,
        kind=ScheduleKind(schedule.kind),
        cron=schedule.cron,
        timezone=schedule.timezone,
        dst_gap=DstGap(schedule.dst_gap),
        dst_fold=DstFold(schedule.dst_fold),
        interval_seconds=schedule.interval_seconds,
        run_at=schedule.run_at,
        args=list(schedule.args or []),
        kwargs=dict(schedule.kwargs or {}),
        queue=schedule.queue,
        priority=schedule.priority,
        misfire_policy=MisfirePolicy(schedule.misfire_policy),
        max_lateness_seconds=schedule.max_lateness_seconds,
        catchup_cap=schedule.catchup_cap,
        overlap_policy=OverlapPolicy(schedule.overlap_policy),
        flexible_window_seconds=schedule.flexible_window_seconds,
        concurrency_limit=schedule.concurrency_limit,
        concurrency_group=schedule.concurrency_group,
        max_attempts=schedule.max_attempts,
        deadline_seconds=schedule.deadline_seconds,
        start_at=schedule.start_at,
        end_at=schedule.end_at,
    )


def spec_to_input(spec: ScheduleSpec) -> dict[str, Any]:
    """The create_schedule keyword arguments that would produce ``spec`` (used by update)."""
    return {
        "name": spec.name,
        "task": spec.task,
        "cron": spec.cron or None,
        "timezone": spec.timezone,
        "dst_gap": spec.dst_gap,
        "dst_fold": spec.dst_fold,
        "interval": spec.interval_seconds,
        "run_at": spec.run_at,
        "args": spec.args,
        "kwargs": spec.kwargs,
        "queue": spec.queue,
        "priority": spec.priority,
        "misfire_policy": spec.misfire_policy,
        "max_lateness": spec.max_lateness_seconds,
        "catchup_cap": spec.catchup_cap,
        "overlap_policy": spec.overlap_policy,
        "flexible_window": spec.flexible_window_seconds,
        "concurrency_limit": spec.concurrency_limit,
        "concurrency_group": spec.concurrency_group,
        "max_attempts": spec.max_attempts,
        "deadline": spec.deadline_seconds,
        "start_at": spec.start_at,
        "end_at": spec.end_at,
    }


@dataclass
class BatchMemo:
    """What :func:`validate` learnt about values many items of one batch share.

    Only checks whose answer depends on nothing but the value itself are kept (the task
    name against the Celery registry; cron, interval and time zone), and only when they
    passed: a refused value is checked again for every item that has it, so each error
    still names its own item. One memo lives for one call (a bulk create): a task
    registered or a setting changed later is seen by the next call.
    """

    tasks: dict[str, str] = field(default_factory=dict)
    triggers: dict[tuple[Any, ...], tuple[ScheduleKind, str, str, int | None, None]] = field(
        default_factory=dict
    )


def late_run_at(
    run_at: datetime | None, max_lateness: int, *, now: datetime
) -> errors.InvalidTiming | None:
    """The refusal of a new one-off whose ``run_at`` is past its ``max_lateness`` (seconds)
    at ``now``; None if it is not."""
    if run_at is None or (now - run_at).total_seconds() <= max_lateness:
        return None
    return errors.InvalidTiming(
        f"run_at {run_at.isoformat()} is {int((now - run_at).total_seconds())} s in the "
        f"past, beyond max_lateness ({max_lateness} s); pick a future time",
        field="run_at",
    )


def validate(
    *,
    now: datetime,
    settings: conf.SchedulerSettings | None = None,
    json_depth: int | None = None,
    memo: BatchMemo | None = None,
    late_run_at_ok: bool = False,
    **values: Any,
) -> ScheduleSpec:
    """Validate create/update input (see ``INPUT_FIELDS``) into a spec, or raise.

    ``settings`` and ``json_depth`` (:func:`max_json_depth`): when the caller already read
    them (a bulk create validates many items against one reading); ``memo``: the checks of
    values already accepted for an earlier item of the same batch (:class:`BatchMemo`);
    ``late_run_at_ok``: leave a ``run_at`` past its ``max_lateness`` to the caller
    (:func:`late_run_at`), which a keyed create first looks up as a replay.
    """
    unknown = sorted(set(values) - INPUT_FIELDS)
    if unknown:
        raise errors.ValidationError(
            f"Unknown schedule field(s) {unknown}; allowed: {sorted(INPUT_FIELDS)}",
            field=unknown[0],
        )
    settings = settings or conf.get()
    name = checked_text(values.get("name"), "name", required=True, max_length=200)
    raw_task = values.get("task")
    if memo is not None and type(raw_task) is str and raw_task in memo.tasks:
        task = memo.tasks[raw_task]
    else:
        task = _task_name(raw_task, check_registry=settings.validate_task_names)
        if memo is not None and type(raw_task) is str:
            memo.tasks[raw_task] = task
    kind, cron, tz_name, interval_seconds, run_at = _memo_trigger_fields(values, memo)
    dst_gap, dst_fold = timemath.dst_policy(
        values.get("dst_gap"), values.get("dst_fold"), cron=kind is ScheduleKind.CRON
    )
    start_at = aware_datetime(values.get("start_at"), "start_at")
    end_at = aware_datetime(values.get("end_at"), "end_at")
    if start_at and end_at and end_at <= start_at:
        raise errors.InvalidTiming(
            f"end_at ({end_at.isoformat()}) must be after start_at ({start_at.isoformat()})",
            field="end_at",
        )
    max_lateness = _seconds(
        values.get("max_lateness"), "max_lateness",
        default=settings.default_max_lateness_seconds, low=0,
        high=settings.max_lateness_limit_seconds,
    )  # fmt: skip
    late = None if late_run_at_ok else late_run_at(run_at, max_lateness, now=now)
    if late is not None:
        raise late
    misfire = enum_member(MisfirePolicy, values.get("misfire_policy"), "misfire_policy")
    catchup_cap = bounded_int(
        values.get("catchup_cap"), "catchup_cap",
        default=settings.default_catchup_cap, low=0, high=settings.max_catchup_cap,
    )  # fmt: skip
    if misfire is MisfirePolicy.CATCH_UP and catchup_cap < 1:
        raise errors.InvalidPolicy("CATCH_UP needs catchup_cap >= 1", field="catchup_cap")
    depth = json_depth or max_json_depth()
    (args, args_size), (kwargs, kwargs_size) = (
        _args(values.get("args"), depth),
        _kwargs(values.get("kwargs"), depth),
    )
    _check_payload_size(args_size, kwargs_size, settings.max_arguments_bytes)
    spec = ScheduleSpec(
        name=name,
        task=task,
        kind=kind,
        cron=cron,
        timezone=tz_name,
        dst_gap=dst_gap,
        dst_fold=dst_fold,
        interval_seconds=interval_seconds,
        run_at=run_at,
        args=args,
        kwargs=kwargs,
        queue=checked_text(values.get("queue"), "queue", max_length=200),
        priority=bounded_int(values.get("priority"), "priority", default=0, low=0, high=255),
        misfire_policy=misfire,
        max_lateness_seconds=max_lateness,
        catchup_cap=catchup_cap,
        overlap_policy=enum_member(OverlapPolicy, values.get("overlap_policy"), "overlap_policy"),
        flexible_window_seconds=_seconds(
            values.get("flexible_window"),
            "flexible_window",
            default=0,
            low=0,
            high=settings.max_flexible_window_seconds,
        ),
        concurrency_limit=optional_int(
            values.get("concurrency_limit"), "concurrency_limit", 1, MAX_CONCURRENCY_LIMIT
        ),
        concurrency_group=_concurrency_group(values.get("concurrency_group")),
        max_attempts=optional_int(values.get("max_attempts"), "max_attempts", 1, 1000),
        deadline_seconds=_optional_seconds(values.get("deadline"), "deadline"),
        start_at=start_at,
        end_at=end_at,
    )
    if run_at is not None:
        # A one-off may be a little late (max_lateness), so it is not judged from now; but
        # outside [start_at, end_at] it would never fire, and the create would not say so.
        outside = ("start_at", start_at) if start_at and run_at < start_at else None
        outside = ("end_at", end_at) if end_at and run_at > end_at else outside
        if outside is not None:
            raise errors.InvalidTiming(
                f"run_at {run_at.isoformat()} is outside [start_at, end_at]: the one-off "
                "would never fire",
                field=outside[0],
            )
        return spec
    first = first_fire(spec, anchor=now, at=max(now, start_at) if start_at else now)
    if first is None or (end_at and first > end_at):
        raise errors.InvalidTiming(
            "the schedule never fires between start_at and end_at", field="end_at"
        )
    return spec


def first_fire(spec: ScheduleSpec, *, anchor: datetime, at: datetime) -> datetime | None:
    """``spec.trigger(anchor=anchor).first_at_or_after(at)``, cached for cron.

    A create computes it twice (validation, then the cursor) and a bulk create once more
    per item, mostly for a few distinct expressions: a cron's answer depends only on
    (expression, zone, at), so it is computed once per distinct triple.
    """
    if spec.kind is ScheduleKind.CRON:
        return _first_cron_fire(spec.cron, spec.timezone, spec.dst_gap, spec.dst_fold, at)
    return spec.trigger(anchor=anchor).first_at_or_after(at)


@functools.lru_cache(maxsize=4096)
def _first_cron_fire(
    expression: str, timezone: str, dst_gap: DstGap, dst_fold: DstFold, at: datetime
) -> datetime | None:
    trigger = timemath.CronTrigger(
        expression=expression, timezone=timezone, dst_gap=dst_gap, dst_fold=dst_fold
    )
    return trigger.first_at_or_after(at)


def _memo_trigger_fields(
    values: dict[str, Any], memo: BatchMemo | None
) -> tuple[ScheduleKind, str, str, int | None, datetime | None]:
    """:func:`_trigger_fields`, from ``memo`` for a cron or interval seen before."""
    run_at = values.get("run_at")
    raw = (values.get("cron"), values.get("interval"), values.get("timezone"))
    # Keyed by type too: interval=True is refused although True == 1. A one-off's run_at
    # differs per item and is checked against ``now``: never memoized.
    if (
        memo is None
        or (run_at is not None and run_at != "")
        or not all(type(v) in (str, int, type(None)) for v in raw)
    ):
        return _trigger_fields(values)
    key = tuple((type(v), v) for v in raw)
    found = memo.triggers.get(key)
    if found is None:
        kind, cron, tz_name, seconds, _ = _trigger_fields(values)
        found = memo.triggers[key] = (kind, cron, tz_name, seconds, None)
    return found


def _trigger_fields(
    values: dict[str, Any],
) -> tuple[ScheduleKind, str, str, int | None, datetime | None]:
    cron, interval, run_at = values.get("cron"), values.get("interval"), values.get("run_at")
    # Given means not None and not "": interval=0 is a bad interval, not a missing trigger.
    given = [
        n
        for n, v in (("cron", cron), ("interval", interval), ("run_at", run_at))
        if v is not None and v != ""
    ]
    if len(given) != 1:
        raise errors.InvalidTiming(
            "give exactly one of cron, interval or run_at"
            + (f" (got {', '.join(given)})" if given else ""),
            field=given[1] if len(given) > 1 else "cron",
        )
    tz_raw = values.get("timezone") or "UTC"
    if isinstance(tz_raw, ZoneInfo):
        tz_raw = tz_raw.key  # a ZoneInfo instance stands for its IANA name
    if not isinstance(tz_raw, str):
        raise errors.UnknownTimeZone(f"timezone must be an IANA name, got {tz_raw!r}")
    timemath.parse_timezone(tz_raw)
    if given == ["cron"]:
        if not isinstance(cron, str):
            raise errors.InvalidCronExpression(f"cron must be a string, got {cron!r}")
        expression = " ".join(cron.split())
        # Raises precisely, including for an expression longer than the column.
        timemath.CronTrigger(expression=expression, timezone=tz_raw)
        return ScheduleKind.CRON, expression, tz_raw, None, None
    if given == ["interval"]:
        seconds = int(timemath.parse_interval(interval, "interval").total_seconds())
        return ScheduleKind.INTERVAL, "", tz_raw, seconds, None
    return ScheduleKind.ONE_OFF, "", tz_raw, None, aware_datetime(run_at, "run_at")


def _task_name(value: Any, *, check_registry: bool) -> str:
    name = checked_text(value, "task", required=True, max_length=200)
    if check_registry and not is_registered_task(name):
        # A miss may be a task module not imported yet (registered after our one import):
        # import the task modules once more before calling the name unknown.
        registered = registered_task_names(refresh=True)
        if name not in registered:
            close = difflib.get_close_matches(name, registered, n=3)
            hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise errors.UnknownTask(
                f"Task {name!r} is not registered in the Celery app.{hint}", field="task"
            )
    if check_registry:
        refuse_unsupported_options(name)
    return name


def refuse_unsupported_options(name: str) -> None:
    """Refuse a task whose own options a scheduled run cannot honour (the table in
    docs/howto/celery-tools.md); the others apply to scheduled runs."""
    task = get_current_app().tasks.get(name)
    expires = getattr(task, "expires", None) if task is not None else None
    if expires is not None:
        # Celery counts expires from the publish; the scheduler publishes at the scheduled
        # time but may re-publish a run (retry, redelivery) under the same id much later.
        raise errors.ValidationError(
            f"Task {name!r} sets expires={expires!r}, which scheduled runs do not apply: "
            "remove it from the task and give the schedule a deadline (deadline_seconds) "
            "to bound how late a run may start",
            field="task",
        )


INTERNAL_TASK_PREFIXES = ("celery.", "celery_scheduler.")

#: Celery apps whose task modules this process has imported. Celery's
#: ``import_default_modules()`` also runs Django's system checks (its Django fixup): half of a
#: create's time when it ran on every call, so it runs once per process and app, and again
#: only on a miss.
_imported_apps: weakref.WeakSet[Any] = weakref.WeakSet()


def _import_task_modules(*, refresh: bool = False) -> Any:
    app = get_current_app()  # (not the current_app proxy: called once per validated item)
    if refresh or app not in _imported_apps:
        app.loader.import_default_modules()
        _imported_apps.add(app)
    return app


def is_registered_task(name: str) -> bool:
    """Whether the current Celery app knows ``name`` (internal tasks excluded)."""
    app = _import_task_modules()
    return name in app.tasks and not name.startswith(INTERNAL_TASK_PREFIXES)


def registered_task_names(*, refresh: bool = False) -> list[str]:
    """Names of the tasks the current Celery app knows (after task autodiscovery).

    The task modules are imported once per process; ``refresh`` imports them again.
    """
    app = _import_task_modules(refresh=refresh)
    # Celery's own tasks and the scheduler's internals are not something to schedule.
    return sorted(n for n in app.tasks if not n.startswith(INTERNAL_TASK_PREFIXES))


def checked_text(value: Any, name: str, max_length: int = 200, *, required: bool = False) -> str:
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise errors.ValidationError(f"{name} must be a string, got {value!r}", field=name)
    check_storable(value, name, errors.ValidationError)
    value = value.strip()
    if required and not value:
        raise errors.ValidationError(f"{name} is required", field=name)
    if len(value) > max_length:
        raise errors.ValidationError(
            f"{name} is {len(value)} characters long; at most {max_length}", field=name
        )
    return value


def check_storable(
    value: str, name: str, error: type[errors.ValidationError], what: str | None = None
) -> None:
    """Reject text no database column can hold: NUL (PostgreSQL refuses it in text and JSON)
    and lone surrogates (not encodable as UTF-8). ``what`` words the message."""
    if "\x00" in value:
        raise error(
            f"{what or name} contains a NUL character (\\x00), which cannot be stored",
            field=name,
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise error(
            f"{what or name} contains a lone surrogate (not valid Unicode text), which cannot "
            "be stored",
            field=name,
        ) from None


def aware_datetime(value: Any, name: str) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise errors.InvalidTiming(
                f"{name} {value!r} is not an ISO 8601 date-time", field=name
            ) from None
    if not isinstance(value, datetime):
        raise errors.InvalidTiming(f"{name} must be a datetime, got {value!r}", field=name)
    if value.tzinfo is None:
        raise errors.InvalidTiming(
            f"{name} {value.isoformat()} has no time zone; pass an aware datetime", field=name
        )
    timemath.check_instant(value, name)  # far from year 1 and 9999, or InvalidTiming
    return value


#: The slot key of a schedule without a group (``worker.claim.concurrency_key``): a group
#: named so would share that schedule's slots.
_OWN_SLOT_PREFIX = "schedule:"


def _concurrency_group(value: Any) -> str:
    group = checked_text(value, "concurrency_group", 200)
    if group.startswith(_OWN_SLOT_PREFIX):
        raise errors.InvalidPolicy(
            f"concurrency_group {group!r}: names starting with {_OWN_SLOT_PREFIX!r} are the "
            "schedules' own slots; pick another name",
            field="concurrency_group",
        )
    return group


def bounded_int(value: Any, name: str, *, default: int, low: int, high: int | None) -> int:
    if value is None:
        return default
    shown = timemath.short_repr(value)  # an int past 4,300 digits cannot be printed whole
    if isinstance(value, bool) or not isinstance(value, int):
        raise errors.InvalidPolicy(f"{name} must be an integer, got {shown}", field=name)
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        raise errors.InvalidPolicy(f"{name} must be {bound}, got {shown}", field=name)
    return value


def optional_int(value: Any, name: str, low: int, high: int) -> int | None:
    return None if value is None else bounded_int(value, name, default=0, low=low, high=high)


def _seconds(value: Any, name: str, *, default: int, low: int, high: int | None) -> int:
    if isinstance(value, timedelta):
        total = value.total_seconds()
        if total != int(total):
            raise errors.InvalidPolicy(f"{name} must be whole seconds, got {value}", field=name)
        value = int(total)
    elif isinstance(value, float) and value.is_integer():
        value = int(value)
    return bounded_int(value, name, default=default, low=low, high=high)


def _optional_seconds(value: Any, name: str) -> int | None:
    if value is None:
        return None
    return _seconds(value, name, default=0, low=1, high=366 * 24 * 3600)


def enum_member(enum: Any, value: Any, name: str) -> Any:
    if value is None:
        return next(iter(enum))
    try:
        return enum(value.upper() if isinstance(value, str) else value)
    except ValueError:
        choices = ", ".join(m.value for m in enum)
        raise errors.InvalidPolicy(
            f"{name} {value!r} is not one of {choices}", field=name
        ) from None


def _check_json(value: Any, name: str, limit: int) -> int:
    """Walk ``value`` without recursion: depth, storable text and JSON types, then encode;
    the size of the compact encoding in bytes.

    ``json.dumps`` recurses: a deeply nested list raised RecursionError (and a cycle loops
    until it does), so depth is checked first, iteratively.
    """
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        # ``depth`` counts the containers around ``item``: a list or object here is level
        # depth + 1, and ``limit`` levels are allowed (100 nested lists pass, 101 do not).
        if depth >= limit and isinstance(item, dict | list | tuple):
            raise errors.InvalidArguments(
                f"{name} is nested more than {limit} levels deep", field=name
            )
        if isinstance(item, str):
            check_storable(item, name, errors.InvalidArguments, f"a string in {name}")
        elif isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    # JSON keys are text: 1 would come back as "1", beside a "1" of its own.
                    raise errors.InvalidArguments(
                        f"a key in {name} must be text, got {timemath.short_repr(key)} "
                        f"({type(key).__name__})",
                        field=name,
                    )
                check_storable(key, name, errors.InvalidArguments, f"a key in {name}")
                stack.append((child, depth + 1))
        elif isinstance(item, list | tuple):
            stack.extend((child, depth + 1) for child in item)
    try:
        # ASCII (ensure_ascii): its length is its size in bytes.
        return len(json.dumps(value, allow_nan=False, separators=(",", ":")))
    except (TypeError, ValueError) as exc:
        raise errors.InvalidArguments(
            f"{name} must be JSON-serialisable: {exc}", field=name
        ) from None


def _check_payload_size(args_size: int, kwargs_size: int, limit: int) -> None:
    """args and kwargs travel in every message of every fire: bound their encoded size."""
    total = args_size + kwargs_size
    if total > limit:
        field = "args" if args_size > limit else "kwargs"
        raise errors.InvalidArguments(
            f"args and kwargs are {total} bytes as JSON; at most {limit} bytes (the "
            "max_arguments_bytes setting). Pass a reference (an id, a key) instead of the data",
            field=field,
        )


def _args(value: Any, depth: int) -> tuple[list[Any], int]:
    if value is None:
        return [], 2
    if isinstance(value, str):
        raise errors.InvalidArguments(
            f"args must be a list, got the string {value[:40]!r} (decode JSON first)",
            field="args",
        )
    if not isinstance(value, list | tuple):
        raise errors.InvalidArguments(
            f"args must be a list, got {type(value).__name__}", field="args"
        )
    args = list(value)
    return args, _check_json(args, "args", depth)


def _kwargs(value: Any, depth: int) -> tuple[dict[str, Any], int]:
    if value is None:
        return {}, 2
    if not isinstance(value, dict):
        raise errors.InvalidArguments(
            f"kwargs must be an object, got {type(value).__name__}", field="kwargs"
        )
    bad = [k for k in value if not isinstance(k, str)]
    if bad:
        raise errors.InvalidArguments(
            f"kwargs keys must be strings, got {bad[:5]!r}", field="kwargs"
        )
    kwargs = dict(value)
    return kwargs, _check_json(kwargs, "kwargs", depth)


#: Schedule settings outside the versioned spec: changing them never re-plans fire times.
EXTRA_FIELDS = frozenset({"max_runs", "pause_after_failures", "tags"})
MAX_RUNS_LIMIT = 1_000_000_000
MAX_TAGS = 50


def validate_extras(values: dict[str, Any]) -> dict[str, Any]:
    """Validate the non-versioned settings present in ``values`` (only those given)."""
    out: dict[str, Any] = {}
    if "max_runs" in values:
        out["max_runs"] = optional_int(values["max_runs"], "max_runs", 1, MAX_RUNS_LIMIT)
    if "pause_after_failures" in values:
        out["pause_after_failures"] = optional_int(
            values["pause_after_failures"], "pause_after_failures", 1, 10_000
        )
    if "tags" in values:
        out["tags"] = validate_tags(values["tags"])
    return out


def validate_tags(value: Any) -> dict[str, str]:
    """Free-form tags: a mapping of up to 50 keys (1-100 chars) to values (0-200 chars)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise errors.ValidationError(
            f"tags must be a mapping of key to value, got {value!r}", field="tags"
        )
    if len(value) > MAX_TAGS:
        raise errors.ValidationError(
            f"tags has {len(value)} keys; at most {MAX_TAGS}", field="tags"
        )
    tags: dict[str, str] = {}
    for key, tag_value in value.items():
        if not isinstance(key, str) or not key.strip() or len(key.strip()) > 100 or "=" in key:
            raise errors.ValidationError(
                f"tag key {key!r} must be 1 to 100 characters without '='", field="tags"
            )
        if not isinstance(tag_value, str) or len(tag_value) > 200:
            raise errors.ValidationError(
                f"tag {key!r}: value must be a string of at most 200 characters, got {tag_value!r}",
                field="tags",
            )
        check_storable(key, "tags", errors.ValidationError, f"tag key {key!r}")
        check_storable(tag_value, "tags", errors.ValidationError, f"tag {key!r}")
        if key.strip() in tags:  # "a" and " a" are one key once stripped: which value?
            raise errors.ValidationError(
                f"tag key {key!r} is the key {key.strip()!r} given twice", field="tags"
            )
        tags[key.strip()] = tag_value
    return tags
