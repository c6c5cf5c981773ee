"""What the OpenAPI document says about each operation: a summary and a description for users.

One table, so the summaries read alike (a short imperative phrase, no trailing period) and
no operation falls back to a view class's docstring, which is written for this package's
maintainers ("Everything explicit, so the project's REST_FRAMEWORK settings do not change
the API."). Views take their entry with ``**operations.doc("name")``; the schema test checks
that every operation has one.
"""

from __future__ import annotations

from typing import Final

#: name -> (summary, description). Descriptions are Markdown (the schema's CommonMark).
OPERATIONS: Final[dict[str, tuple[str, str]]] = {
    "schedules_list": (
        "List schedules",
        "The caller's schedules, optionally filtered by state, task, tags, a name fragment "
        "or a next-run window. Pages are keyset-paginated: pass a page's `next_cursor` as "
        "`cursor` to read the next one; `next_cursor` is null on the last page.",
    ),
    "schedules_create": (
        "Create a schedule",
        "Creates a cron, interval or one-off schedule in the caller's tenant and returns it "
        "with its next fire times. Give exactly one of `cron` (with `timezone`), `interval` "
        "(seconds) or `run_at`. With an `idempotency_key`, sending the same request again "
        "returns the schedule the first one created; the same key with other fields is a "
        "409. A 400 names the bad field in `field`.",
    ),
    "schedules_bulk_create": (
        "Create many schedules",
        "Creates every item in one transaction: if one item is refused, nothing is written "
        "and the 400's `field` names it (`items[3].cron`). Each item takes the fields of a "
        "single create.",
    ),
    "schedules_sync": (
        "Sync schedules by idempotency key",
        "Makes the tenant's schedules match the items, keyed by `idempotency_key`: a new key "
        "is created, a changed item updates its schedule (a new version when the timing "
        "changed), an equal one is left alone. With `prune`, live schedules that an earlier "
        "sync created and whose key is no longer listed are canceled; schedules made any "
        "other way are never pruned.",
    ),
    "schedules_describe": (
        "Describe a schedule",
        "The schedule, its next fire times (in UTC and in its time zone) and its latest "
        "occurrences; `next_count` and `last_count` choose how many of each.",
    ),
    "schedules_update": (
        "Update a schedule",
        "Changes the fields given, as a new version: runs planned under older versions and "
        "not yet claimed are canceled and their times planned again (a time an older "
        "version already ran never runs twice). A field sent as null goes back to its "
        "default. `max_runs`, `pause_after_failures` and `tags` alone change in place. "
        "Send `expected_version` to make the change conditional: if the schedule moved on "
        "since you read it, the answer is 409 and nothing is written.",
    ),
    "schedules_pause": (
        "Pause a schedule",
        "Stops planning new runs; runs already in progress finish. `note` is kept as the "
        "pause reason until resume. When resumed, the misfire policy decides what happens "
        "to the fire times that passed meanwhile.",
    ),
    "schedules_resume": (
        "Resume a schedule",
        "Plans runs again from now. Fire times that passed while paused follow the misfire "
        "policy: `SKIP` drops them, `FIRE_ONCE` runs the latest, `CATCH_UP` runs up to "
        "`catchup_cap` of them. A parked schedule resumes once its timing can be planned.",
    ),
    "schedules_cancel": (
        "Cancel a schedule",
        "Stops the schedule for good: runs planned and not started are canceled, running "
        "ones are reported, not interrupted. Its history stays.",
    ),
    "schedules_run_now": (
        "Run a schedule now",
        "Queues one extra run now, outside the schedule's timing (also while paused). With "
        "an `idempotency_key`, asking again returns the run the first request created.",
    ),
    "schedules_skip": (
        "Skip one fire time",
        "Skips one fire time without pausing the schedule: by default the next one not yet "
        "claimed, or the `scheduled_for` given. The skipped time shows as a CANCELED "
        "occurrence; skipping it twice is harmless.",
    ),
    "schedules_backfill": (
        "Backfill a past range",
        "Runs the schedule's fire times in `[start, end)` (in the past) that have not run. "
        "Each time gets a deterministic occurrence id, so backfilling an overlapping range "
        "again never runs a time twice. Runs are released at the tenant's `catchup_rate`.",
    ),
    "occurrences_list": (
        "List a schedule's occurrences",
        "Its occurrences (runs), newest first, with state, attempts and lag. Pages are "
        "keyset-paginated: pass `next_cursor` as `cursor` for the next page.",
    ),
    "occurrences_replay": (
        "Replay a dead occurrence",
        "Runs a DEAD occurrence again under its own id. Tasks decorated with "
        "`@idempotent_task` return their stored result if the effect had already happened.",
    ),
    "schedules_bulk_action": (
        "Pause, resume or cancel matching schedules",
        "Applies the action to every schedule of the caller's tenant that matches the "
        "filter. At least one filter is required: a bulk change of every schedule is "
        "refused. `note` is for a bulk pause only.",
    ),
    "tenants_list": (
        "List tenants",
        "Tenants with their quotas and current usage, for staff sessions (API tokens are "
        "refused): a superuser sees every tenant, a member its own.",
    ),
    "tenants_create": (
        "Create a tenant",
        "Creates a tenant with optional quotas (`max_schedules`, `max_trigger_rate`, "
        "`max_running`, `catchup_rate`) and relay weight. Superuser sessions only.",
    ),
    "tenants_describe": (
        "Describe a tenant",
        "A tenant's quotas and current usage, for staff sessions (API tokens are refused): "
        "a superuser reads any tenant, a member its own.",
    ),
    "tenants_update": (
        "Update a tenant",
        "Changes a tenant's quotas or relay weight; a quota set to null is unlimited. "
        "Superuser sessions only.",
    ),
}


def doc(name: str) -> dict[str, str]:
    """``summary`` and ``description`` keyword arguments for ``extend_schema``."""
    summary, description = OPERATIONS[name]
    return {"summary": summary, "description": description}
