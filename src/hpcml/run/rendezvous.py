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


class PortProbe:
    """A free port on ``node`` asked for in the background (one ``srun --overlap`` step,
    ``slurm.free_port_on``), while the launcher vets: the rendezvous of the first attempt
    then waits for no step of its own when rank 0's node is the one probed."""

    def __init__(self, node: str, python: str) -> None:
        import threading
        self.node = node
        self._port: int | None = None
        self._error: SlurmError | None = None
        self._thread = threading.Thread(target=self._probe, args=(python,), name="hpcml-port-probe", daemon=True)
        self._thread.start()

    def _probe(self, python: str) -> None:
        try:
            self._port = slurm.free_port_on(self.node, python)
        except SlurmError as exc:
            self._error = exc
        except Exception as exc:  # noqa: BLE001 - a failed fork under load: said when the port is wanted
            self._error = SlurmError(f"srun on {self.node}: {exc}")

    def port(self, timeout: float = 60.0) -> int:
        """The port; the probe's ``SlurmError`` if it failed or did not answer in time."""
        self._thread.join(timeout)
        if self._port is None:
            raise self._error or SlurmError(f"srun on {self.node}: no free port within {timeout:g} s")
        return self._port


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
