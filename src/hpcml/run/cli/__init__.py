"""``hpcml run`` and ``hpcml report``: the front door (one module for the app).

The same shape as every component (its package's ``app``, a ``Group``), except that its
two commands sit at the top level of ``hpcml`` rather than under ``hpcml run ...``:
``hpcml.cli.TOP_LEVEL`` sends both words here, and ``hpcml.cli_app`` mounts the commands.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from hpcml.cli_support import Group
from hpcml.errors import UsageError
from hpcml.optspec import typer_command
from hpcml.run.config import Options

app = typer.Typer(cls=Group, add_completion=False, rich_markup_mode="rich")


@app.command("run", context_settings={"allow_interspersed_args": False})
@typer_command(Options)           # its parameters: the fields of Options, declared there once
def run_cmd(opts: Options) -> None:
    """Vet, launch, record and report a training job; exits with the first failing rank's code.

        sbatch -N2 --wrap "hpcml run --vet examples/vet/cpu.yaml -- python train.py"

        hpcml run --ntasks 2 -- python train.py        # outside Slurm: local tasks

    Every task gets MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK and
    LOCAL_WORLD_SIZE (torch.distributed's env:// rendezvous) and is recorded by hpcml
    observe. At the end it prints the job's report and writes JOBDIR/report.html (hpcml
    report shows it again). While it runs, a crashed rank is named at once and a hang
    (--hang-timeout) gets every rank's stack and its culprits named in the log and run.json.
    With --max-restarts the job recovers inside its allocation: the culprit's node is
    excluded (vetted again with --revet), spares replace it, and the command runs again as
    attempt 1, 2... (HPCML_RUN_ATTEMPT) in the same job directory, resuming from its last
    hpcml.ckpt checkpoint; the same fault at the same step three times in a row ends it.
    Exit codes (of the last attempt): the command's (127: it cannot start), 5 a hang stopped (--on-hang stop),
    4 vetting aborted, 2 bad input (a --dir that holds a job), 1 the job directory cannot
    be written.
    """
    from hpcml.run import fastrun
    raise typer.Exit(fastrun.execute(opts))


@app.command("report")
def report_cmd(
    job_dir: Path = typer.Argument(..., help="A job directory written by hpcml run."),
    html_out: Optional[Path] = typer.Option(None, "--html", help="HTML file (default: JOB_DIR/report.html)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON instead of text."),
    send: bool = typer.Option(False, "--send", help="Send the job's summaries that are not sent yet to the collector "
                              "(--collector or $HPCML_COLLECTOR); each is stored once however often it is sent."),
    collector: Optional[str] = typer.Option(None, "--collector", help="The collector's URL for --send."),
) -> None:
    """One report for the whole job: vetting, environment, throughput, stragglers, stalls,
    GPU saturation, how it ended, and the findings ranked with advice.

        hpcml report hpcml-run-$SLURM_JOB_ID
        hpcml report hpcml-run-$SLURM_JOB_ID --send --collector http://collector:8787

    Exit codes: 0 done, 1 --send left summaries unsent (the collector is down), 2 bad input.
    """
    import json

    from hpcml.arrowprobe import skip_pandas
    from hpcml.cli_support import write_report
    from hpcml.run.config import collector_url
    from hpcml.run.report import build, summary, to_json, write
    url = collector_url(collector)
    if send and url is None:
        raise UsageError("--send needs the collector's URL: --collector URL or $HPCML_COLLECTOR", key="--send")
    skip_pandas()                           # hpcml's own process: 0.3 s saved (hpcml.arrowprobe)
    from hpcml import progress
    with progress.on_terminal(progress.wanted(as_json)):       # a thousand ranks take seconds to read
        rep = build(job_dir)
    path = write_report(write, rep, html_out or Path(job_dir) / "report.html")
    if url is not None:              # on every report when $HPCML_COLLECTOR names one
        _send(job_dir, rep, url, strict=send)
    if as_json:
        print(json.dumps(to_json(rep), indent=2, default=str))
        return
    print("\n".join(summary(rep)))
    print(f"html: {path}")


def _send(job_dir: Path, rep: dict, url: str, strict: bool) -> None:
    """Spool this attempt's summary if it is not there (only once it has ended: a summary
    is stored once, so it must be the final one) and send every waiting one; with
    ``--send`` (``strict``) a summary left unsent is exit 1."""
    import sys

    from hpcml.run.summary import SPOOL, build, send_pending, spool
    attempt = int(rep["job"].get("attempt") or 0)
    try:
        if not (Path(job_dir) / SPOOL / f"attempt-{attempt}.json").exists() and spool(job_dir, build(job_dir, rep)) is None:
            print(f"hpcml report: attempt {attempt} is still running: its summary is sent when it ends",
                  file=sys.stderr)
    except OSError as exc:                # someone else's job directory, a file where the spool goes
        print(f"hpcml report: summary not written in {job_dir}: {exc.strerror or exc}", file=sys.stderr)
    except UsageError as exc:             # a summary no collector would take: the report stands
        print(f"hpcml report: summary not written: {exc}", file=sys.stderr)
    sent, left = send_pending(job_dir, url, timeout=30 if strict else 3)
    if strict:
        print(f"summaries: {sent} sent, {left} left unsent", file=sys.stderr)
        if left:
            raise typer.Exit(1)
