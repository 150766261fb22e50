"""``hpcml observe``: parse arguments, call the recorder or the readers, render."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from hpcml.cli_support import fail
from hpcml.errors import HpcmlError

app = typer.Typer(no_args_is_help=True, rich_markup_mode="rich",
                  help="Per-rank telemetry for a job: record it, then look at it.\n\n"
                       "Example: [bold]srun hpcml observe record -- python train.py[/]")


@app.command("record", context_settings={"allow_interspersed_args": False})
def record_cmd(
    cmd: List[str] = typer.Argument(..., help="The task's command, after --."),
    out: Optional[Path] = typer.Option(None, "--dir", help="Job directory (default: ./hpcml-observe-<jobid>)."),
    interval: float = typer.Option(1.0, help="Seconds between host/GPU samples (>= 0.1)."),
    no_gpu: bool = typer.Option(False, "--no-gpu", help="Do not sample GPUs."),
    prometheus_port: Optional[int] = typer.Option(None, help="Serve live metrics on this port + local rank."),
    prometheus_addr: str = typer.Option("127.0.0.1", help="Address to serve them on (default loopback)."),
) -> None:
    """Run CMD as this task and record it; exits with CMD's exit code.

        srun hpcml observe record --dir $SCRATCH/obs-$SLURM_JOB_ID -- python train.py
    """
    from hpcml.observe.recorder import record
    try:
        rc = record(cmd, out, interval, gpu_sampler=not no_gpu, prometheus_port=prometheus_port,
                    prometheus_addr=prometheus_addr)
    except HpcmlError as exc:
        fail("hpcml observe record", exc)
    raise typer.Exit(rc)


@app.command("summary")
def summary_cmd(job_dir: Path = typer.Argument(..., help="A job directory.")) -> None:
    """Ranks, rows and damaged files of a job directory (the full report comes later)."""
    from hpcml.observe.store import read_job
    try:
        job = read_job(job_dir)
    except HpcmlError as exc:
        fail("hpcml observe summary", exc)
    print(f"{job.path}: {len(job.ranks)} ranks, {job.table.num_rows} rows")
    for rank, problem in sorted(job.problems.items()):
        print(f"rank {rank}: {problem}")
    if job.missing:
        print(f"missing ranks: {job.missing}")


@app.command("hang")
def hang_cmd(
    dump_dir: Path = typer.Argument(..., help="Directory of Flight Recorder dumps, one per rank."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of text."),
) -> None:
    """Which ranks a hung job waits for, from PyTorch's Flight Recorder dumps.

        TORCH_FR_BUFFER_SIZE=2000 TORCH_FR_DUMP_TEMP_FILE=$SCRATCH/fr/rank_ srun python train.py
        hpcml observe hang $SCRATCH/fr
    """
    import json
    from dataclasses import asdict

    from hpcml.observe.hang import analyse
    try:
        rep = analyse(dump_dir)
    except HpcmlError as exc:
        fail("hpcml observe hang", exc)
    if as_json:
        print(json.dumps({"dumps": {r: str(p) for r, p in rep.dumps.items()}, "refused": rep.refused,
                          "missing": rep.missing, "findings": [asdict(f) for f in rep.findings],
                          "last_seq": rep.last_seq}, indent=2))
        return
    print(f"{len(rep.dumps)} dumps read from {dump_dir}")
    for name, why in rep.refused.items():
        print(f"refused {name}: {why}")
    if rep.missing:
        print(f"no dump from ranks {rep.missing}: look at them first (they may have died)")
    for f in rep.findings:
        print(f"process group {f.pg}, collective #{f.seq}: {f.kind}: culprits {f.culprits}: {f.detail}")
    if not rep.findings and not rep.missing:
        print("all ranks agree on every collective they still record")
