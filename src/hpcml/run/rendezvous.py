"""torch.distributed's rendezvous, set for the user: every task gets MASTER_ADDR,
MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK and LOCAL_WORLD_SIZE, so that
``init_process_group()`` works with its default ``env://`` and no boilerplate.

The port is a free one on the master's node (the node of rank 0, where torch's TCPStore
listens), not a fixed default that two jobs sharing a node would fight over.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Mapping

FREE_PORT = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"


def free_port(host: str = "") -> int:
    """A port the kernel calls free now (rank 0 binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def node_address(node: str) -> str:
    """An address other nodes reach ``node`` at: its name if it resolves, else Slurm's
    NodeAddr (virtual nodes of one host have names only Slurm knows)."""
    try:
        socket.gethostbyname(node)
        return node
    except OSError:
        pass
    try:
        out = subprocess.run(["scontrol", "show", "node", node, "-o"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return node
    for word in out.split():
        if word.startswith("NodeAddr="):
            return word.split("=", 1)[1]
    return node


def task_env(env: Mapping[str, str]) -> dict[str, str]:
    """The rendezvous variables of this task under srun, from Slurm's (MASTER_* come from
    the launcher); outside srun the launcher sets all of them itself."""
    out: dict[str, str] = {}
    if "SLURM_PROCID" in env and "SLURM_STEP_ID" in env:
        out["RANK"] = env["SLURM_PROCID"]
        out["LOCAL_RANK"] = env.get("SLURM_LOCALID", "0")
        out["WORLD_SIZE"] = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS", "1")
        per_node = (env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or "1").split("(")[0]
        out["LOCAL_WORLD_SIZE"] = per_node.split(",")[0]
    return out
