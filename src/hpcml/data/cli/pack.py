"""``hpcml data pack``: parse arguments, call the packer (tar shards) or mksquashfs, render."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from hpcml.cli_support import parse_size, progress_bar
from hpcml.errors import UsageError
from hpcml.units import fmt_bytes


def pack_command(
    src: Path = typer.Argument(..., help="Directory of files (samples grouped by basename, WebDataset's rule)."),
    dst: Path = typer.Argument(..., help="Output directory of shards (or the image file with --format squashfs)."),
    shard_size: str = typer.Option("256 MB", "--shard-size", help="Target shard size."),
    fmt: str = typer.Option("tar", "--format", help="tar (WebDataset shards + index + manifest) or squashfs."),
    jobs: int = typer.Option(8, "--jobs", "-j", min=1, help="Shards written in parallel."),
    skip_unreadable: bool = typer.Option(False, "--skip-unreadable",
                                         help="Pack the rest and list unreadable files in the manifest."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a dataset packed into DST from another source."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Pack SRC into DST: WebDataset tar shards of --shard-size, an index per shard, a manifest with checksums.

        hpcml data pack /scratch/raw /scratch/shards                  # 256 MB shards
        hpcml data pack raw/ shards/ --shard-size 64MB -j 16          # rerun resumes
        hpcml data pack raw/ raw.sqsh --format squashfs               # one image (mksquashfs)

    A rerun keeps finished shards. Unreadable files stop the pack and are listed (exit 2).
    DST holding a dataset packed from another source is refused (exit 2) unless --overwrite.
    """
    if fmt == "squashfs":
        _pack_squashfs(src, dst, jobs, skip_unreadable, as_json)
        return
    if fmt != "tar":
        raise UsageError(f"unknown format {fmt!r}: tar or squashfs", key="--format")
    _pack_tar(src, dst, parse_size(shard_size, "--shard-size"), jobs, skip_unreadable, as_json, overwrite)


def _pack_tar(src: Path, dst: Path, target: int, jobs: int, skip_unreadable: bool, as_json: bool,
              overwrite: bool = False) -> None:
    from hpcml.data.pack import pack
    bar = progress_bar(not as_json)
    task = None

    def on_plan(total: int, done: int) -> None:
        nonlocal task
        if bar:
            task = bar.add_task("packing", total=total, completed=done)

    def advance(n: int) -> None:
        if bar and task is not None:
            bar.advance(task, n)
    if bar:
        with bar:
            r = pack(src, dst, target_bytes=target, jobs=jobs, skip_unreadable=skip_unreadable,
                     on_plan=on_plan, advance=advance, overwrite=overwrite)
    else:
        r = pack(src, dst, target_bytes=target, jobs=jobs, skip_unreadable=skip_unreadable, overwrite=overwrite)
    m = r.manifest
    if as_json:
        print(json.dumps({"dataset": m.dataset, "shards": len(m.shards), "samples": m.samples, "bytes": m.bytes,
                          "written": r.written, "reused": r.reused, "seconds": round(r.seconds, 3),
                          "skipped": r.skipped, "manifest": str(dst / "manifest.json")}, indent=2))
        return
    rate = r.bytes_written / r.seconds / 1e6 if r.seconds else 0.0
    print(f"{dst}: {len(m.shards)} shards, {m.samples} samples, {fmt_bytes(m.bytes)}, fields {', '.join(m.fields)}; "
          f"wrote {r.written} ({rate:.0f} MB/s), kept {r.reused} finished; dataset id {m.dataset}")
    for s in r.skipped[:20]:
        print(f"  not packed: {s['path']}: {s['reason']}")
    if len(r.skipped) > 20:
        print(f"  ... {len(r.skipped) - 20} more not packed, all listed in {dst / 'manifest.json'}")


def _pack_squashfs(src: Path, image: Path, jobs: int, skip_unreadable: bool, as_json: bool) -> None:
    from hpcml.data.squashfs import SHUFFLE_NOTE, make_image
    r = make_image(src, image, jobs=jobs, skip_unreadable=skip_unreadable)
    if as_json:
        print(json.dumps({"image": str(r.image), "bytes": r.bytes, "source_bytes": r.source_bytes,
                          "files": r.files, "seconds": round(r.seconds, 3),
                          "skipped": [{"path": p, "reason": why} for p, why in r.skipped]}, indent=2))
        return
    print(f"{r.image}: {r.files} files, {fmt_bytes(r.source_bytes)} -> {fmt_bytes(r.bytes)} in {r.seconds:.1f} s")
    for p, why in r.skipped:
        print(f"  not packed: {p}: {why}")
    print(f"note: {SHUFFLE_NOTE}")
