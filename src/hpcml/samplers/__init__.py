"""Samplers for every component, one module each: host, NVML, DCGM, and the chooser.

A sampler's ``sample(ts_ns)`` returns store rows (hpcml.observe.store).
"""
