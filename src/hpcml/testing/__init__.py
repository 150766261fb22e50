"""Harnesses for hpcml's own tests and benchmarks (a local Slurm cluster, synthetic jobs).

Shipped so that a site can run the suite against an installed hpcml; never imported by the
commands themselves.
"""
