"""hpcml.cluster.ranks: one order for "which rank am I", used by every component.

The same environment gives the same rank to the checkpointer, the dataset reader, the
recorder and the allocation (before, observe took a lone ``RANK`` and the others did not).
"""

from __future__ import annotations

import sys
import types

import pytest

from hpcml.cluster.ranks import Ranks, ranks, restart_count, slurm_ranks

SRUN = {"SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1"}
TORCHRUN = {"RANK": "5", "WORLD_SIZE": "16", "LOCAL_RANK": "2"}


@pytest.mark.parametrize("env, want", [
    ({}, Ranks(0, 1, 0, "default")),
    (SRUN, Ranks(3, 8, 1, "SLURM_PROCID")),
    ({**SRUN, **TORCHRUN}, Ranks(5, 16, 2, "RANK")),                 # the launcher inside srun wins
    ({"RANK": "5", **SRUN}, Ranks(3, 8, 1, "SLURM_PROCID")),         # a lone RANK is not a launcher's
    ({"RANK": "9", "WORLD_SIZE": "4", **SRUN}, Ranks(3, 8, 1, "SLURM_PROCID")),   # rank >= size: not a rank
    ({"RANK": "x", "WORLD_SIZE": "4"}, Ranks(0, 1, 0, "default")),
    ({"SLURM_PROCID": "²", "SLURM_NTASKS": "8"}, Ranks(0, 1, 0, "default")),     # a digit to isdigit, no number
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0"},
     Ranks(2, 4, 0, "OMPI_COMM_WORLD_RANK")),
    ({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1"}, Ranks(1, 2, 1, "PMI_RANK")),
])
def test_the_documented_order(env, want):
    assert ranks(env, dist=False) == want


def test_an_initialised_process_group_comes_first(monkeypatch):
    """A stand-in for ``torch.distributed`` (its API: is_available, is_initialized,
    get_rank, get_world_size): torch itself would cost seconds and a real group for a
    property of the order."""
    group = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True,
                                  get_rank=lambda: 7, get_world_size=lambda: 32)
    monkeypatch.setitem(sys.modules, "torch.distributed", group)
    assert ranks({**SRUN, **TORCHRUN}) == Ranks(7, 32, 2, "torch.distributed")
    assert ranks({**SRUN, **TORCHRUN}, dist=False).source == "RANK"
    group.is_initialized = lambda: False
    assert ranks(TORCHRUN).source == "RANK"


def test_every_component_agrees_on_one_environment(monkeypatch):
    from hpcml.ckpt.checkpointer import _rank_world
    from hpcml.data.reader import _env_rank
    from hpcml.observe.api import rank_from_env
    from hpcml.observe.recorder import Task
    env = {**SRUN, "RANK": "5"}                 # a stray RANK beside srun's variables
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    task = Task.from_env(env)
    assert _rank_world(None, None) == _env_rank() == (3, 8) == (task.rank, task.ntasks)
    assert rank_from_env(env) == 3


def test_slurm_ranks_ignores_a_launcher_inside_the_step():
    assert slurm_ranks({**SRUN, **TORCHRUN}) == Ranks(3, 8, 1, "SLURM_PROCID")


@pytest.mark.parametrize("value, want", [(None, 0), ("", 0), ("2", 2), ("x", 0), ("-1", 0)])
def test_restart_count(value, want):
    assert restart_count({} if value is None else {"SLURM_RESTART_COUNT": value}) == want
