"""Harnesses for hpcml's own tests and benchmarks (a local Slurm cluster, synthetic jobs,
replays of recorded GPUs).

Shipped so that a site can run the suite against an installed hpcml; the commands import
them only through an explicit replay seam (``HPCML_GPM_REPLAY``).
"""
