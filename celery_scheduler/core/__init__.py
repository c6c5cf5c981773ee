"""Pure scheduling logic: no Django, no Celery, no I/O. Everything here is unit-testable."""
