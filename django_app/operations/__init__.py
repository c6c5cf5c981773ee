"""Operations: what an operator runs or looks at to keep the scheduler healthy.

health: status, liveness and readiness; metrics_server: the Prometheus and health HTTP
endpoints of beat and workers; reconcile: the offline reconciler (expected against actual
occurrences); retention: delete old finished occurrences. The data path's metric hooks
are ``django_app.observe``, below every package that emits.
"""
