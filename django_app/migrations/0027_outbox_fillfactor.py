"""PostgreSQL: the outbox leaves room on each page for the relay's claim (``fillfactor``).

The relay's claim updates two columns no index holds (``claimed_by``, ``claim_expires_at``),
so it can be a HOT update, which writes no index entry, but only where the row's new version
fits on its page. The plan packs outbox rows into full pages, so every claim moved its row to
another page and wrote an entry into each of the outbox's three unconditional indexes (the
primary key, the one-row-per-occurrence key, the tenant). At
``django_app.db.partitions.OUTBOX_FILLFACTOR`` every claim stays on its page
(bench/README.md, "Write amplification").

PostgreSQL keeps storage parameters on partitions, not on a partitioned table: new slots are
created with the setting (``partitions.storage``), and this sets it on the outbox's existing
partitions, or on the plain table of an install not yet converted. It applies to rows
written from now on. ``ALTER TABLE ... SET (fillfactor)`` takes a SHARE UPDATE EXCLUSIVE
lock, which does not block reads or writes. SQLite and MariaDB: nothing to do.
"""

from django.db import migrations

FILLFACTOR = 40


def _outbox_relations(apps):
    from django_app.db import partitions

    table = apps.get_model("django_app", "OutboxEntry")._meta.db_table
    if partitions.is_partitioned(table):
        return [p.name for p in partitions.partitions(table)]
    return [table]


def leave_room(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    from django_app.db import queries as sql

    with connection.cursor() as cur:
        for name in _outbox_relations(apps):
            cur.execute(sql.set_storage(name, f"fillfactor={FILLFACTOR}"))


def fill_pages(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    from django_app.db import queries as sql

    with connection.cursor() as cur:
        for name in _outbox_relations(apps):
            cur.execute(sql.reset_storage(name, ["fillfactor"]))


class Migration(migrations.Migration):
    dependencies = [
        ("django_app", "0026_state_indexes_without_succeeded"),
    ]

    operations = [migrations.RunPython(leave_room, fill_pages)]
