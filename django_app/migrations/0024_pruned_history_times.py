"""Backfill over pruned history is exact (issue 25): PrunedHistory keeps the pruned times
backfill leaves out.

``ran`` and ``backfilled`` (compact sets of instants, celery_scheduler.core.timeset) are
filled by retention from now on. What was pruned before this migration is not known: the
data step copies each existing span ``[first, through]`` into ``[unknown_from,
unknown_through]``, where backfill keeps refusing (``HistoryPruned``). Self-contained: it
only adds columns to PrunedHistory and touches only its rows.
"""

from django.db import migrations, models
from django.db.models import F


def unknown_spans(apps, schema_editor):
    PrunedHistory = apps.get_model("django_app", "PrunedHistory")
    PrunedHistory.objects.update(unknown_from=F("first"), unknown_through=F("through"))


class Migration(migrations.Migration):

    dependencies = [
        ('django_app', '0023_schedule_cursor'),
    ]

    operations = [
        migrations.AddField(
            model_name='prunedhistory',
            name='ran',
            field=models.TextField(blank=True, default=''),
        ),
        migrations.AddField(
            model_name='prunedhistory',
            name='backfilled',
            field=models.TextField(blank=True, default=''),
        ),
        migrations.AddField(
            model_name='prunedhistory',
            name='unknown_from',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='prunedhistory',
            name='unknown_through',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunPython(unknown_spans, migrations.RunPython.noop),
    ]
