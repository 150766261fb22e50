"""The launchers users put in front of their script, recognised on the command line:
``torchrun`` (or ``python -m torch.distributed.run``) and ``accelerate launch --multi_gpu``.

Such a launcher, started once per ``hpcml run`` task, starts the workers that train: each
is a rank of the job (its ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` are the launcher's), and
``hpcml run`` watches each as a rank it started itself (``hpcml.run.worker``). Here: which
launcher a command is, how many workers each task's launcher starts (the watch's world is
the tasks times that), and the rendezvous variables the launch line leaves to hpcml.

torchrun reads every option from ``PET_<OPTION>`` when the line does not give it (its
``env`` argparse action), so hpcml sets ``PET_NNODES``, ``PET_NODE_RANK``,
``PET_MASTER_ADDR`` and ``PET_MASTER_PORT`` from its own rendezvous (a free port on rank
0's node, not torchrun's fixed 29500 that two jobs on one node fight over) and leaves
alone what the line or the user's environment sets. A ``--standalone`` line makes its own.
``accelerate launch`` is given nothing: its rendezvous comes from its config and options.

Why by hand, not argparse with the launchers' own parsers: importing torchrun's parser
imports torch (seconds), and the launch line is only read here, never rewritten.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

#: what the task wrapper tells the ranks' sitecustomize: the launcher's name
ENV_LAUNCHER = "HPCML_RUN_LAUNCHER"
#: the ranks' variables of the process hpcml already watches (``hpcml.run.inject``): a
#: Python process whose own differ was started by the launcher, and is a worker to wrap
ENV_WRAPPED = "HPCML_RUN_WRAPPED"
#: set in a wrapped worker, inherited by all its processes: none of them is a new worker
ENV_IN_RANK = "HPCML_RUN_IN_RANK"
#: what tells two processes of the same rank apart from a new worker: the launcher's own
#: rank variables and its restart count (a worker restarted by torchrun is a new rank process)
IDENTITY = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT")

# the options that take no value, read from torch 2.13's torchrun and accelerate 1.15's launch
# parsers (their argparse actions with nargs 0; both spellings); any other option takes one
_TORCHRUN_FLAGS = {"-h", "--help", "-m", "--module", "--no-python", "--no_python", "--run-path", "--run_path",
                   "--standalone", "--virtual-local-rank", "--virtual_local_rank"}
_ACCELERATE_FLAGS = {"-h", "--help", "-m", "--module", "-q", "--quiet", "--cpu", "--debug", "--tpu"} | {
    spelling for name in ("downcast_bf16", "dynamo_use_dynamic", "dynamo_use_fullgraph",
                          "dynamo_use_regional_compilation", "enable_cpu_affinity", "fp8_use_autocast_during_eval",
                          "multi_gpu", "no_python", "no_tpu_cluster", "same_network", "tpu_cluster", "tpu_use_sudo",
                          "use_deepspeed", "use_fsdp", "use_megatron_lm", "use_parallelism_config")
    for spelling in (f"--{name}", f"--{name.replace('_', '-')}")}


@dataclass(frozen=True)
class Launch:
    """A recognised launch line: ``name``, the workers per task (None when the line leaves
    it to the host, as ``--nproc-per-node auto``), and the launcher options it gives."""

    name: str
    workers: int | None
    options: Mapping[str, str] = field(default_factory=dict)

    @property
    def standalone(self) -> bool:
        return "standalone" in self.options

    def rendezvous_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """What the task sets for its launcher (torchrun only): the ``PET_*`` of each
        rendezvous option neither the line nor ``env`` gives."""
        if self.name != "torchrun" or self.standalone:
            return {}
        given = set(self.options)
        want = {"nnodes": env.get("WORLD_SIZE"), "node_rank": env.get("RANK"),
                "master_addr": env.get("MASTER_ADDR"), "master_port": env.get("MASTER_PORT")}
        if {"rdzv_endpoint", "rdzv_backend"} & given:       # the user's own rendezvous: its node ranks
            want = {"nnodes": want["nnodes"]}
        return {f"PET_{k.upper()}": v for k, v in want.items()
                if v is not None and k not in given and f"PET_{k.upper()}" not in env}


def _options(args: list[str], flags: set[str]) -> dict[str, str]:
    """The launcher's ``--option value`` / ``--option=value`` / flags, up to the script;
    keys without their dashes, ``-`` read as ``_`` (both launchers take both spellings)."""
    out: dict[str, str] = {}
    i = 0
    while i < len(args):
        a = args[i]
        if not a.startswith("-") or a == "--":
            break
        if "=" in a:
            k, v = a.split("=", 1)
            out[k.lstrip("-").replace("-", "_")] = v
        elif a in flags:
            out[a.lstrip("-").replace("-", "_")] = ""
            if a in ("-m", "--module"):        # the module to run is the script
                break
        elif i + 1 < len(args):
            out[a.lstrip("-").replace("-", "_")] = args[i + 1]
            i += 1
        i += 1
    return out


def _whole(v: str | None) -> int | None:
    return int(v) if v is not None and v.strip().isdigit() and int(v) > 0 else None


def _get(options: Mapping[str, str], *names: str) -> str | None:
    return next((options[n] for n in names if n in options), None)


def recognise(cmd: list[str], env: Mapping[str, str] | None = None) -> Launch | None:
    """The launcher ``cmd`` starts, or None for a plain program (one rank per task).
    ``workers`` is None (watched as one rank per task) where hpcml cannot know it or cannot
    wrap them: a count the host decides (``auto``), workers that are not Python processes
    (``--no-python``)."""
    env = os.environ if env is None else env
    if not cmd:
        return None
    head = os.path.basename(cmd[0])
    if head == "torchrun":
        rest = cmd[1:]
    elif head.startswith("python") and cmd[1:3] in (["-m", "torch.distributed.run"],):
        rest = cmd[3:]
    elif head == "accelerate" and cmd[1:2] == ["launch"]:
        opts = _options(cmd[2:], _ACCELERATE_FLAGS)
        total = _whole(_get(opts, "num_processes"))
        machines = _whole(_get(opts, "num_machines")) or 1
        # only --multi_gpu starts torch's elastic agent with num_processes workers: --cpu
        # runs one process (measured: accelerate 1.15), the others leave it to the config file
        many = total is not None and "multi_gpu" in opts and "no_python" not in opts and total % machines == 0
        return Launch("accelerate", total // machines if many and total else None, opts)
    else:
        return None
    opts = _options(rest, _TORCHRUN_FLAGS)
    given = _get(opts, "nproc_per_node", "nproc_per") or env.get("PET_NPROC_PER_NODE")
    workers = 1 if given is None else _whole(given)                  # torchrun's default: 1
    if "no_python" in opts:
        workers = None                                               # not Python: nothing to wrap
    return Launch("torchrun", workers, opts)


def identity(env: Mapping[str, str]) -> str:
    """The rank variables that tell a launcher's worker from the process hpcml wraps."""
    return "|".join(env.get(k, "") for k in IDENTITY)
