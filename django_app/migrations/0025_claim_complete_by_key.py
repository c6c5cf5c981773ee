"""The claim and the completion find their rows by the partition key too.

``django_app_claim()`` and ``django_app_complete()`` (migrations 0021, 0022) looked the
occurrence and its attempt up by id alone. On the partitioned history tables an id is
unique only with ``scheduled_for``, so each of those lookups probed every partition of the
retention window (bench/README.md, "The claim and completion by partition key", has what it
cost). The worker knows the time: the
relay's message carries it to the claim, and the claim returns it to the completion. Both
functions now take it as their second argument and prune to its one partition. A call
without it (NULL: a message from before this change, or a caller that has only the id)
first reads the occurrence's time by id, as the functions did before, then goes on the
same way.

Which plans they run on is the caller's choice (``p_generic``). PL/pgSQL keeps a plan per
statement for the session, but with the key a parameter, PostgreSQL's plan cache rates the
generic plan (every partition, pruned when it runs) costlier than a plan for the given
value (one partition), so left to itself it plans every statement again on every call.
On a session that runs many claims (a worker that keeps its connection) the caller asks
for generic plans: built once, dearer than one custom plan with many partitions, then
reused. On a session's first call (a worker that closes its connection after each task,
Celery's default) it does not, and each statement is planned for its one partition. The
setting is the function's own (its ``SET`` clause restores it on exit).

Same locks in the same order, same writes, same results as the functions they replace.
Those stay (other signatures, so both exist): workers of the previous version, still
running between this migration and their restart, keep claiming and completing through
them. A later migration drops them.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

CLAIM = """
CREATE OR REPLACE FUNCTION django_app_claim(
    p_id uuid, p_scheduled_for timestamptz, p_worker text, p_now timestamptz, p_lease interval,
    p_generic boolean,
    OUT o_outcome text, OUT o_token bigint, OUT o_number integer, OUT o_last_dead integer,
    OUT o_tenant_id bigint, OUT o_tenant text, OUT o_max_attempts integer,
    OUT o_deadline_seconds integer, OUT o_timezone text, OUT o_scheduled_for timestamptz,
    OUT o_state text, OUT o_enqueued_at timestamptz, OUT o_retry_at timestamptz
) LANGUAGE plpgsql VOLATILE SET plan_cache_mode = auto AS $fn$
DECLARE
    s record;
    o record;
BEGIN
    o_outcome := 'fallback';
    IF p_generic THEN
        PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
    END IF;
    IF p_scheduled_for IS NULL THEN
        SELECT oc.scheduled_for INTO p_scheduled_for
          FROM django_app_occurrence oc WHERE oc.id = p_id;
        IF NOT FOUND THEN
            RETURN;
        END IF;
    END IF;
    -- The claim's lock order: the schedule row first (found through the occurrence).
    SELECT sc.id, sc.state, sc.version, sc.overlap_policy, sc.max_runs,
           sc.concurrency_limit, sc.max_attempts, sc.deadline_seconds, sc.timezone,
           t.slug, t.max_running
      INTO s
      FROM django_app_schedule sc
      JOIN django_app_occurrence oc ON oc.schedule_id = sc.id
      JOIN django_app_tenant t ON t.id = oc.tenant_id
     WHERE oc.id = p_id AND oc.scheduled_for = p_scheduled_for
       FOR UPDATE OF sc;
    IF NOT FOUND OR coalesce(s.max_running, 0) <> 0 OR coalesce(s.concurrency_limit, 0) <> 0
       OR s.state = 'CANCELED' THEN
        RETURN;
    END IF;
    SELECT oc.state, oc.fencing_token, oc.attempt_count, oc.manual, oc.schedule_version,
           oc.overlap_policy, oc.scheduled_for, oc.tenant_id, oc.enqueued_at, oc.retry_at
      INTO o
      FROM django_app_occurrence oc
     WHERE oc.id = p_id AND oc.scheduled_for = p_scheduled_for FOR UPDATE;
    IF NOT FOUND OR o.state NOT IN ('SCHEDULED', 'ENQUEUED', 'RETRY_WAIT')
       OR (NOT o.manual AND o.schedule_version <> s.version)
       OR (s.max_runs IS NOT NULL AND NOT o.manual AND o.attempt_count = 0) THEN
        RETURN;
    END IF;
    IF coalesce(nullif(o.overlap_policy, ''), s.overlap_policy) <> 'ALLOW' AND EXISTS (
        SELECT 1 FROM django_app_occurrence oc
         WHERE oc.schedule_id = s.id AND oc.id <> p_id AND oc.state = 'RUNNING'
           AND oc.lease_expires_at > p_now
    ) THEN
        RETURN;
    END IF;
    o_token := o.fencing_token + 1;
    o_number := o.attempt_count + 1;
    UPDATE django_app_occurrence SET state = 'RUNNING', fencing_token = o_token,
           attempt_count = o_number, lease_owner = p_worker,
           lease_expires_at = p_now + p_lease, started_at = p_now, finished_at = NULL,
           retry_at = NULL, reason = ''
     WHERE id = p_id AND scheduled_for = p_scheduled_for AND state = o.state
       AND fencing_token = o.fencing_token;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    INSERT INTO django_app_attempt (occurrence_id, scheduled_for, number, fencing_token,
           worker, started_at, heartbeat_at, finished_at, outcome, error, result)
    VALUES (p_id, p_scheduled_for, o_number, o_token, p_worker, p_now, NULL, NULL,
           'RUNNING', '', NULL);
    -- A first attempt has no earlier FAILED one to count from.
    IF o_number > 1 THEN
        SELECT max(a.number) INTO o_last_dead FROM django_app_attempt a
         WHERE a.occurrence_id = p_id AND a.scheduled_for = p_scheduled_for
           AND a.outcome = 'FAILED';
    END IF;
    o_outcome := 'claimed';
    o_tenant_id := o.tenant_id;
    o_tenant := s.slug;
    o_max_attempts := s.max_attempts;
    o_deadline_seconds := s.deadline_seconds;
    o_timezone := s.timezone;
    o_scheduled_for := p_scheduled_for;
    o_state := o.state;
    o_enqueued_at := o.enqueued_at;
    o_retry_at := o.retry_at;
