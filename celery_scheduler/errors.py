"""Every error this package raises derives from :class:`SchedulerError`.

Messages name the bad value and how to fix it; database and broker errors are
translated into these at the adapter edge so callers catch one hierarchy.
"""

from __future__ import annotations


class SchedulerError(Exception):
    """Root of every error raised by celery_scheduler and django_app."""


class ValidationError(SchedulerError, ValueError):
    """Input rejected before anything was written.

    ``field`` names the offending argument so the admin form and the CLI can put
    the message next to it.
    """

    field: str | None = None

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        if field is not None:
            self.field = field


class HistoryPruned(ValidationError):
    """A backfill would have to run a fire time whose history retention deleted: that time
    may have run under a row that is gone, so nothing was backfilled."""

    field = "start"


class InvalidCronExpression(ValidationError):
    field = "cron"


class CronNeverFires(InvalidCronExpression):
    """A syntactically valid expression with no fire time (e.g. ``0 0 30 2 *``)."""


class UnknownTimeZone(ValidationError):
    field = "timezone"


class UnknownTask(ValidationError):
    field = "task"


class InvalidArguments(ValidationError):
    """args/kwargs that are not a JSON list/object of JSON-serialisable values."""

    field = "args"


class InvalidPolicy(ValidationError):
    """An out-of-range or unknown policy value (misfire, overlap, windows, caps)."""


class InvalidTiming(ValidationError):
    """Inconsistent timing: no trigger or more than one, run_at too far in the past, end < start."""


class IdempotencyConflict(SchedulerError):
    """The same idempotency key was used before with different content."""


class ScheduleNotFound(SchedulerError, LookupError):
    pass


class OccurrenceNotFound(SchedulerError, LookupError):
    pass


class InvalidStateTransition(SchedulerError):
    """A lifecycle call that the current state does not allow (e.g. resume a canceled schedule)."""


class VersionConflict(SchedulerError):
    """An update said which version it was made against, and the schedule has moved on.

    Two admins editing the same schedule: the second save would silently overwrite the
    first. ``expected`` is the version the caller loaded, ``actual`` the current one;
    nothing was written. Reload, re-apply the change, and pass the new version.
    """

    def __init__(self, message: str, *, expected: int, actual: int) -> None:
        super().__init__(message)
        self.expected = expected
        self.actual = actual


class QuotaExceeded(SchedulerError):
    """A tenant quota (schedule count, rate, concurrency) would be exceeded."""


class StaleWrite(SchedulerError):
    """A conditional write matched no row: another node or attempt owns the state now.

    Raised when a fencing token, lease owner or version no longer matches.
    """


class LeaseLost(StaleWrite):
    """The caller's lease (shard, occurrence or concurrency slot) expired or was taken over."""


class ConfigurationError(SchedulerError):
    """The deployment cannot run correctly as configured: beat and workers refuse to start."""


class UnsafeDatabase(ConfigurationError):
    """The database is configured in a way that breaks the scheduler's guarantees
    (for example SQLite without ``transaction_mode = "IMMEDIATE"``)."""


class ShardCountMismatch(ConfigurationError):
    """Rows are stored in shards at or above ``shard_count``: no beat would ever lease them.

    Raised when beat starts (it refuses to run); ``manage.py reshard`` moves them into range.
    """


class CoordinationUnavailable(SchedulerError):
    """The database or broker needed for coordination cannot be reached; wait, do not run."""


class DatabaseUnavailable(CoordinationUnavailable):
    """The database (not the broker) cannot be reached, e.g. by the shard leaser."""


class NotJSONSerializable(SchedulerError, TypeError):
    """An idempotent task result (or args) could not be stored as JSON."""


class TransientError(SchedulerError):
    """Raise from a task body to ask for a retry with backoff (the failure should pass)."""


class Throttled(TransientError):
    """The downstream service asked us to slow down (HTTP 429 or equivalent)."""


class MissingIdempotencyKey(SchedulerError):
    """An ``@idempotent_task`` ran with no ``key=`` and no occurrence or Celery task id."""


class UnsupportedSchedule(ValidationError):
    """A Celery schedule kind we cannot represent (e.g. ``solar``)."""
