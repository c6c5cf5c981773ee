"""History tables partitioned by time on PostgreSQL (django_app.db.partitions).

- ``scheduled_for`` (the occurrence's) on Attempt and OutboxEntry: the partition key of all
  three tables, so one slot's rows go together. Nullable in the model (rows written before
  this migration, SQLite/MariaDB), NOT NULL in a partitioned PostgreSQL table. Filled here
  from the occurrence, except on a populated PostgreSQL install, where
  ``manage.py partitions convert`` fills it in batches (one UPDATE of a whole history table
  would hold its row locks for as long as it runs).
- The attempt's and outbox row's foreign keys to the occurrence stop being database
  constraints on every database: PostgreSQL allows a foreign key to a partitioned table only
  on its whole unique key, (id, scheduled_for). Deletes cascade in the ORM as before.
- PostgreSQL, fresh install (the three tables empty, as in a test database): the tables are
  turned into partitioned ones here, unless ``CELERY_SCHEDULER["partitioned_history"]`` is
  False. Populated: they are left plain and the scheduler runs
  on them as before; ``manage.py partitions convert`` converts them with a bounded lock
  (docs/howto/retention-and-scale.md). The migration names the command in its output.
"""

from datetime import UTC, datetime, timedelta

from django.db import migrations, models
import django.db.models.deletion


def _has_rows(connection, table):
    with connection.cursor() as cur:
        cur.execute(f"SELECT EXISTS (SELECT 1 FROM {connection.ops.quote_name(table)})")
        return bool(cur.fetchone()[0])


def forwards(apps, schema_editor):
    connection = schema_editor.connection
    occ = apps.get_model("django_app", "Occurrence")._meta.db_table
    populated = _has_rows(connection, occ)
    if connection.vendor != "postgresql" or not populated:
        if populated:  # SQLite / MariaDB: fill the key from the occurrence
            q = connection.ops.quote_name
            for name in ("Attempt", "OutboxEntry"):
                table = q(apps.get_model("django_app", name)._meta.db_table)
                # A data change, not DDL: through a cursor (MySQL refuses the schema
                # editor's execute inside the RunPython's transaction).
                with connection.cursor() as cur:
                    cur.execute(
                        f"UPDATE {table} SET scheduled_for = (SELECT o.scheduled_for FROM "
                        f"{q(occ)} o WHERE o.id = {table}.occurrence_id) "
                        f"WHERE scheduled_for IS NULL"
                    )
        from django_app import conf

        cfg = conf.get()
        if connection.vendor == "postgresql" and cfg.partitioned_history:
            from django_app.db import partitions

            partitions.partition_empty_tables(
                datetime.now(UTC),
                width=timedelta(hours=cfg.partition_width_hours),
                ahead=cfg.partitions_ahead,
            )
        return
    print(
        "\n  django_app: the occurrence tables have rows and stay plain tables; partition them "
        "with `manage.py partitions convert` (docs/howto/retention-and-scale.md)."
    )


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        from django_app.db import partitions

        partitions.unpartition_empty_tables()


class Migration(migrations.Migration):

    dependencies = [
        ('django_app', '0019_pruned_history'),
    ]

    operations = [
        migrations.AddField(
            model_name='attempt',
            name='scheduled_for',
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name='outboxentry',
            name='scheduled_for',
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AlterField(
            model_name='attempt',
            name='occurrence',
            field=models.ForeignKey(db_constraint=False, on_delete=django.db.models.deletion.CASCADE, related_name='attempts', to='django_app.occurrence'),
        ),
        migrations.AlterField(
            model_name='outboxentry',
            name='occurrence',
            field=models.OneToOneField(db_constraint=False, on_delete=django.db.models.deletion.CASCADE, related_name='outbox', to='django_app.occurrence'),
        ),
        migrations.RunPython(forwards, backwards),
    ]
