"""Worker: the database side of running one occurrence in a Celery worker.

claim: claim an occurrence (fencing, overlap policy, concurrency slots); finish: renew,
complete, fail, reap expired leases, replay dead letters; limits: ``max_runs`` and
``pause_after_failures`` on the claim and finish paths; idempotency: the records behind
``@idempotent_task``; queries: the raw SQL statements of the PostgreSQL paths, named.
"""
