"""The occurrences tried more than once, by schedule and time: the admin list's last failure.

The schedule list shows when each schedule on the page last failed: the latest attempt that
FAILED or was retried (RETRY). Its query joined every attempt of every occurrence of the
page's schedules, the whole retention window (about 0.4 s for 50 per-minute schedules and
five days kept, growing with each day). A failed attempt can only belong to a row that is not
SUCCEEDED (the state indexes hold those) or to one tried more than once (a retry that then
succeeded), which this index holds.

What the index pays with: an entry only for a row whose ``attempt_count`` is above 1 when
it is written, that is the second and later claims of a retried or re-queued run and what
follows them. A first claim and its completion write nothing here (both already change the
indexed ``state``, so neither was HOT before). SQLite keeps it partial too; MariaDB has no
partial indexes, and Django leaves a conditional one out there: its list reads the
occurrences by schedule, at the scale it is used at.

Built without blocking writes (``django_app.db.index_swap``): concurrently, partition by
partition. Hence ``atomic = False``.
"""

from django.db import migrations, models

from django_app.db.index_swap import AddIndexConcurrently


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_app", "0028_outbox_sent_at"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="occurrence",
            index=models.Index(
                fields=["schedule", "scheduled_for"],
                condition=models.Q(attempt_count__gt=1),
                name="occurrence_retried",
            ),
        ),
    ]
