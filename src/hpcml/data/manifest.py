"""The on-disk description of a packed dataset: ``manifest.json`` plus one index per shard.

A shard set is a directory::

    manifest.json            schema tag, dataset id, shards with size, sha256 and sample count
    shard-000000.tar         WebDataset tar: the files of a sample are adjacent members
    shard-000000.idx.json    per sample: key, byte span in the tar, and each member's data

``hpcml data index`` writes the same manifest and indexes for WebDataset shards made
elsewhere (``hpcml.data.wdsindex``): their tars stay where they are, named by absolute path
when the index lies elsewhere, and a compressed one says so (``compression``).

The dataset id is a hash of the shards' checksums, so two packs of the same files into the
same shards have the same id and any change of content changes it; a reader's resume state
carries it so that a state from another dataset is refused.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hpcml import objstore
from hpcml.data import index as shard_index
from hpcml.data.index import BLOCK, SHARD_SUFFIXES
from hpcml.errors import UsageError
from hpcml.files import JSON_MAX, load_json_bounded, read_json, write_atomic
from hpcml.schemas import check, tag

SCHEMA = tag("data.manifest", 1)
LEGACY_FORMAT = "hpcml-shards"   # before tags: "format": "hpcml-shards" and an integer "version"
MANIFEST = "manifest.json"


#: more samples than any shard set holds (100 billion; LAION-5B has 5.85 billion): a count beyond is a damaged or forged
#: manifest, refused before a plan of that many samples is built
MAX_SAMPLES = 10**11


class ShardEntry(BaseModel):
    name: str                 # the tar: a file name beside the manifest, or an absolute path
    #: file name of its index, beside the manifest: a plain name, never a path (every reader
    #: opens it there: the stage, the loader, an object store's prefix)
    index: str = Field(pattern=r"^[^./\x00][^/\x00]*$")
    bytes: int = Field(ge=0)
    sha256: str
    samples: int = Field(ge=0, le=MAX_SAMPLES)
    compression: str = ""     # gzip, bz2 or xz: a shard indexed as it was found (hpcml data index)


class Manifest(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    tag: str = Field(default=SCHEMA, alias="schema")   # first key of the file
    #: id (see dataset_id()): the directory it is staged in, so a plain name, never a path
    dataset: str = Field(default="", pattern=r"^([A-Za-z0-9][A-Za-z0-9._-]{0,127})?$")
    source: str = ""
    created: str = ""
    target_shard_bytes: int = Field(default=0, ge=0)
    samples: int = Field(default=0, ge=0, le=MAX_SAMPLES)
    bytes: int = Field(default=0, ge=0)
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


def manifest_path(path: str | os.PathLike) -> Path:
    """A shard-set directory or its manifest file, as the manifest's path."""
    p = Path(path)
    return p / MANIFEST if p.is_dir() else p


def load_manifest(path: str | os.PathLike) -> Manifest:
    """Read and validate a manifest; any problem is a one-line UsageError naming the file.
    ``s3://bucket/prefix``: its ``manifest.json`` object (``hpcml.objstore``)."""
    if objstore.is_url(path):
        url = objstore.S3Url.parse(str(path))
        where = objstore.url_of(url.bucket, url.key(MANIFEST))
        data = objstore.read_object(objstore.client(), url.bucket, url.key(MANIFEST), JSON_MAX)
        try:
            raw = _from_legacy(orjson.loads(data))
        except ValueError as exc:
            raise UsageError(f"not JSON ({exc})", file=where) from None
        return _validated(raw, where)
    p = manifest_path(path)
    raw = _from_legacy(read_json(p, None, missing=_missing(p), loads=orjson.loads))
    return _validated(raw, str(p))


def _validated(raw: Any, p: str) -> Manifest:
    check(raw, SCHEMA, str(p))
    try:
        manifest = Manifest.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(x) for x in err["loc"])
        raise UsageError(f"{err['msg']} (found {err.get('input')!r})", file=str(p), key=key) from None
    bad = capacity_problem(manifest)
    if bad is not None:
        raise UsageError(bad[1], file=str(p), key=bad[0])
    return manifest


def capacity_problem(manifest: Manifest) -> tuple[str, str] | None:
    """The key and the problem where the manifest counts more samples than its shards can
    hold, or None. Every sample of a tar begins with a 512-byte header, so a shard of B bytes
    holds at most B / 512 (a compressed one: its decompressed tar, at most
    ``index.MAX_INFLATED_BYTES``); and all shards together at most ``MAX_SAMPLES`` (the cap
    of one shard's count alone let a thousand shards count 10**14). The reader plans its
    order from these counts before it reads an index: a count no shard can hold is refused
    here, one that differs from its index when that index is loaded."""
    total = 0
    for i, s in enumerate(manifest.shards):
        room = shard_index.MAX_INFLATED_BYTES if s.compression else s.bytes
        if s.samples > room // BLOCK:
            what = "a compressed shard's tar may hold" if s.compression else "its bytes can hold"
            return f"shards.{i}.samples", (f"{s.samples:,} samples, more than the {room // BLOCK:,} that {what} "
                                           f"({room:,} bytes, each sample at least a {BLOCK}-byte tar header)")
        total += s.samples
    if total > MAX_SAMPLES:
        return "shards", f"its shards count {total:,} samples, more than the {MAX_SAMPLES:,} any shard set holds"
    return None


def is_shard_name(name: str) -> bool:
    return name.lower().endswith(SHARD_SUFFIXES)


def hint(directory: Path) -> str | None:
    """What to say about a directory without a manifest: WebDataset shards to index, an
    MDS dataset hpcml does not read, or None."""
    try:
        names = [e.name for e in os.scandir(directory)]
    except OSError:
        return None
    if any(is_shard_name(n) for n in names):
        return (f"WebDataset shards without an index: run 'hpcml data index {directory}' (add --out DIR "
                "when this directory is read-only); the shards are read as they are")
    if "index.json" in names and (any(".mds" in n for n in names) or _mds_index(directory / "index.json")):
        return "a MosaicML streaming (MDS) dataset: hpcml reads WebDataset tar shards, not MDS"
    return None


def _mds_index(path: Path) -> bool:
    try:
        doc = load_json_bounded(path, JSON_MAX)
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and isinstance(doc.get("shards"), list) and any(
        isinstance(s, dict) and s.get("format") == "mds" for s in doc["shards"])


def _missing(p: Path) -> str:
    """The words for a directory without a manifest: WebDataset shards say how to index them."""
    found = hint(p.parent) if p.name == MANIFEST else None
    return f"no manifest here: {found}" if found else \
        "no manifest here: not a shard set made by 'hpcml data pack' or indexed by 'hpcml data index'"


def _from_legacy(raw):
    """A manifest packed before tags, as tagged: its version becomes the major, so that
    version 1 is read (datasets packed then are on disk) and any other is refused."""
    if isinstance(raw, dict) and "schema" not in raw and raw.get("format") == LEGACY_FORMAT:
        rest = {k: v for k, v in raw.items() if k not in ("format", "version")}
        return {"schema": f"hpcml.data.manifest/{raw.get('version')}", **rest}
    return raw


def manifest_bytes(manifest: Manifest) -> bytes:
    """The manifest as its file (or object) holds it."""
    return orjson.dumps(manifest.model_dump(by_alias=True), option=orjson.OPT_INDENT_2)


def write_manifest(manifest: Manifest, directory: str | Path) -> Path:
    out = Path(directory) / MANIFEST
    write_atomic(out, manifest_bytes(manifest).decode())
    return out
