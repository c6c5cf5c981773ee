"""``django_app_create_schedule()``: a single create's writes in one call, on PostgreSQL.

``create_schedule`` on the ORM takes nine round trips (tenant lock, key lookup, savepoint,
insert, release, version, tags, audit, commit) and compiles each statement in Python. This
function does the same steps on the server, in the caller's transaction (or as its own
statement's): lock the tenant row, look the key up, count the quota, insert the schedule,
its first version, its tags and its audit entry. PL/pgSQL keeps each statement's plan for
the session, so nothing is re-planned per create (a prepared statement would do the same but
breaks under a transaction-mode pooler; Django leaves psycopg's prepare_threshold off).

Each statement is its own snapshot under READ COMMITTED, taken after the tenant lock was
granted: the key lookup and the quota count see every create committed before, as the ORM
path's separate queries do. The rows come as JSON in the columns' own names
(``jsonb_populate_record``), so a later column added to the model needs no change here.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

FUNCTION = """
CREATE OR REPLACE FUNCTION django_app_create_schedule(
    p_tenant text, p_key text, p_digest text, p_rows jsonb, p_tag_keys text[],
    p_tag_values text[],
    OUT o_outcome text, OUT o_schedule_id uuid, OUT o_tenant_id bigint, OUT o_live bigint,
    OUT o_max_schedules bigint
) LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    found_hash text;
BEGIN
    SELECT t.id, t.max_schedules INTO o_tenant_id, o_max_schedules
      FROM django_app_tenant t WHERE t.slug = p_tenant FOR UPDATE;
    IF NOT FOUND THEN
        o_outcome := 'no_tenant';
        RETURN;
    END IF;
    IF p_key IS NOT NULL THEN
        SELECT s.id, s.content_hash INTO o_schedule_id, found_hash
          FROM django_app_schedule s
         WHERE s.tenant_id = o_tenant_id AND s.idempotency_key = p_key;
        IF FOUND THEN
            IF found_hash IS DISTINCT FROM p_digest THEN
                o_outcome := 'conflict';
                RETURN;
            END IF;
            o_outcome := 'replayed';
        END IF;
    END IF;
    IF o_outcome IS NULL THEN
        IF o_max_schedules IS NOT NULL THEN
            SELECT count(*) INTO o_live FROM django_app_schedule s
             WHERE s.tenant_id = o_tenant_id AND s.state IN ('ACTIVE', 'PAUSED', 'PARKED');
            IF o_live >= o_max_schedules THEN
                o_outcome := 'quota';
                RETURN;
            END IF;
        END IF;
        INSERT INTO django_app_schedule
        SELECT * FROM jsonb_populate_record(NULL::django_app_schedule,
            (p_rows -> 'schedule') || jsonb_build_object('tenant_id', o_tenant_id))
        RETURNING id INTO o_schedule_id;
        INSERT INTO django_app_scheduleversion
        SELECT * FROM jsonb_populate_record(NULL::django_app_scheduleversion,
            (p_rows -> 'version') || jsonb_build_object(
                'id', nextval('%(version_seq)s'), 'schedule_id', o_schedule_id));
        INSERT INTO django_app_scheduletag (schedule_id, tenant_id, key, value)
        SELECT o_schedule_id, o_tenant_id, t.key, t.value
          FROM unnest(p_tag_keys, p_tag_values) AS t(key, value);
        o_outcome := 'created';
    END IF;
    IF p_rows ? 'audit' THEN
        -- A replay writes its entry too (naming the schedule the key replays).
        INSERT INTO django_app_auditentry
        SELECT * FROM jsonb_populate_record(NULL::django_app_auditentry,
            (p_rows -> 'audit') || jsonb_build_object('id', nextval('%(audit_seq)s'),
                'tenant_id', o_tenant_id, 'schedule_id', o_schedule_id));
    END IF;
END
$fn$
"""


def create(apps: Any, schema_editor: Any) -> None:
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_get_serial_sequence('django_app_scheduleversion', 'id'), "
            "pg_get_serial_sequence('django_app_auditentry', 'id')"
        )
        version_seq, audit_seq = cursor.fetchone()
        cursor.execute(FUNCTION % {"version_seq": version_seq, "audit_seq": audit_seq})


def drop(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "DROP FUNCTION IF EXISTS django_app_create_schedule(text, text, text, jsonb, "
            "text[], text[])"
        )


class Migration(migrations.Migration):
    dependencies = [
        ("django_app", "0015_schedule_search_trigram"),
    ]

    operations = [migrations.RunPython(create, drop, elidable=False)]
