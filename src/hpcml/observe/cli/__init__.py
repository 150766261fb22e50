"""``hpcml observe``: parse arguments, call the recorder or the readers, render."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from hpcml.cli_support import Group, write_report
from hpcml.errors import UsageError

app = typer.Typer(name="observe", cls=Group, no_args_is_help=True, rich_markup_mode="rich",
                  help="Per-rank telemetry for a job: record it, then look at it.\n\n"
                       "Example: [bold]srun hpcml observe record -- python train.py[/]")


@app.command("record", context_settings={"allow_interspersed_args": False})
def record_cmd(
    cmd: list[str] = typer.Argument(..., help="The task's command, after --."),
    out: Optional[Path] = typer.Option(None, "--dir", help="Job directory (default: ./hpcml-observe-<jobid>)."),
    interval: float = typer.Option(1.0, help="Seconds between host/GPU samples (>= 0.1)."),
    no_gpu: bool = typer.Option(False, "--no-gpu", help="Do not sample GPUs (same as --gpu-metrics none)."),
    gpu_metrics: str = typer.Option("auto", "--gpu-metrics", help="GPU sampler: auto (default: DCGM if a host engine answers, "
                                     "else NVML GPM on Hopper and newer, else NVML utilisation), dcgm, gpm, nvml or none."),
    prometheus_port: Optional[int] = typer.Option(None, help="Serve live metrics of this node's ranks on this port (local rank 0 serves)."),
    prometheus_addr: str = typer.Option("127.0.0.1", help="Address to serve them on (default loopback)."),
    mlflow: Optional[str] = typer.Option(None, "--mlflow", help="Send rank 0's metrics to this MLflow tracking server "
                                                               "(e.g. from hpcml service up mlflow), from a background thread."),
    remote_write: Optional[str] = typer.Option(None, "--remote-write", help="Push node and rank series to this Prometheus "
                                               "remote-write URL (VictoriaMetrics, Prometheus); default $HPCML_REMOTE_WRITE, "
                                               "bearer token from $HPCML_REMOTE_WRITE_TOKEN."),
    remote_write_no_job_label: bool = typer.Option(False, "--remote-write-no-job-label", help="Leave out the slurm_job label (the "
                                                   "next job continues the node and rank series; $HPCML_REMOTE_WRITE_NO_JOB_LABEL=1)."),
    remote_write_max_series: Optional[int] = typer.Option(None, "--remote-write-max-series", help="Refuse to start when the "
                                                          "job would write more series (default 30000; $HPCML_REMOTE_WRITE_MAX_SERIES)."),
) -> None:
    """Run CMD as this task and record it; exits with CMD's exit code.

        srun hpcml observe record --dir $SCRATCH/obs-$SLURM_JOB_ID -- python train.py

        srun hpcml observe record --remote-write http://vm:8428/api/v1/write -- python train.py
    """
    from hpcml.observe.recorder import record
    rc = record(cmd, out, interval, gpu_sampler=not no_gpu, prometheus_port=prometheus_port,
                prometheus_addr=prometheus_addr, gpu_metrics=gpu_metrics, mlflow=mlflow, remote_write=remote_write,
                remote_write_job_label=False if remote_write_no_job_label else None,
                remote_write_max_series=remote_write_max_series)
    raise typer.Exit(rc)


@app.command("summary")
def summary_cmd(job_dir: Path = typer.Argument(..., help="A job directory.")) -> None:
    """Ranks, rows and damaged files of a job directory (the full report comes later)."""
    from hpcml.observe.store import read_job
    job = read_job(job_dir)
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
    rep = analyse(dump_dir)
    if as_json:
        print(json.dumps({"schema": rep.tag, "dumps": {r: str(p) for r, p in rep.dumps.items()}, "refused": rep.refused,
                          "missing": rep.missing, "findings": [asdict(f) for f in rep.findings],
                          "last_seq": rep.last_seq, "roots": rep.roots, "blocked": rep.blocked,
                          "cycles": rep.cycles, "summary": rep.summary()}, indent=2))
        return
    print(f"{len(rep.dumps)} dumps read from {dump_dir}")
    for name, why in rep.refused.items():
        print(f"refused {name}: {why}")
    if rep.missing:
        print(f"no dump from ranks {rep.missing}: look at them first (they may have died)")
    for f in rep.findings:
        what = 'point-to-point' if f.kind.startswith('p2p') else 'collective'
        print(f"process group {f.pg}, {what} #{'?' if f.seq is None else f.seq}: {f.kind}: {f.detail}")
    if rep.roots:
        print(rep.summary())
    if not rep.findings and not rep.missing:
        print("all ranks agree on every collective they still record")


@app.command("report")
def report_cmd(
    job_dir: Path = typer.Argument(..., help="A job directory written by hpcml observe record."),
    html_out: Optional[Path] = typer.Option(None, "--html", help="HTML file (default: JOB_DIR/report.html)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON instead of text."),
    chronic: float = typer.Option(0.10, help="A rank this share slower than the step median in most steps is a chronic straggler."),
    stall_ratio: float = typer.Option(3.0, help="One step this many times the step median is a one-off stall."),
    episode_window: int = typer.Option(10, help="Steps per window when looking for transient stragglers."),
    min_stall: float = typer.Option(2.0, help="A job-wide stall lasts at least this many seconds (and 5 median steps)."),
    min_straggler_steps: int = typer.Option(30, help="No straggler verdict from fewer steps (every rank's)."),
    min_straggler_s: float = typer.Option(60.0, help="No straggler verdict from fewer seconds of steps."),
    parallelism: str = typer.Option("", help="How the ranks share the work, for the advice on a speed split: "
                                    "'data' (every rank the same work) or 'roles' (pipeline stages, servers)."),
) -> None:
    """The job report: throughput, stragglers, stalls, lost ranks, and what to do about them.

        hpcml observe report $SCRATCH/obs-$SLURM_JOB_ID

        hpcml observe report obs-123 --json > report.json

    Prints a summary and writes one self-contained HTML file that works offline.
    Exit codes: 0 report written, 2 not a job directory.
    """
    import json

    import pyarrow as pa

    from hpcml.arrowprobe import skip_pandas
    from hpcml.observe import html as report_html
    from hpcml.observe.report import Limits, build
    from hpcml.observe.series import read_series
    # Arrow's default mimalloc pool decommits freed pages eagerly; reading a thousand rank
    # files then costs seconds of page faults. The system allocator is ~2x faster here.
    pa.set_memory_pool(pa.system_memory_pool())
    skip_pandas()                           # hpcml's own process: 0.3 s saved (hpcml.arrowprobe)
    for key, value in (("chronic", chronic), ("stall_ratio", stall_ratio - 1), ("episode_window", episode_window),
                       ("min_stall", min_stall), ("min_straggler_steps", min_straggler_steps),
                       ("min_straggler_s", min_straggler_s)):
        if not value > 0:
            raise UsageError(f"must be above {1 if key == 'stall_ratio' else 0}", key=key)
    if parallelism not in ("", "data", "roles"):
        raise UsageError(f"expected 'data' or 'roles', got {parallelism!r}", key="--parallelism")
    limits = Limits(chronic=chronic, stall_ratio=stall_ratio, window=episode_window, min_stall_s=min_stall,
                    min_straggler_steps=min_straggler_steps, min_straggler_s=min_straggler_s)
    from hpcml import progress
    with progress.on_terminal(progress.wanted(as_json)):       # a thousand ranks take seconds to read
        series = read_series(job_dir)
    rep = build(series, parallelism=parallelism or None, limits=limits)
    out = write_report(report_html.write, rep, html_out or Path(job_dir) / "report.html")
    if as_json:
        print(json.dumps(rep.to_dict(), indent=2))
        return
    _print_report(rep, out)


def _print_report(rep, html_path: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    from hpcml.words import LINE_MAX, shown
    con = Console()
    from hpcml.observe.progress import line as progress_line
    dur = f"{rep.duration_s:.0f} s" if rep.duration_s is not None else "unknown duration"
    con.print(f"[bold]Job {shown(rep.job_id)}[/]: {rep.ranks_with_data}/{rep.ranks_expected} ranks with data, "
              f"{len(rep.nodes)} nodes, {dur}, {rep.rows:,} rows")
    con.print(f"did: {shown(progress_line(rep.progress), LINE_MAX)}", highlight=False)
    tp = rep.throughput
    if tp:
        vals = [v for v in tp["series"] if v is not None]
        spark = ""
        if vals:
            lo, hi = min(vals), max(vals)
            spark = "".join(" " if v is None else "▁▂▃▄▅▆▇█"[min(7, int((v - lo) / ((hi - lo) or 1) * 8))]
                            for v in tp["series"])
        figures = {k: "unknown" if tp[k] is None else tp[k] for k in ("median", "min", "max")}
        con.print(f"throughput ({shown(tp['unit'])}): median {figures['median']}, min {figures['min']}, "
                  f"max {figures['max']}")
        con.print(f"  {spark}")
    if rep.stragglers:
        tab = Table(title="chronic stragglers", title_justify="left")
        for c in ("rank", "node", "GPUs", "x median", "confidence"):
            tab.add_column(c)
        for s in rep.stragglers[:10]:
            tab.add_row(str(s["rank"]), shown(s["node"] or "?"), shown(",".join(s["gpus"]), LINE_MAX),
                        f"{s['score']:.2f}",
                        f"{s['confidence']:.2f}")
        con.print(tab)
    check = rep.straggler_check
    if check and not check["judged"]:
        con.print(f"stragglers: not judged: {check['steps']} steps, {check['seconds']:g} s of them (a verdict "
                  f"needs {check['min_steps']} steps and {check['min_seconds']:g} s; --min-straggler-steps, "
                  "--min-straggler-s)")
    if rep.one_off_stalls:
        con.print(f"one-off stalls: {len(rep.one_off_stalls)} (worst: rank {rep.one_off_stalls[0]['rank']} "
                  f"step {rep.one_off_stalls[0]['step']}, {rep.one_off_stalls[0]['ratio']:.1f}x)")
    for s in rep.stalls[:10]:
        con.print(f"stall: +{s['start_s']:.0f} s to +{s['end_s']:.0f} s, step rate {s['ratio'] * 100:.0f}% of median")
    if rep.missing_ranks:
        con.print(f"missing ranks: {rep.missing_ranks}")
    for r, why in rep.damaged_ranks.items():
        con.print(f"damaged rank {r}: {shown(why, LINE_MAX)}")
    if rep.findings:
        con.print("[bold]findings[/]")
        for i, f in enumerate(rep.findings, 1):
            con.print(f" {i}. {shown(f.message, LINE_MAX)}\n    [cyan]→ {shown(f.advice, LINE_MAX)}[/]",
                      highlight=False)
    elif rep.unjudged:
        con.print(f"no findings, and no lost ranks; not judged: {shown('; '.join(rep.unjudged), LINE_MAX)}",
                  highlight=False)
    else:
        con.print("no findings: no stragglers, stalls or lost ranks")
    if rep.findings and rep.unjudged:
        con.print(f"not judged: {shown('; '.join(rep.unjudged), LINE_MAX)}", highlight=False)
    con.print(f"HTML report: {html_path}")
