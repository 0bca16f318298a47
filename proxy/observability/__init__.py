"""Metrics (Prometheus), traces (OpenTelemetry) and the per-request bookkeeping that feeds them."""
