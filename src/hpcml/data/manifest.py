"""The on-disk description of a packed dataset: ``manifest.json`` plus one index per shard.

A shard set is a directory::

    manifest.json            format, dataset id, shards with size, sha256 and sample count
    shard-000000.tar         WebDataset tar: the files of a sample are adjacent members
    shard-000000.idx.json    per sample: key, byte span in the tar, and each member's data

The dataset id is a hash of the shards' checksums, so two packs of the same files into the
same shards have the same id and any change of content changes it; a reader's resume state
carries it so that a state from another dataset is refused.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import orjson
from pydantic import BaseModel, ValidationError

from hpcml.errors import UsageError
from hpcml.files import write_atomic

FORMAT = "hpcml-shards"
VERSION = 1
MANIFEST = "manifest.json"


class ShardEntry(BaseModel):
    name: str                 # file name of the tar, relative to the manifest's directory
    index: str                # file name of its index
    bytes: int
    sha256: str
    samples: int


class Manifest(BaseModel):
    format: str = FORMAT
    version: int = VERSION
    dataset: str = ""         # id: see dataset_id()
    source: str = ""
    created: str = ""
    target_shard_bytes: int = 0
    samples: int = 0
    bytes: int = 0
    fields: list[str] = []
    shards: list[ShardEntry] = []
    skipped: list[dict] = []  # files the pack did not take, each with its reason

    def shard_bytes(self) -> int:
        return sum(s.bytes for s in self.shards)


def dataset_id(shards: list[ShardEntry]) -> str:
    h = hashlib.sha256()
    for s in shards:
        h.update(f"{s.name}\0{s.sha256}\0{s.samples}\n".encode())
    return h.hexdigest()[:16]


def manifest_path(path: str | Path) -> Path:
    """A shard-set directory or its manifest file, as the manifest's path."""
    p = Path(path)
    return p / MANIFEST if p.is_dir() else p


def load_manifest(path: str | Path) -> Manifest:
    """Read and validate a manifest; any problem is a one-line UsageError naming the file."""
    p = manifest_path(path)
    try:
        raw = orjson.loads(p.read_bytes())
    except FileNotFoundError:
        raise UsageError("no manifest here: not a shard set made by 'hpcml data pack'", file=str(p)) from None
    except OSError as exc:
        raise UsageError(f"cannot read: {exc.strerror}", file=str(p)) from None
    except orjson.JSONDecodeError as exc:
        raise UsageError(f"not JSON: {exc}", file=str(p)) from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise UsageError(f"not an {FORMAT} manifest", file=str(p), key="format")
    if raw.get("version") != VERSION:
        raise UsageError(f"version {raw.get('version')!r} is not supported (this hpcml reads {VERSION})",
                         file=str(p), key="version")
    try:
        return Manifest.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(x) for x in err["loc"])
        raise UsageError(f"{err['msg']} (found {err.get('input')!r})", file=str(p), key=key) from None


def write_manifest(manifest: Manifest, directory: str | Path) -> Path:
    out = Path(directory) / MANIFEST
    write_atomic(out, orjson.dumps(manifest.model_dump(), option=orjson.OPT_INDENT_2).decode())
    return out
