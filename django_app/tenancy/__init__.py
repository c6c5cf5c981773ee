"""Tenancy on the data path: the quotas each tenant gets, shared by every process.

quotas: the quotas enforced on the data path (fair relay batches, trigger rate, running
concurrency); budget: the per-tenant rate budgets (token buckets) kept in the database;
queries: the fair batch's locking statement.
Creating tenants and changing their quotas is the API's (``django_app.tenants``), above
the schedules whose input checks it uses.
"""
