"""PostgreSQL: the occurrence's three indexes by state leave SUCCEEDED rows out.

Every update of an occurrence that changes its state writes a new entry into every index of
the row (the state is indexed, so the update is never HOT). The completion, the most common
last write of a row, wrote these three indexes for rows no run-path query asks for by state:
overlap checks, running counts, waiting lines, the reaper, supersede and DEAD counts name
the states they want, and none of them wants SUCCEEDED. Now that write takes 3 index entries
fewer, and the indexes hold the unfinished and unusual rows rather than the whole history.
Reads of SUCCEEDED rows (a schedule's summary, the overview's day count, retention's batched
delete) go by time or by schedule, through ``occurrence_admin_time``, ``occurrence_schedule_time``
and the unique key. What each index still pays for:

- ``occurrence_schedule_state``: overlap (a RUNNING row of the schedule, in the claim) and
  supersede (the unsent rows of an updated schedule).
- ``occurrence_state_time``: the reaper (RUNNING rows past their lease), retries due, DEAD counts.
- ``occurrence_tenant_state_time``: a tenant's running count and its waiting line.

SQLite and MariaDB keep the whole indexes (``PostgresPartialIndex``): SQLite would use a
partial index only for a query that repeats its condition, MariaDB has none.

Built without blocking writes (``django_app.db.index_swap``): concurrently, partition by
partition, then swapped in one short transaction. Hence ``atomic = False``.
"""

from django.db import migrations, models

from django_app.compat import PostgresPartialIndex
from django_app.db.index_swap import ReplaceIndex

NOT_SUCCEEDED = ~models.Q(state="SUCCEEDED")

STATE_INDEXES = [
    ("occurrence_schedule_state", ["schedule", "state"]),
    ("occurrence_state_time", ["state", "scheduled_for"]),
    ("occurrence_tenant_state_time", ["tenant", "state", "scheduled_for"]),
]


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_app", "0025_claim_complete_by_key"),
    ]

    operations = [
        ReplaceIndex(
            model_name="occurrence",
            old=models.Index(fields=fields, name=name),
            new=PostgresPartialIndex(fields=fields, condition=NOT_SUCCEEDED, name=name),
        )
        for name, fields in STATE_INDEXES
    ]
