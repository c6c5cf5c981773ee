"""``django_app_claim()``: the worker's common claim in one call, on PostgreSQL.

The portable claim (:func:`django_app.worker.claim.claim`) is BEGIN, four statements
(schedule lock, occurrence lock, the RUNNING update, the attempt insert) and COMMIT: six
round trips per run. This function takes the same locks in the same order (the schedule
row through the occurrence, then the occurrence row) and makes the same writes, for the
common claim only: an unclaimed occurrence (SCHEDULED, ENQUEUED, RETRY_WAIT) of a schedule
that is not canceled and whose version it still carries (or a manual one), no run for
``max_runs`` to count, no overlap (the policy is ALLOW, or no other occurrence of the
schedule runs under a live lease), no tenant ``max_running`` and no ``concurrency_limit``.

Anything else (a duplicate delivery, a stale or canceled occurrence, an expired lease's
re-claim, an overlap, a quota, a slot, a run that ``max_runs`` counts, a missing row) makes
it return ``fallback`` having written nothing; the caller then runs the portable claim,
which re-reads everything under its own locks. The function's statements run under
READ COMMITTED with a snapshot each, taken after the locks before them were granted, as the
portable path's separate statements are.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

FUNCTION = """
CREATE OR REPLACE FUNCTION django_app_claim(
    p_id uuid, p_worker text, p_now timestamptz, p_lease interval,
    OUT o_outcome text, OUT o_token bigint, OUT o_number integer, OUT o_last_dead integer,
    OUT o_tenant_id bigint, OUT o_tenant text, OUT o_max_attempts integer,
    OUT o_deadline_seconds integer, OUT o_timezone text, OUT o_scheduled_for timestamptz,
    OUT o_state text, OUT o_enqueued_at timestamptz, OUT o_retry_at timestamptz
) LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    s record;
    o record;
BEGIN
    o_outcome := 'fallback';
    -- The claim's lock order: the schedule row first (found through the occurrence).
    SELECT sc.id, sc.state, sc.version, sc.overlap_policy, sc.max_runs,
           sc.concurrency_limit, sc.max_attempts, sc.deadline_seconds, sc.timezone,
           t.slug, t.max_running
      INTO s
      FROM django_app_schedule sc
      JOIN django_app_occurrence oc ON oc.schedule_id = sc.id
      JOIN django_app_tenant t ON t.id = oc.tenant_id
     WHERE oc.id = p_id
       FOR UPDATE OF sc;
    IF NOT FOUND OR coalesce(s.max_running, 0) <> 0 OR coalesce(s.concurrency_limit, 0) <> 0
       OR s.state = 'CANCELED' THEN
        RETURN;
    END IF;
    SELECT oc.state, oc.fencing_token, oc.attempt_count, oc.manual, oc.schedule_version,
           oc.overlap_policy, oc.scheduled_for, oc.tenant_id, oc.enqueued_at, oc.retry_at
      INTO o
      FROM django_app_occurrence oc WHERE oc.id = p_id FOR UPDATE;
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
     WHERE id = p_id AND scheduled_for = o.scheduled_for AND state = o.state
       AND fencing_token = o.fencing_token;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    INSERT INTO django_app_attempt (occurrence_id, scheduled_for, number, fencing_token,
           worker, started_at, heartbeat_at, finished_at, outcome, error, result)
    VALUES (p_id, o.scheduled_for, o_number, o_token, p_worker, p_now, NULL, NULL,
           'RUNNING', '', NULL);
    -- A first attempt has no earlier FAILED one to count from.
    IF o_number > 1 THEN
        SELECT max(a.number) INTO o_last_dead FROM django_app_attempt a
         WHERE a.occurrence_id = p_id AND a.outcome = 'FAILED';
    END IF;
    o_outcome := 'claimed';
    o_tenant_id := o.tenant_id;
    o_tenant := s.slug;
    o_max_attempts := s.max_attempts;
    o_deadline_seconds := s.deadline_seconds;
    o_timezone := s.timezone;
    o_scheduled_for := o.scheduled_for;
    o_state := o.state;
    o_enqueued_at := o.enqueued_at;
    o_retry_at := o.retry_at;
END
$fn$
"""


def create(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(FUNCTION)


def drop(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "DROP FUNCTION IF EXISTS django_app_claim(uuid, text, timestamptz, interval)"
        )


class Migration(migrations.Migration):
    dependencies = [
        ("django_app", "0020_partitioned_history"),
    ]

    operations = [migrations.RunPython(create, drop, elidable=False)]
