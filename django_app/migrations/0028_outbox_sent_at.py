"""The outbox's ``sent_at``, indexed for the tenants list's "published in the last minute".

That count (``django_app.tenants.list_tenants``: the HTTP API, the CLI and the admin) asks
for the outbox rows sent in the last 60 seconds. No index held sent rows by ``sent_at``, so
every call read every outbox row kept, the whole retention window.

What the index pays with: on PostgreSQL it is a BRIN index, one summary (least and greatest
``sent_at``) per 128 pages. A publish already rewrites its outbox row outside HOT (the due
indexes' condition names ``sent_at``), and it writes the BRIN summary only when it widens
its range's; rows are planned into pages in time order and sent in about the same order,
so a minute's publishes touch a few ranges. SQLite and MariaDB have no BRIN: they get a
B-tree (one entry per publish) at the scale they are used at.

Built without blocking writes (``django_app.db.index_swap``): concurrently, partition by
partition. Hence ``atomic = False``.
"""

from django.db import migrations

from django_app.compat import PostgresBrinIndex
from django_app.db.index_swap import AddIndexConcurrently


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_app", "0027_outbox_fillfactor"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="outboxentry",
            index=PostgresBrinIndex(fields=["sent_at"], name="outbox_sent_at"),
        ),
    ]