END
$fn$
"""

COMPLETE = """
CREATE OR REPLACE FUNCTION django_app_complete(
    p_id uuid, p_scheduled_for timestamptz, p_token bigint, p_now timestamptz,
    p_result jsonb, p_owner text, p_state text, p_running text, p_outcome text,
    p_generic boolean
) RETURNS TABLE (o_moved bigint, o_counts boolean, o_released json, o_sync text)
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = auto AS $fn$
BEGIN
    IF p_generic THEN
        PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
    END IF;
    IF p_scheduled_for IS NULL THEN
        SELECT oc.scheduled_for INTO p_scheduled_for
          FROM django_app_occurrence oc WHERE oc.id = p_id;
    END IF;
    RETURN QUERY
    WITH counts AS (
        SELECT s.pause_after_failures IS NOT NULL AS counts
        FROM django_app_occurrence o JOIN django_app_schedule s ON s.id = o.schedule_id
        WHERE o.id = p_id AND o.scheduled_for = p_scheduled_for
    ), occ AS (
        UPDATE django_app_occurrence SET state = p_state, finished_at = p_now,
            result = p_result, lease_owner = '', lease_expires_at = NULL, retry_at = NULL
        WHERE id = p_id AND scheduled_for = p_scheduled_for AND state = p_running
            AND fencing_token = p_token
            AND NOT coalesce((SELECT c.counts FROM counts c), false)
        RETURNING id
    ), att AS (
        UPDATE django_app_attempt SET outcome = p_outcome, finished_at = p_now,
            result = p_result
        WHERE occurrence_id = p_id AND scheduled_for = p_scheduled_for
            AND fencing_token = p_token AND EXISTS (SELECT 1 FROM occ)
    ), slot AS (
        UPDATE django_app_concurrencyslot SET owner = '', occurrence_id = NULL,
            expires_at = NULL
        WHERE owner = p_owner AND EXISTS (SELECT 1 FROM occ)
        RETURNING tenant_id, key
    )
    SELECT (SELECT count(*) FROM occ), coalesce((SELECT c.counts FROM counts c), false),
        (SELECT coalesce(json_agg(json_build_array(sl.tenant_id, sl.key)), '[]')
           FROM slot sl),
        set_config('synchronous_commit', 'off', true);
END
$fn$
"""

NEW_CLAIM = "django_app_claim(uuid, timestamptz, text, timestamptz, interval, boolean)"
NEW_COMPLETE = (
    "django_app_complete(uuid, timestamptz, bigint, timestamptz, jsonb, text, text, text, text, "
    "boolean)"
)


def forward(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(CLAIM)
        cursor.execute(COMPLETE)


def backward(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"DROP FUNCTION IF EXISTS {NEW_CLAIM}")
        cursor.execute(f"DROP FUNCTION IF EXISTS {NEW_COMPLETE}")


class Migration(migrations.Migration):
    dependencies = [
        ("django_app", "0024_pruned_history_times"),
    ]

    operations = [migrations.RunPython(forward, backward, elidable=False)]
