"""Relay: publish due outbox rows to the broker, then mark them sent.

batch: the per-batch relay (one transaction per batch) and the lookahead relay that
publishes rows at their time; burst: the PostgreSQL burst relay that claims ahead and
publishes a burst at its instant; burst_queries: its held-row types, statements and
timings; redelivery: publish again what the broker lost, under the same id.
"""
