"""Database plumbing shared by every concept, independent of the scheduler's rules.

checks: what the scheduler needs from the database configuration (system checks, refusing
an unsafe SQLite setup); connections: drop a connection an error left broken; retry: run a
transaction again when the database chose it as a deadlock victim; partitions, convert:
PostgreSQL's partitioned history; queries: the raw SQL statements of the package, and the
session bounds and ping other packages use.
"""
