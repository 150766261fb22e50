"""Which rank am I, of how many: one answer for every component.

The checkpointer, the dataset reader, the recorder and the allocation all ask; each used
to read its own variables in its own order (observe took ``RANK`` alone, the checkpointer
only a full pair), so one process could be rank 3 to one and rank 0 to another. The order,
first match wins:

1. an initialised ``torch.distributed`` process group (never imported here: importing
   torch costs a loader worker a second; only a group the program already set up counts);
2. ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` (torchrun, ``hpcml run``);
3. ``SLURM_PROCID`` / ``SLURM_NTASKS`` / ``SLURM_LOCALID`` (an srun step);
4. ``OMPI_COMM_WORLD_RANK`` / ``_SIZE`` / ``_LOCAL_RANK`` (Open MPI's mpirun),
   ``PMI_RANK`` / ``PMI_SIZE`` / ``MPI_LOCALRANKID`` (MPICH, Cray PALS);
5. rank 0 of 1.

A launcher's variables count only as a whole: the rank and the size both set, both whole
numbers, the rank below the size. A lone ``RANK`` (a user's own variable of that name) is
not taken for a rank of an unknown world.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

#: (rank, world size, local rank) variables of each launcher, in the order they are trusted
LAUNCHERS: tuple[tuple[str, str, str], ...] = (
    ("RANK", "WORLD_SIZE", "LOCAL_RANK"),
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
)


@dataclass(frozen=True)
class Ranks:
    rank: int
    world_size: int
    local_rank: int
    #: where the answer came from: ``torch.distributed``, the rank variable's name, or ``default``
    source: str


def _whole(value: str | None) -> int | None:
    """A rank variable's whole number; None for anything else (``"²"`` is a digit to
    ``isdigit`` and no number to ``int``)."""
    text = (value or "").strip()
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 9 else None


def initialised_dist():
    """``torch.distributed`` when this process already imported it and set up a group."""
    dist = sys.modules.get("torch.distributed")
    return dist if dist is not None and dist.is_available() and dist.is_initialized() else None


def ranks(env: Mapping[str, str] | None = None, *, dist: bool = True) -> Ranks:
    """This process's rank, world size and local rank (the module docstring's order).

    ``env`` defaults to ``os.environ``; ``dist=False`` skips torch.distributed (an env
    given for another process, or a caller that must not depend on this one's group)."""
    env = os.environ if env is None else env
    group = initialised_dist() if dist else None
    local = next((v for _, _, name in LAUNCHERS if (v := _whole(env.get(name))) is not None), 0)
    if group is not None:
        return Ranks(group.get_rank(), group.get_world_size(), local, "torch.distributed")
    for rank_var, size_var, local_var in LAUNCHERS:
        rank, size = _whole(env.get(rank_var)), _whole(env.get(size_var))
        if rank is not None and size is not None and rank < size:
            return Ranks(rank, size, _whole(env.get(local_var)) or 0, rank_var)
    return Ranks(0, 1, 0, "default")


def restart_count(env: Mapping[str, str] | None = None) -> int:
    """How many times Slurm requeued this job (``SLURM_RESTART_COUNT``; 0 when unset or not a number)."""
    env = os.environ if env is None else env
    return _whole(env.get("SLURM_RESTART_COUNT")) or 0


def slurm_ranks(env: Mapping[str, str] | None = None) -> Ranks:
    """This task's place in its srun step from Slurm's own variables alone (the allocation,
    a vet step), whatever a launcher inside it set."""
    env = os.environ if env is None else env
    return ranks({k: v for k, v in env.items() if k.startswith("SLURM_")}, dist=False)
