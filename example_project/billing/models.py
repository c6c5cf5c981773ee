from __future__ import annotations

from django.db import models


class Invoice(models.Model):
    """Deliberately NO unique constraint on (customer, period): the decorator prevents doubles."""

    customer = models.CharField(max_length=100)
    period = models.CharField(max_length=20)
    amount_cents = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"invoice {self.customer} {self.period}"
