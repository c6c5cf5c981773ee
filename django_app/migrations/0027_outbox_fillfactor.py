"""PostgreSQL: the outbox leaves room on each page for the relay's claim (``fillfactor``).

The relay's claim updates two columns no index holds (``claimed_by``, ``claim_expires_at``),
so it can be a HOT update, which writes no index entry, but only where the row's new version
fits on its page. The plan packs outbox rows into full pages, so every claim moved its row to
another page and wrote an entry into each of the outbox's five indexes (the due ones too:
``sent_at`` is still NULL then). At ``django_app.db.partitions.OUTBOX_FILLFACTOR`` every
claim stays on its page (bench/README.md, "Write amplification").

PostgreSQL keeps storage parameters on partitions, not on a partitioned table: new slots are
created with the setting (``partitions.storage``), and this sets it on the outbox's existing
partitions, or on the plain table of an install not yet converted. It applies to rows
written from now on. ``ALTER TABLE ... SET (fillfactor)`` takes a SHARE UPDATE EXCLUSIVE
lock, which does not block reads or writes. SQLite and MariaDB: nothing to do.

Unapplying resets the setting to PostgreSQL's default (an operator's own fillfactor on the
outbox is not restored), and slots created after that by this code still get it. A slot a
beat of the previous version creates during a rolling deploy, after this ran, has full
pages: its claims are not HOT, nothing else changes.
"""
from __future__ import annotations

from django.db import migrations

FILLFACTOR = 40


def _alter_outbox(apps, schema_editor, statement):
    """Run ``statement(relation)`` on each partition of the outbox, or its plain table."""
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    from django_app.db import partitions

    table = apps.get_model("django_app", "OutboxEntry")._meta.db_table
    if partitions.is_partitioned(table):
        relations = [p.name for p in partitions.partitions(table)]
    else:
        relations = [table]
    with connection.cursor() as cur:
        for name in relations:
            cur.execute(statement(name))


def leave_room(apps, schema_editor):
    from django_app.db import queries as sql

    _alter_outbox(apps, schema_editor, lambda t: sql.set_storage(t, f"fillfactor={FILLFACTOR}"))


def fill_pages(apps, schema_editor):
    from django_app.db import queries as sql

    _alter_outbox(apps, schema_editor, lambda t: sql.reset_storage(t, ["fillfactor"]))


class Migration(migrations.Migration):
    dependencies = [
        ("django_app", "0026_state_indexes_without_succeeded"),
    ]

    operations = [migrations.RunPython(leave_room, fill_pages)]
