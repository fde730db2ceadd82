"""Metrics and analyses of trained models (restored with `sorjax.restore`)."""
