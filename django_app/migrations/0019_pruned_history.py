"""Retention never changes what runs (issue 25): two narrow tables it does not age out.

``PrunedHistory`` (per schedule, the span of scheduled_for that retention deleted rows from)
and ``ManualRunKey`` (per ``run_now(idempotency_key=K)``, the occurrence it created). The
data step writes a key row for every keyed run-now occurrence that exists: a keyed one is a
manual row whose id is not the unkeyed id ``occurrence_id(schedule, version, scheduled_for)``
(backfill rows, version 0, are not run-now). Keys whose occurrence was pruned before this
migration are gone and cannot be recovered; neither is the span pruned before it.
"""

from django.db import migrations, models
import django.db.models.deletion


def keyed_run_now_rows(apps, schema_editor):
    from celery_scheduler.core import ids

    Occurrence = apps.get_model("django_app", "Occurrence")
    ManualRunKey = apps.get_model("django_app", "ManualRunKey")
    manual = Occurrence.objects.filter(manual=True).exclude(schedule_version=0)
    batch = []
    for occ_id, schedule_id, tenant_id, version, at in manual.values_list(
        "id", "schedule_id", "tenant_id", "schedule_version", "scheduled_for"
    ).iterator(chunk_size=2000):
        if occ_id == ids.occurrence_id(schedule_id, version, at):
            continue  # an unkeyed run now
        batch.append(
            ManualRunKey(
                occurrence_id=occ_id, schedule_id=schedule_id, tenant_id=tenant_id,
                schedule_version=version, scheduled_for=at,
            )
        )
        if len(batch) >= 2000:
            ManualRunKey.objects.bulk_create(batch, ignore_conflicts=True)
            batch = []
    ManualRunKey.objects.bulk_create(batch, ignore_conflicts=True)


class Migration(migrations.Migration):

    dependencies = [
        ('django_app', '0018_dst_policy'),
    ]

    operations = [
        migrations.CreateModel(
            name='PrunedHistory',
            fields=[
                ('schedule', models.OneToOneField(db_constraint=False, on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name='+', serialize=False, to='django_app.schedule')),
                ('first', models.DateTimeField()),
                ('through', models.DateTimeField()),
            ],
        ),
        migrations.CreateModel(
            name='ManualRunKey',
            fields=[
                ('occurrence_id', models.UUIDField(primary_key=True, serialize=False)),
                ('schedule_version', models.PositiveIntegerField()),
                ('scheduled_for', models.DateTimeField()),
                ('state', models.CharField(blank=True, default='', max_length=16)),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('schedule', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='django_app.schedule')),
                ('tenant', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='django_app.tenant')),
            ],
        ),
        migrations.RunPython(keyed_run_now_rows, migrations.RunPython.noop),
    ]
