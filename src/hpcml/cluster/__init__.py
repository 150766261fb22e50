"""Where am I running: the allocation as data, hostlists, and timeout-guarded Slurm clients.

Its modules are imported by name (``hpcml.cluster.slurm``); this package imports none of
them, so a node's worker that reads ``SLURMD_NODENAME`` loads nothing it does not use.
"""
