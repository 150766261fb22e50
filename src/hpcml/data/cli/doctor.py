"""``hpcml data doctor``: parse arguments, call the engine in ``doctor``, render. No logic here."""

from __future__ import annotations

from pathlib import Path

import typer

from hpcml.cli_support import parse_size, show

SHOWN_UNREADABLE = 20
SHOWN_UNGROUPABLE = 10


def doctor(
    path: str = typer.Argument(..., help="The dataset directory (scanned recursively), or s3://bucket/prefix "
                               "(its objects listed: object storage, the standard AWS setup)."),
    as_json: bool = typer.Option(False, "--json", help="Print the JSON report instead of tables."),
    ram: str | None = typer.Option(None, "--ram", help="Free RAM to plan with, e.g. '64 GB' (default: detected)."),
    local_disk: Path | None = typer.Option(None, "--local-disk", help="Node-local staging directory "
                                              "(default: $SLURM_TMPDIR, else $TMPDIR, else /tmp)."),
    local_free: str | None = typer.Option(None, "--local-free", help="Free space on the local disk, e.g. '800 GB' (default: detected)."),
    readers: int | None = typer.Option(None, "--readers", min=1, help="Parallel readers: ranks x loader workers, "
                                          "for the shard count (default: the cores this process may use)."),
    tasks: int = typer.Option(1, "--tasks", min=1, help="Tasks on the node that each stage their own copy."),
    jobs: int = typer.Option(16, "--jobs", "-j", min=1, help="Scanning threads (more helps on a parallel filesystem)."),
    read_size: str = typer.Option("1 MiB", "--read-size", help="A loader's read size, for the operations per epoch."),
) -> None:
    """Scan a dataset directory; say whether to pack it, in which shards, where to stage it.

    Counts files, sizes (histogram, percentiles), WebDataset samples and the
    metadata operations of one epoch, then recommends from this node's free
    RAM and local disk (override them to plan for another node).
    Unreadable entries (permissions, dangling symlinks, special files) are
    all listed, never dropped; they do not change the exit code.

        hpcml data doctor /scratch/$USER/imagenet/train
        hpcml data doctor data/ --ram "256 GB" --local-free "1.5 TB"
        hpcml data doctor data/ --readers 32 --json > doctor.json
        hpcml data doctor s3://datasets/laion/shards     # S3-compatible object storage

    Exit codes: 0 scanned (even with unreadable entries), 2 bad input.
    """
    from hpcml.data.doctor import detect_resources, diagnose
    if readers is None:
        import os
        readers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    res = detect_resources(ram_free=parse_size(ram, "--ram", minimum=0),
                           local_dir=str(local_disk) if local_disk else None,
                           local_free=parse_size(local_free, "--local-free", minimum=0), tasks=tasks)
    rsize = parse_size(read_size, "--read-size", minimum=0)
    from hpcml import progress
    with progress.on_terminal(progress.wanted(as_json)):
        report = diagnose(path, res, readers=readers, read_size=rsize, jobs=jobs,
                          on_progress=lambda n, b: progress.advance(f"scanning {path}: files", n, None))
    show(report, as_json, _render)


