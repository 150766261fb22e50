"""``hpcml data stage``: parse arguments, pick where to stage (every node through srun, or
this node), render. The last line of stdout is the directory the job should read."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Optional

import typer

from hpcml.cli_support import parse_size
from hpcml.errors import SlurmError, UsageError

COMMAND = "hpcml data stage"


def stage(
    src: Optional[str] = typer.Argument(None, help="A shard set made by `hpcml data pack` or indexed by `hpcml data "
                                         "index` (its directory or manifest.json), or a directory of memmapped token "
                                         "arrays (nanoGPT's train.bin, Megatron's .bin/.idx, HF Arrow files); s3://bucket/prefix for a "
                                         "shard set in object storage."),
    to: Optional[str] = typer.Option(None, "--to", help="Node-local directory (default: where hpcml data doctor "
                                     "advises: /dev/shm/hpcml-data-$SLURM_JOB_ID when it fits in RAM, else "
                                     "$SLURM_TMPDIR or /tmp/hpcml-data-$SLURM_JOB_ID). $VARS are expanded on "
                                     "each node; %n is the node name, %j the job id. The copy goes to "
                                     "DIR/<dataset id>."),
    verify: bool = typer.Option(False, "--verify", help="Re-hash files already staged instead of trusting the stamp."),
    threads: int = typer.Option(4, "--threads", "-j", min=1, help="Files copied in parallel on each node."),
    keep_free: Optional[str] = typer.Option(None, "--keep-free", help="Space to leave free on the target, e.g. "
                                            "'10 GB' (default: 5 % of it or 1 GiB, whichever is smaller)."),
    local: bool = typer.Option(False, "--local", help="Stage on this node only, without srun."),
    as_json: bool = typer.Option(False, "--json", help="Print the per-node report as JSON instead of the path."),
    cleanup: bool = typer.Option(False, "--cleanup", help="Remove this job's default copies (RAM and local disk) "
                                 "on every node of the job, instead of staging: the batch script's last line, "
                                 "or a Slurm epilog (with --local --job $SLURM_JOB_ID)."),
    job: Optional[str] = typer.Option(None, "--job", help="With --cleanup: the job whose copies to remove "
                                      "(default: $SLURM_JOB_ID)."),
) -> None:
    """Copy a shard set or token arrays once per node to node-local storage, checksummed.

    A shard set is verified against its manifest. A directory of memmapped token arrays
    (what hpcml data doctor calls one: nanoGPT's train.bin/val.bin, Megatron's indexed
    datasets, Arrow files) is copied as it is, each file hashed as it is read and checked
    unchanged afterwards; the training script reads the copy with its own paths.

    From the batch script it starts one task per node (srun); inside a step
    (`srun hpcml data stage ...`) one task per node copies and the others wait for it.
    Files already staged and valid are skipped. When the copy does not fit, or the
    target cannot be created, nothing is copied and the job streams from SRC.

        DATA=$(hpcml data stage /scratch/$USER/shards)
        srun python train.py --data "$DATA"
        hpcml data stage --cleanup          # this job's copies, on every node

    Without --to the copy goes where hpcml data doctor advises (RAM when it fits, else
    node-local disk, else it streams) and is named by job: --cleanup removes it (Slurm
    itself removes only $SLURM_TMPDIR). A --to of your own is a cache that later jobs reuse.

    The last line of stdout is the directory to read (the copy, or SRC);
    progress and the per-node summary go to stderr.

    Exit codes: 0 staged or streaming from SRC, 2 bad input (no manifest, missing
    shard, checksum mismatch: the file is named and its copy deleted), 1 Slurm or
    write failure.
    """
    from hpcml.cluster import slurm
    from hpcml.cluster.allocation import current
    from hpcml.data import stage_worker
    t0 = time.monotonic()
    keep = parse_size(keep_free, "--keep-free", minimum=0)
    alloc = current()
    on_nodes = not local and alloc.under_slurm and alloc.step_id is None
    if on_nodes and not slurm.available("srun"):
        raise SlurmError("srun: Slurm is not installed or not on PATH (use --local to stage this node only)")
    if cleanup:
        return _cleanup(job, list(alloc.nodes) if on_nodes else None)
    if src is None:
        raise UsageError("give the shard set to stage (or --cleanup)", key="SRC")
    if on_nodes and not to:                # one placement for every node: the tasks read one path
        from hpcml.data.stage import advise, source_bytes, source_of
        advice = advise(source_bytes(src))
        if advice.to is None:
            out = stage_worker.combine(source_of(src), {})
            out.notes.append(f"not staged, as hpcml data doctor advises: {advice.reason}")
        else:
            out = _on_nodes(src, advice.to, list(alloc.nodes), threads, verify, keep, not as_json)
            out.notes.insert(0, f"placed as hpcml data doctor advises: {advice.reason}")
    elif on_nodes:
        out = _on_nodes(src, to, list(alloc.nodes), threads, verify, keep, not as_json)
    else:
        r = _here(src, to, threads, verify, keep, not as_json)
        out = stage_worker.combine(r.src, {r.node: r}, time.monotonic() - t0)
    if as_json:
        print(json.dumps(out.to_dict(), indent=2))
        return
    _summary(out, None if to else alloc.job_id or "")
    print(out.path)


def _cleanup(job: Optional[str], nodes: Optional[list[str]]) -> None:
    """This node's copies, or (from the batch script) every node's through one srun step."""
    import os
    import subprocess

    from hpcml.cluster import slurm
    from hpcml.data.stage import cleanup
    if nodes is None:
        env = {**os.environ, "SLURM_JOB_ID": job} if job else os.environ
        for path in cleanup(env):
            print(f"{COMMAND}: removed {path}", file=sys.stderr)
        return
    argv = slurm.srun_argv([sys.executable, "-m", "hpcml", "data", "stage", "--cleanup", "--local",
                            *(["--job", job] if job else [])], nodes=nodes, ntasks_per_node=1,
                           extra=["--overlap", "--mpi=none", "--job-name=hpcml-stage-cleanup"])
    p = subprocess.run(argv, stdin=subprocess.DEVNULL, timeout=300)
    if p.returncode:
        raise SlurmError(f"srun: the cleanup step failed (exit {p.returncode})")


def _here(src: str, to: Optional[str], threads: int, verify: bool, keep: Optional[int], show: bool):
    from hpcml.cli_support import progress_bar
    from hpcml.data.stage import stage as stage_engine
    bar = progress_bar(show)
    if bar is None:
        return stage_engine(src, to, threads=threads, verify=verify, keep_free=keep)
    with bar:
        task = bar.add_task("staging", total=None)
        return stage_engine(src, to, threads=threads, verify=verify, keep_free=keep,
                            on_plan=lambda total: bar.update(task, total=total),
                            advance=lambda n: bar.advance(task, n))


def _on_nodes(src: str, to: Optional[str], nodes: list[str], threads: int, verify: bool,
              keep: Optional[int], show: bool):
    from hpcml.cli_support import progress_bar
    from hpcml.data.stage_worker import stage_nodes
    bar = progress_bar(show)
    if bar is None:
        return stage_nodes(src, to, nodes, threads=threads, verify=verify, keep_free=keep)
    seen: dict[str, tuple[int, int]] = {}

    def on_progress(node: str, done: int, total: int) -> None:
        seen[node] = (done, total)
        bar.update(task, completed=sum(d for d, _ in seen.values()), total=sum(t for _, t in seen.values()))
    with bar:
        task = bar.add_task(f"staging on {len(nodes)} nodes", total=None)
        return stage_nodes(src, to, nodes, threads=threads, verify=verify, keep_free=keep,
                           on_progress=on_progress)


def _summary(out, job: str | None = None) -> None:
    """``job``: the copy is a default one of this job ("" without one), to be cleaned up."""
    from hpcml.units import fmt_bytes
    err = sys.stderr
    for node, r in out.results.items():
        if getattr(r, "note", ""):
            print(f"{COMMAND}: {node}: note: {r.note}", file=err)
        if not r.staged:
            print(f"{COMMAND}: {node}: not staged, {r.reason}; the job streams from {out.src}", file=err)
            continue
        verified = f" ({r.files_verified} verified in place)" if r.files_verified else ""
        waited = f", waited {r.waited:.1f} s for another task" if r.waited >= 0.5 else ""
        if r.files_copied:
            did = (f"{r.files_copied} files copied ({fmt_bytes(r.bytes_copied)}), {r.files_skipped} skipped"
                   f"{verified} in {r.seconds:.2f} s, {r.mb_per_s:.0f} MB/s")
        else:
            did = f"up to date, {r.files_skipped} files skipped{verified} in {r.seconds:.2f} s"
        print(f"{COMMAND}: {node}: {did}{waited} -> {r.path}", file=err)
    if len(out.results) > 1 and out.staged:
        total = sum(r.bytes_copied for r in out.results.values())
        rate = total / out.seconds / 1e6 if out.seconds else 0.0
        print(f"{COMMAND}: {len(out.results)} nodes, {fmt_bytes(total)} copied in {out.seconds:.2f} s "
              f"({rate:.0f} MB/s together)", file=err)
    for note in out.notes:
        print(f"{COMMAND}: note: {note}", file=err)
    if job is not None and out.staged and not _under_slurm_tmpdir(out.path):
        print(f"{COMMAND}: note: {out.path} stays until 'hpcml data stage --cleanup'" + (
              ": end the batch script with it, or let an epilog run 'hpcml data stage --cleanup --local "
              "--job $SLURM_JOB_ID'" if job else ""), file=err)


def _under_slurm_tmpdir(path: str) -> bool:
    """Slurm removes $SLURM_TMPDIR (job_container/tmpfs) at the job's end by itself."""
    import os
    tmp = os.environ.get("SLURM_TMPDIR")
    return bool(tmp) and Path(path).absolute().is_relative_to(Path(str(tmp)).absolute())

