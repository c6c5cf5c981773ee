"""Management commands: ``preview_schedule``, ``reconcile`` and friends."""

from __future__ import annotations
