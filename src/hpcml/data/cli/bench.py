"""``hpcml data bench``: parse arguments, call ``hpcml.data.loadbench``, render. No logic here."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Optional

import typer

from hpcml.cli_support import parse_size, show
from hpcml.errors import UsageError
from hpcml.units import fmt_bytes


def _list(value: str, option: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items:
        raise UsageError(f"expected a comma-separated list, found {value!r}", key=option)
    return items


def _workers(value: str) -> list[int]:
    out = []
    for item in _list(value, "--workers"):
        if not item.isdigit() or int(item) < 1:
            raise UsageError(f"expected worker counts of at least 1 such as '1,4', found {value!r}", key="--workers")
        out.append(int(item))
    return out


def _limit(value: Optional[str]) -> tuple[Optional[int], Optional[int]]:
    """A bare number is samples; a number with a unit is bytes of payload."""
    if value is None:
        return None, None
    if value.strip().isdigit():
        if int(value) < 1:
            raise UsageError(f"must be positive, found {value!r}", key="--limit")
        return int(value), None
    return None, parse_size(value, "--limit")


def _want_progress() -> bool:
    return sys.stderr.isatty()


def bench(
    target: str = typer.Argument(..., help="A shard set (directory with manifest.json, or s3://bucket/prefix), a directory of files, "
                                  "or the mount point of a squashfs image."),
    kind: str = typer.Option("auto", "--kind", help="auto, shards (read with ShardDataset) or files (one file = one sample)."),
    order: str = typer.Option("sequential,shuffled", "--order", help="Passes to run: sequential, shuffled or both."),
    workers: str = typer.Option("1", "--workers", "-w", help="Loader worker processes; a list runs each, e.g. 1,4."),
    limit: Optional[str] = typer.Option(None, "--limit", help="Per pass: samples (5000) or payload bytes ('2 GB'); "
                                        "default the whole dataset."),
    seed: int = typer.Option(0, "--seed", help="Seed of the shuffled order."),
    warm: bool = typer.Option(False, "--warm", help="Do not evict the files from the page cache before each pass."),
    drop: bool = typer.Option(False, "--drop-caches", help="Also sync and drop the kernel's caches before each pass (root)."),
    ceiling_size: str = typer.Option("1 GiB", "--ceiling-size", help="Bytes read (at most) for the ceiling."),
    ceiling_dir: Optional[Path] = typer.Option(None, "--ceiling-dir", help="For a directory of files: write the "
                                               "ceiling's temporary file here (same storage; never the dataset's own directory unasked)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON instead of the table."),
) -> None:
    """Measure loader throughput on TARGET next to the ceiling of the same storage.

    Each pass reads the dataset the way DataLoader workers would (forked
    processes; for a shard set, ShardDataset's large block reads; for a
    directory, open/read/close per file) and reports samples/s, MB/s of
    payload, read calls and mean read size. The ceiling is the same storage
    read with 16 MiB sequential reads in the same run: the shards, a temporary
    file written in --ceiling-dir (deleted after), the squashfs image, or the
    largest files. Nothing is written into the dataset's directory. Files are
    evicted from the page cache before each pass (posix_fadvise), unless --warm.

        hpcml data bench /scratch/$USER/shards          # both orders, 1 worker
        hpcml data bench /scratch/$USER/raw -w 1,8 --limit 20000
        hpcml data bench /mnt/imagenet-sqsh --order shuffled --json > bench.json

    Exit codes: 0 measured, 2 bad input (missing or empty target, unreadable
    manifest, corrupt shard), 1 a loader worker failed.
    """
    from hpcml.data.loadbench import bench as run_bench
    orders = _list(order, "--order")
    counts = _workers(workers)
    n, nbytes = _limit(limit)
    cap = parse_size(ceiling_size, "--ceiling-size")
    if warm and drop:
        raise UsageError("--warm and --drop-caches contradict each other", key="--drop-caches")
    cache = "warm" if warm else "drop" if drop else "cold"
    kw: dict[str, Any] = dict(kind=kind, orders=orders, workers=counts, limit=n, limit_bytes=nbytes, seed=seed,
              cache=cache, ceiling_bytes=cap, ceiling_dir=ceiling_dir)
    if _want_progress():
        result = _with_progress(run_bench, target, kw)
    else:
        result = run_bench(target, **kw)
    show(result, as_json, _render)


def _with_progress(run_bench, target: str, kw: dict):
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )
    # No refresh thread: the passes fork worker processes, and forking while another
    # thread holds the console's lock could leave a worker stuck on it.
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("samples"),
                   TimeElapsedColumn(), console=Console(stderr=True), transient=True, auto_refresh=False)
    task = bar.add_task("ceiling", total=None)
    last = [0.0]

    def on_stage(label: str, total: Optional[int]) -> None:
        bar.reset(task, total=total, description=label)
        bar.refresh()

    def on_progress(n: int) -> None:
        bar.advance(task, n)
        if time.monotonic() - last[0] > 0.1:
            last[0] = time.monotonic()
            bar.refresh()
    with bar:
        return run_bench(target, on_stage=on_stage, on_progress=on_progress, **kw)


def _render(r) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from hpcml.words import LINE_MAX, shown
    what = "shard set" if r.kind == "shards" else "files"
    target = shown(r.target, LINE_MAX)
    t = Table(box=box.SIMPLE_HEAD, title=f"{target}: {what} on {shown(r.mount.fstype)}, {r.samples:,} samples, "
                    f"{fmt_bytes(r.bytes)} ({r.passes[0].samples:,} per pass)" if r.passes else target,
              caption="\n".join(shown(n, LINE_MAX) for n in r.notes), caption_justify="left")
    for col in ("pass", "workers", "samples/s", "MB/s", "read size", "reads", "% ceiling"):
        t.add_column(col, justify="left" if col == "pass" else "right", no_wrap=True)
    for p in r.passes:
        pct = f"{p.pct_of_ceiling:.0f}%" if p.pct_of_ceiling is not None else "-"
        t.add_row(p.order, str(p.workers), f"{p.samples_per_s:,.0f}", f"{p.mb_per_s:,.1f}",
                  fmt_bytes(p.mean_read), f"{p.reads:,}", pct)
    c = r.ceiling
    t.add_row("ceiling", f"{c.threads} thr.", "", f"{c.mb_per_s:,.1f}",
              fmt_bytes(c.bytes / c.reads if c.reads else 0), f"{c.reads:,}", "100%", style="bold")
    Console().print(t)
