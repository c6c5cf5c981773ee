"""PrunedHistory keeps the pruned times a version passed over without running them.

``passed_over`` (a compact set of instants, celery_scheduler.core.timeset): the
``scheduled_for`` of pruned MISSED, SKIPPED_OVERLAP and claimed-then-CANCELED rows of a
schedule version. A new version re-planning from an old unclaimed time reads it with
``ran`` and ``backfilled`` and never plans those times again (django_app.schedules.replan).
Retention fills it from now on; rows pruned before this migration left nothing of it, so a
re-plan over a span pruned before it treats those times as it did (docs/explanation/
retention.md). Self-contained: one column added to PrunedHistory.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_app', '0029_occurrence_retried'),
    ]

    operations = [
        migrations.AddField(
            model_name='prunedhistory',
            name='passed_over',
            field=models.TextField(blank=True, default=''),
        ),
    ]
