"""Relay: publish due outbox rows to the broker, then mark them sent.

batch: the per-batch relay (one transaction per batch) and the lookahead relay that
publishes rows at their time; burst: the PostgreSQL burst relay that claims ahead and
publishes a burst at its instant; burst_rows: its held-row types and timings; queries:
the relay's SQL statements, named; redelivery: publish again what the broker lost, under
the same id.
"""
