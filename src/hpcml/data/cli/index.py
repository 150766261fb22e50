"""``hpcml data index``: parse arguments, index WebDataset shards made elsewhere, render."""

from __future__ import annotations

import json

import typer

from hpcml.units import fmt_bytes


def index_command(
    specs: list[str] = typer.Argument(..., metavar="SPEC...", help="Shards: a directory, a glob, "
                                      "webdataset's brace notation (shard-{000000..000009}.tar), files, or "
                                      "s3://bucket/prefix (S3-compatible object storage: the standard AWS setup)."),
    out: str | None = typer.Option(None, "--out", "-o", help="Where the index and manifest.json go "
                                   "(default: beside the shards; needed when their directory is read-only): a "
                                   "directory, or s3://bucket/prefix."),
    jobs: int = typer.Option(8, "--jobs", "-j", min=1, help="Shards read in parallel."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Index WebDataset shards someone else wrote, so that ShardDataset, stage and bench read them as they are.

        hpcml data index /scratch/laion/shards                         # manifest.json beside them
        hpcml data index '/data/ro/shard-{000000..000099}.tar' --out ~/idx/laion
        DATA=$(hpcml data stage ~/idx/laion)                           # stages the shards and the index

    Samples follow webdataset's rules (key: the path up to the basename's first dot; a new
    sample whenever the key changes). Each shard is read once (sha256 and tar headers) and never
    written; .tar.gz/.tgz, .tar.bz2 and .tar.xz shards are indexed in their decompressed tar.
    Exit codes: 0 indexed, 2 bad input (no shard, unreadable or not a tar, read-only without --out).
    """
    from hpcml import progress
    from hpcml.data.wdsindex import index_shards
    from hpcml.schemas import tag
    with progress.on_terminal(progress.wanted(as_json)):
        r = index_shards(specs, out, jobs=jobs)
    m = r.manifest
    if as_json:
        where = f"{r.url}/manifest.json" if r.url else str(r.out / "manifest.json")
        print(json.dumps({"schema": tag("data.index", 1), "dataset": m.dataset, "manifest": where,
                          "shards": len(m.shards), "samples": m.samples, "bytes": m.bytes, "fields": m.fields,
                          "compressed_shards": r.compressed, "skipped_members": r.skipped_members,
                          "split_keys": r.split_keys}, indent=2))
        return
    print(f"{r.url or r.out}: indexed {len(m.shards)} shards, {m.samples} samples, {fmt_bytes(m.bytes)}, "
          f"fields {', '.join(m.fields) or '-'}; dataset id {m.dataset}")
    if r.skipped_members:
        print(f"  {r.skipped_members} member(s) webdataset skips too (metadata, or no extension); "
              "listed in manifest.json")
    if r.split_keys:
        print(f"  {r.split_keys} sample(s) repeat an earlier key: their members are not adjacent, so "
              "webdataset reads them as separate samples, and so does hpcml")
    if r.compressed:
        print(f"  {r.compressed} compressed shard(s): each is read whole, decompressed from its start "
              "(decompress them once with gunzip/xz -d and index again for block reads)")
