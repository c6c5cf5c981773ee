"""Tenancy: tenants and the quotas each tenant gets, shared by every process.

tenants: create tenants, change their quotas and relay weight, list usage; quotas: the
quotas enforced on the data path (fair relay batches, trigger rate, running concurrency);
budget: the per-tenant rate budgets (token buckets) kept in the database.
"""
