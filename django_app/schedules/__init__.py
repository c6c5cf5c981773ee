"""Schedules: what users create and change, and every rule about their fire times.

lifecycle: create, update, pause, resume, cancel, run now; validation: caller input to a
checked spec; bulk_create: create/sync many in one call; bulk_actions: pause/resume/cancel
by filter; reads: describe and list; replan: where a new version starts; skips: skip one
fire time; backfill: run a past range once; beat_schedule: sync Celery's static
``beat_schedule``; audit: the API's audit trail; queries: the raw SQL statements of the
PostgreSQL create paths, named.
"""
