"""torch.distributed's rendezvous, set for the user: every task gets MASTER_ADDR,
MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK and LOCAL_WORLD_SIZE, so that
``init_process_group()`` works with its default ``env://`` and no boilerplate.

The port is a free one on the master's node (the node of rank 0, where torch's TCPStore
listens), not a fixed default that two jobs sharing a node would fight over.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping

from hpcml.cluster import slurm
from hpcml.cluster.allocation import tasks_per_node
from hpcml.errors import SlurmError


def node_address(node: str) -> str:
    """An address other nodes reach ``node`` at: its name if it resolves, else Slurm's
    NodeAddr (virtual nodes of one host have names only Slurm knows)."""
    try:
        socket.gethostbyname(node)
        return node
    except OSError:
        pass
    try:
        recs = slurm.scontrol_show("node", node, timeout=10)
    except SlurmError:
        return node
    return (recs[0].get("NodeAddr") if recs else None) or node


def task_env(env: Mapping[str, str]) -> dict[str, str]:
    """The rendezvous variables of this task under srun, from Slurm's (MASTER_* come from
    the launcher); outside srun the launcher sets all of them itself."""
    out: dict[str, str] = {}
    if "SLURM_PROCID" in env and "SLURM_STEP_ID" in env:
        out["RANK"] = env["SLURM_PROCID"]
        out["LOCAL_RANK"] = env.get("SLURM_LOCALID", "0")
        out["WORLD_SIZE"] = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS", "1")
        # this node's count (SLURM_NODEID is the node's index in the step): "3,2" gives the
        # second node 2, not the first node's 3
        counts = tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE"), 1)
        node = int(env["SLURM_NODEID"]) if env.get("SLURM_NODEID", "").isdigit() else 0
        out["LOCAL_WORLD_SIZE"] = str(counts[node] if node < len(counts) else counts[0])
    return out
