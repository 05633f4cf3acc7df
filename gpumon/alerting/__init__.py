"""Headless monitoring: alert rules and their evaluation, `gpumon watch`, alert hooks, event lines
and the Prometheus exposition and rules."""
