"""Observability: Prometheus metrics, log formats, tracing."""
