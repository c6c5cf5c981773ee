"""Operations: what an operator runs or looks at to keep the scheduler healthy.

health: status, liveness and readiness; metrics_server: the Prometheus and health HTTP
endpoints of beat and workers; observe: record relay and worker events in the metrics;
reconcile: the offline reconciler (expected against actual occurrences); retention: delete
old finished occurrences.
"""
