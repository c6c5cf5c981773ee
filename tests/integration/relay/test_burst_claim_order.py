"""The burst relay's claim returns its rows in the order it chose them (PostgreSQL).

The relay keeps the claim's order among the rows of one instant (SPEC, "The single-node
dispatcher": ``(available_at, -priority, sequence)``). ``UPDATE ... RETURNING`` alone has no
order: it gave the plan's, and with statistics PostgreSQL joins the chosen rows to a scan
of the slot, which returns them in the table's physical order.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection

from django_app.models import Tenant
from django_app.relay import queries
from tests.integration.tenancy.test_tenant_fairness import NOW, seed

pytestmark = [pytest.mark.django_db, pytest.mark.postgres]


def test_the_claim_returns_rows_by_time_then_priority_then_id_whatever_the_plan() -> None:
    """Seen failing before the order was made explicit: the rows came back lowest priority
    first, as they were written."""
    tenant = Tenant.objects.create(slug="order")
    # Written lowest priority first, all due at one instant: the table's order is the
    # opposite of the claim's.
    priorities = sorted(n % 10 for n in range(3_000))
    seed(tenant, [NOW] * len(priorities), priorities)
    with connection.cursor() as cur:
        cur.execute("ANALYZE django_app_outboxentry")
        cur.execute(
            queries.claim(sharded=False, keyed=True),
            {"token": "t", "lease": 30, "now": NOW, "until": NOW + timedelta(seconds=5),
             "limit": 1_000, "shards": [], "rate_limited": []},
        )  # fmt: skip
        claimed = [row[0] for row in cur.fetchall()]
        cur.execute(
            "SELECT id FROM django_app_outboxentry WHERE sent_at IS NULL "
            "ORDER BY available_at, priority DESC, id LIMIT 1000"
        )
        expected = [row[0] for row in cur.fetchall()]
    assert claimed == expected
