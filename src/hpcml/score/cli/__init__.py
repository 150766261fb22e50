"""``hpcml score``: record a job's GPUs, import other tools' recordings, report the score."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from hpcml.cli_support import Group, write_report
from hpcml.errors import UsageError

app = typer.Typer(name="score", cls=Group, no_args_is_help=True, rich_markup_mode="rich",
                  help="How saturated a job's GPUs were: compute, memory and interconnect, "
                       "explained.\n\nExample: [bold]srun hpcml score record -- python train.py[/] "
                       "then [bold]hpcml score report hpcml-observe-$SLURM_JOB_ID[/]")

INTERVAL_HELP = "Sampling interval in s, for formats without timestamps (dcgmi dmon, nvidia-smi dmon without -o DT)."
FORMAT_HELP = ("Input format (default: detected from content): store, gssr-json, gssr-sqlite, gssr-record, dmon "
               "(dcgmi dmon), nvidia-smi-dmon, exporter.")


@app.command("record", context_settings={"allow_interspersed_args": False})
def record_cmd(
    cmd: list[str] = typer.Argument(..., help="The task's command, after --."),
    out: Optional[Path] = typer.Option(None, "--dir", help="Job directory (default: ./hpcml-observe-<jobid>)."),
    interval: float = typer.Option(1.0, help="Seconds between samples (>= 0.1)."),
    gpu_metrics: str = typer.Option("auto", help="auto (DCGM, else NVML GPM, else NVML), dcgm, gpm, nvml "
                                    "or a site's sampler (the hpcml.samplers entry points)."),
) -> None:
    """Run CMD as this task and record its GPUs' DCGM profiling fields into the observe job store.

        srun hpcml score record --dir $SCRATCH/score-$SLURM_JOB_ID -- python train.py

    Without a DCGM host engine it reads the same kind of metrics through NVML GPM (Hopper
    and newer GPUs); failing that, NVML utilisation, and the report then says "temporal
    utilisation only, no saturation". Exits with CMD's exit code.
    """
    from hpcml.observe.recorder import record
    from hpcml.samplers.choose import modes
    samplers = [m for m in modes() if m != "none"]      # the registry's (plug-ins too): a score needs a GPU sampler
    if gpu_metrics not in samplers:
        raise UsageError(f"'{gpu_metrics}' is not one of {', '.join(samplers)}", key="--gpu-metrics")
    rc = record(cmd, out, interval, gpu_metrics=gpu_metrics)
    raise typer.Exit(rc)


def _load(path: Path, fmt: Optional[str], interval: Optional[float]):
    from hpcml.score.importers import load
    kw = {"interval": interval} if interval else {}
    return load(path, fmt, **kw)


@app.command("report")
def report_cmd(
    path: Path = typer.Argument(..., help="A job directory or another tool's recording."),
    fmt: Optional[str] = typer.Option(None, "--format", help=FORMAT_HELP),
    html_out: Optional[Path] = typer.Option(None, "--html", help="HTML file (default: PATH/score.html, or PATH.score.html for a file)."),
    no_html: bool = typer.Option(False, "--no-html", help="Do not write the HTML report."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON instead of text."),
    interval: Optional[float] = typer.Option(None, help=INTERVAL_HELP),
) -> None:
    """Score a recording and say what bounds it and what to do about it.

    Prints the score, its compute / memory / interconnect parts, imbalance across GPUs
    and nodes and the findings, and writes an offline HTML report.

        hpcml score report $SCRATCH/score-123

        hpcml score report profile_out_JobID_123 --json > score.json

    Exit codes: 0 report written, 2 unreadable or unknown input.
    """
    import json

    from hpcml.score.report import build
    rep = build(_load(path, fmt, interval))
    out = None
    if not no_html:
        from hpcml.score import html as score_html
        out = write_report(score_html.write, rep, html_out or (
            path / "score.html" if path.is_dir() else path.with_name(path.name + ".score.html")))
    if as_json:
        print(json.dumps(rep, indent=1, allow_nan=False))
        return
    from hpcml.score.terminal import print_summary
    print_summary(rep, out)


@app.command("import")
def import_cmd(
    path: Path = typer.Argument(..., help="Another tool's recording: dcgmi dmon or nvidia-smi dmon text, a "
                                   "dcgm-exporter scrape series, gssr JSON/SQLite, gssr-record CSV."),
    out: Path = typer.Option(..., "--dir", help="Job directory to write (must not exist or be empty)."),
    fmt: Optional[str] = typer.Option(None, "--format", help=FORMAT_HELP),
    interval: Optional[float] = typer.Option(None, help=INTERVAL_HELP),
) -> None:
    """Convert a recording into an hpcml job directory, so it is kept and scored like one recorded here.

        hpcml score import profile_out_JobID_123 --dir score-123
    """
    from hpcml.score.archive import write_store
    rec = _load(path, fmt, interval)
    n = write_store(rec, out)
    inst = sum(1 for g in rec.gpus.values() if g.mig)
    mig = f" and {inst} MIG instance{'s' if inst != 1 else ''}" if inst else ""
    print(f"{out}: {len(rec.gpus) - inst} GPUs{mig} on {len({k[0] for k in rec.gpus})} nodes, {n:,} values")


@app.command("selftest")
def selftest_cmd(
    seconds: float = typer.Option(20.0, help="Seconds per workload."),
    keep: Optional[Path] = typer.Option(None, "--dir", help="Keep the recordings here (default: a temporary directory)."),
    gpu_metrics: str = typer.Option("auto", help="auto (DCGM, else NVML GPM), dcgm, gpm, or nvml (plumbing only)."),
) -> None:
    """On a GPU node: run a known compute-bound and a known memory-bound torch workload under
    the recorder and check the score ranks and classifies them correctly.

        srun -N1 --gpus=1 hpcml score selftest

    Says which sampler it verified. Exit codes: 0 passed, 4 the score got them wrong,
    2 no GPU, torch or saturation metrics here.
    """
    from hpcml.score.selftest import run
    rc = run(seconds=seconds, keep=keep, gpu_metrics=gpu_metrics)
    raise typer.Exit(rc)
