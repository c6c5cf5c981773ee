"""Materialize: turn due schedules into occurrence and outbox rows, under shard fencing.

per_schedule: the portable materializer, one transaction per schedule (and the row
builders both use); set_based: the PostgreSQL materializer, one transaction per batch of
due schedules, same rows and cursor moves; queries: their raw SQL statements, named.
"""
