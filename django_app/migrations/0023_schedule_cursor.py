"""The schedule's cursor moves to a narrow row of its own (ScheduleCursor).

``Schedule.next_run_at`` moved on every plan. It was in two of the schedule's indexes, so
the move was never a HOT update: every plan wrote a new entry in each of the schedule's 14
indexes and a new copy of its wide row (bench/README.md, "Write amplification"). The
cursor row holds only what the materializer reads and moves: the cursor, and copies of
the shard, the version and whether the schedule is ACTIVE.

Its indexes, each paying for its writes:

- ``schedule_cursor_due`` (shard, next_run_at) WHERE active: the materializer's scan of
  due schedules, every pass of every beat; without it each pass reads every cursor.
  Partial: a paused or ended schedule is never due and costs no entry.
- ``schedule_cursor_next_run`` (next_run_at): ``list_schedules(next_run_before/after)``
  and the admin list's "Next run" order, ranges over cursors in any state (a paused
  schedule keeps its cursor). One entry per plan: the price of listing by the cursor
  without reading every schedule.
- the primary key (schedule_id): the cursor move and the join to the schedule.

The data moves with it (every schedule gets its row), and back on reverse. On PostgreSQL
the create function (0016) writes the cursor row too.
"""

from __future__ import annotations

import importlib
from typing import Any

import django.db.models.deletion
from django.db import migrations, models

COPY = """
INSERT INTO django_app_schedulecursor (schedule_id, shard, version, active, next_run_at)
SELECT id, shard, version, CASE WHEN state = 'ACTIVE' THEN 1 ELSE 0 END = 1, next_run_at
  FROM django_app_schedule
"""

COPY_BACK = """
UPDATE django_app_schedule SET next_run_at = (
    SELECT c.next_run_at FROM django_app_schedulecursor c
     WHERE c.schedule_id = django_app_schedule.id)
"""

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
        INSERT INTO django_app_schedulecursor
        SELECT * FROM jsonb_populate_record(NULL::django_app_schedulecursor,
            (p_rows -> 'cursor') || jsonb_build_object('schedule_id', o_schedule_id));
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


def _function(apps: Any, schema_editor: Any, text: str) -> None:
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_get_serial_sequence('django_app_scheduleversion', 'id'), "
            "pg_get_serial_sequence('django_app_auditentry', 'id')"
        )
        version_seq, audit_seq = cursor.fetchone()
        cursor.execute(text % {"version_seq": version_seq, "audit_seq": audit_seq})


def create_function(apps: Any, schema_editor: Any) -> None:
    _function(apps, schema_editor, FUNCTION)


def restore_function(apps: Any, schema_editor: Any) -> None:
    # 0016's function, which inserts no cursor row (the column is back on the schedule).
    importlib.import_module("django_app.migrations.0016_create_schedule_function").create(
        apps, schema_editor
    )


class Migration(migrations.Migration):
    dependencies = [
        ("django_app", "0022_complete_function"),
    ]

    operations = [
        migrations.CreateModel(
            name="ScheduleCursor",
            fields=[
                (
                    "schedule",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="cursor",
                        serialize=False,
                        to="django_app.schedule",
                    ),
                ),
                ("shard", models.PositiveIntegerField(default=0)),
                ("version", models.PositiveIntegerField(default=1)),
                ("active", models.BooleanField(default=True)),
                ("next_run_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "indexes": [
                    models.Index(
                        condition=models.Q(("active", True)),
                        fields=["shard", "next_run_at"],
                        name="schedule_cursor_due",
                    ),
                    models.Index(fields=["next_run_at"], name="schedule_cursor_next_run"),
                ],
            },
        ),
        migrations.RunSQL(COPY, COPY_BACK, elidable=False),
        migrations.RemoveIndex(model_name="schedule", name="schedule_due_by_shard"),
        migrations.RemoveIndex(model_name="schedule", name="schedule_next_run"),
        migrations.RemoveField(model_name="schedule", name="next_run_at"),
        migrations.RunPython(create_function, restore_function, elidable=False),
    ]
