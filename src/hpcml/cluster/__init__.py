"""Where am I running: the allocation as data, hostlists, and timeout-guarded Slurm clients."""

from hpcml.cluster.allocation import Allocation, current, this_node
from hpcml.cluster.hostlist import expand, fold

__all__ = ["Allocation", "current", "this_node", "expand", "fold"]
