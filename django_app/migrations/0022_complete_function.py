"""``django_app_complete()``: the one-statement completion, with its plan kept per session.

The completion's statement (:mod:`django_app.worker.complete_pg`) was sent as text: the
server planned it on every call, and its four parts over the partitioned history tables
took longer to plan than to run. The same statement inside a PL/pgSQL function is planned
once per session (PL/pgSQL keeps its statements' plans, as the create and claim functions
do). Its body is the statement as it was, parameter for parameter; the function is called
in autocommit, so ``set_config('synchronous_commit', 'off', true)`` still applies to its own
transaction only.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

FUNCTION = """
CREATE OR REPLACE FUNCTION django_app_complete(
    p_id uuid, p_token bigint, p_now timestamptz, p_result jsonb, p_owner text,
    p_state text, p_running text, p_outcome text
) RETURNS TABLE (o_moved bigint, o_counts boolean, o_released json, o_sync text)
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    RETURN QUERY
    WITH counts AS (
        SELECT s.pause_after_failures IS NOT NULL AS counts
        FROM django_app_occurrence o JOIN django_app_schedule s ON s.id = o.schedule_id
        WHERE o.id = p_id
    ), occ AS (
        UPDATE django_app_occurrence SET state = p_state, finished_at = p_now,
            result = p_result, lease_owner = '', lease_expires_at = NULL, retry_at = NULL
        WHERE id = p_id AND state = p_running AND fencing_token = p_token
            AND NOT coalesce((SELECT c.counts FROM counts c), false)
        RETURNING id
    ), att AS (
        UPDATE django_app_attempt SET outcome = p_outcome, finished_at = p_now,
            result = p_result
        WHERE occurrence_id = p_id AND fencing_token = p_token
            AND EXISTS (SELECT 1 FROM occ)
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
            "DROP FUNCTION IF EXISTS django_app_complete(uuid, bigint, timestamptz, jsonb, "
            "text, text, text, text)"
        )


class Migration(migrations.Migration):
    dependencies = [
        ("django_app", "0021_claim_function"),
    ]

    operations = [migrations.RunPython(create, drop, elidable=False)]