def _render(report) -> None:
    from rich.console import Console
    from rich.table import Table

    from hpcml.data.doctor import fmt_size, token_arrays
    from hpcml.units import fmt_bytes
    from hpcml.words import LINE_MAX, shown
    s, rec, ops, con = report.scan, report.recommendation, report.ops, Console()

    t = Table(title=f"Dataset {shown(s.root, LINE_MAX)}", show_header=False)
    t.add_row("files", f"{s.files:,} in {s.directories:,} directories, {fmt_bytes(s.bytes)}")
    if s.files:
        p = s.sizes.percentiles
        t.add_row("file size", f"min {fmt_bytes(s.sizes.min)}, mean {fmt_bytes(s.sizes.mean)}, "
                  f"max {fmt_bytes(s.sizes.max)}")
        t.add_row("percentiles", ", ".join(f"{k} {fmt_bytes(v)}" for k, v in p.items()))
    if token_arrays(s):
        t.add_row("layout", f"{s.token_arrays:,} memmapped token arrays, {fmt_bytes(s.token_array_bytes)}: "
                  + ", ".join(s.token_array_names))
    else:
        t.add_row("samples", f"{s.samples:,} (WebDataset keys), largest {fmt_bytes(s.largest_sample_bytes)}")
    t.add_row("readers", f"{report.readers:,} (ranks x loader workers; --readers)")
    if s.shards:
        comp = f", {s.compressed_shards:,} compressed" if s.compressed_shards else ""
        t.add_row("shards", f"{s.shards:,} WebDataset tar shards{comp}, {fmt_bytes(s.shard_bytes)}; "
                  f"{'indexed (manifest.json)' if s.indexed else 'no index yet (hpcml data index)'}")
    if s.mds_files:
        t.add_row("MDS", f"{s.mds_files:,} MosaicML streaming shards (hpcml does not read MDS)")
    t.add_row("extensions", ", ".join(f"{shown(e) if e else '(none)'} {n:,}" for e, n in s.extensions) or "-")
    t.add_row("scan", f"{s.seconds:.2f} s, {s.files_per_s:,.0f} files/s, {s.jobs} threads")
    con.print(t)

    if s.sizes.histogram:
        peak = max(b.files for b in s.sizes.histogram)
        con.print("[bold]Size histogram[/]")
        for b in s.sizes.histogram:
            label = "0 B" if b.high == 1 else f"{fmt_size(b.low)} - {fmt_size(b.high)}"
            bar = "#" * (round(40 * b.files / peak) if b.files else 0)
            con.print(f"  {label:>20} {b.files:>10,} {bar}", highlight=False, markup=False)

    o = Table(title=f"Operations per epoch (reads of {fmt_size(ops.read_size)})")
    for col in ("layout", "opened", "metadata ops", "reads"):
        o.add_column(col, justify="right" if col != "layout" else "left")
    o.add_row("loose files", f"{ops.loose.units:,} files", f"{ops.loose.metadata_ops:,}", f"{ops.loose.read_ops:,}")
    o.add_row(f"shards of {fmt_bytes(rec.shard_bytes)}", f"{ops.packed.units:,} shard{'s' if ops.packed.units != 1 else ''}",
              f"{ops.packed.metadata_ops:,}", f"{ops.packed.read_ops:,}")
    con.print(o)

    con.print("[bold]Recommendation[/]")
    con.print(f"  pack: [bold]{'yes' if rec.pack else 'no'}[/] - {shown(rec.pack_reason, LINE_MAX)}")
    if rec.pack:
        plural = "s" if rec.shards != 1 else ""
        con.print(f"  shard size: [bold]{fmt_bytes(rec.shard_bytes)}[/] (~{rec.shards:,} shard{plural}) - "
                  f"{shown(rec.shard_reason, LINE_MAX)}")
    con.print(f"  placement: [bold]{rec.placement}[/] ({shown(rec.target, LINE_MAX)}) - "
              f"{shown(rec.placement_reason, LINE_MAX)}")
    for note in rec.notes:
        con.print(f"  [yellow]note:[/] {shown(note, LINE_MAX)}")

    if s.ungroupable_count:
        con.print(f"[yellow]{s.ungroupable_count:,} file(s) WebDataset cannot group[/] "
                  "(no extension, or a dot-file):")
        for p in s.ungroupable[:SHOWN_UNGROUPABLE]:
            con.print(f"  {p}", highlight=False, markup=False)
        if s.ungroupable_count > SHOWN_UNGROUPABLE:
            con.print(f"  ... and {s.ungroupable_count - SHOWN_UNGROUPABLE:,} more (--json lists "
                      f"{len(s.ungroupable):,})")
    if s.unreadable:
        con.print(f"[bold red]{len(s.unreadable):,} unreadable entr{'y' if len(s.unreadable) == 1 else 'ies'}[/] "
                  "(not counted above):")
        for u in s.unreadable[:SHOWN_UNREADABLE]:
            con.print(f"  {u.path}: {u.reason}", highlight=False, markup=False)
        if len(s.unreadable) > SHOWN_UNREADABLE:
            con.print(f"  ... and {len(s.unreadable) - SHOWN_UNREADABLE:,} more (--json lists all)")
