"""Guard: the models and the committed migrations never drift apart."""

from __future__ import annotations

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_no_missing_migrations() -> None:
    # --check exits non-zero (SystemExit) when a model change has no migration.
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)
