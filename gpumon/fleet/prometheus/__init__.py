"""A cluster read through its Prometheus server: the HTTP API, logging in, and dcgm-exporter's
(or gpumon's) series made into snapshots per host.
"""
