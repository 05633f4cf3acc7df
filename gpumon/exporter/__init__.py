"""Prometheus exposition: the collectors `watch --prometheus` serves for this machine or a fleet,
under gpumon's own names and dcgm-exporter's (and AMD's device-metrics-exporter's), with the
owners' labels and the health series.
"""
