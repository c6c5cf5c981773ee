"""Chaos soak: real beats and workers under faults, judged from an independent effect log.

``python -m tests.chaos.soak --minutes 25 --seed N`` runs the long soak on a dedicated
database; ``pytest -m chaos`` runs the short one on the test database (see ``soak.py``).
"""
