"""``hpcml run [OPTIONS] -- CMD`` without the CLI framework: argparse, then the launcher.

Every job script runs it once, on the critical path of the allocation, so ``hpcml.cli.main``
routes it here before importing Typer (Typer, its pydantic parameter adapters and Rich's
help formatting cost ~0.1 s of the launcher's start). ``--help`` before ``--`` still goes to
Typer, whose command calls ``execute`` too. Errors (``HpcmlError``) go up to the caller,
which reports them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hpcml.fastparser import FastParser

PROG = "hpcml run"
#: settings an error may name -> the option the user typed (tests/test_fastpaths.py compares
#: them with the Typer command's)
FLAGS = {"cmd": "CMD", "dir": "--dir", "out": "--dir", "vet": "--vet", "min_nodes": "--min-nodes", "ntasks": "--ntasks",
         "ntasks_per_node": "--ntasks-per-node", "env": "--env", "gpus_per_task": "--gpus-per-task",
         "interval": "--interval", "gpu_metrics": "--gpu-metrics", "mlflow": "--mlflow",
         "kill_grace": "--kill-grace", "hang_timeout": "--hang-timeout", "on_hang": "--on-hang",
         "prometheus_port": "--prometheus-port", "prometheus_addr": "--prometheus-addr",
         "max_restarts": "--max-restarts", "spare_nodes": "--spare-nodes", "revet": "--revet",
         "on_straggler": "--on-straggler", "straggler_window": "--straggler-window",
         "collector": "--collector", "remote_write": "--remote-write"}


def wants(argv: list[str]) -> bool:
    """Every ``hpcml run`` but one asking for help before ``--`` (Typer shows it)."""
    head = argv[:argv.index("--")] if "--" in argv else argv
    return not {"--help", "-h"} & set(head)


def parser() -> FastParser:
    """The options of ``hpcml.run.cli.run_cmd``."""
    p = FastParser(prog=PROG, add_help=False)
    p.add_argument("--dir", dest="out", type=Path)
    p.add_argument("--vet", type=Path)
    for flag in ("--min-nodes", "--ntasks", "--ntasks-per-node", "--gpus-per-task", "--prometheus-port"):
        p.add_argument(flag, type=int)
    p.add_argument("--max-restarts", type=int, default=0)
    p.add_argument("--spare-nodes", type=int, default=0)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--kill-grace", type=float, default=10.0)
    for flag in ("--env", "--mlflow", "--revet", "--collector", "--remote-write"):
        p.add_argument(flag)
    for flag, default in (("--gpu-metrics", "auto"), ("--hang-timeout", "auto"), ("--on-hang", "stop"),
                          ("--prometheus-addr", "127.0.0.1"), ("--on-straggler", "report"),
                          ("--straggler-window", "60s")):
        p.add_argument(flag, default=default)
    p.add_argument("--no-report", action="store_true")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    return p


def main(argv: list[str]) -> int:
    p = parser()
    try:
        args = vars(p.parse_args(argv))
        cmd = args.pop("cmd")
        if cmd and cmd[0] not in ("--", "-") and cmd[0].startswith("-"):
            p.error(f"No such option: {cmd[0]}")        # argparse takes "-1" for the command
    except SystemExit:
        return 2
    return execute(cmd[1:] if cmd[:1] == ["--"] else cmd, **args)


def execute(cmd: list[str], *, out: Path | None = None, no_report: bool = False, **options) -> int:
    """Run the job; its exit code. ``options``: the rest of ``hpcml.run.config.Options``."""
    from hpcml.run.launcher import Options, run
    return run(Options(cmd=list(cmd), job_dir=out, report=not no_report, **options))
