"""Metrics (Prometheus exposition) and gRPC health for each service process; tracing is
kfactory.observability.tracing."""
