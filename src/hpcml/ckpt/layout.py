"""Where a checkpoint's files live, what makes one committed, and how each is verified.

::

    DIR/step-00000100/             committed: renamed into place, complete on every rank
        manifest.json              hpcml.ckpt/1: step, world size, every rank's shard + checksums
        rank-00000.bin             the rank's tensors and arrays, 4 KiB aligned, never pickled
        rank-00000.json            hpcml.ckpt.shard/1: the state's structure, entry offsets, crc32
    DIR/.partial-step-00000100/    being written; never read by ``load_latest``

A checkpoint is visible only through the one ``rename`` of its partial directory, done by
the committing rank after every rank's shard was written, fsynced and renamed into the
partial directory under its own name, and the manifest fsynced: a reader sees all of it or
nothing. Each shard says which save attempt wrote it (``token``), so a shard left behind by
a crashed attempt at the same step is never taken for this attempt's.
"""

from __future__ import annotations

import json
import os
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcml import schemas
from hpcml.errors import UsageError

MANIFEST = "manifest.json"
TAG = schemas.tag("ckpt", 1)
SHARD_TAG = schemas.tag("ckpt.shard", 1)
_STEP = re.compile(r"^step-(\d{8,})$")
_PARTIAL = re.compile(r"^\.partial-step-(\d{8,})$")
CRC_CHUNK = 16 << 20


def step_name(step: int) -> str:
    return f"step-{step:08d}"


def partial_name(step: int) -> str:
    return f".partial-{step_name(step)}"


def shard_names(rank: int) -> tuple[str, str]:
    return f"rank-{rank:05d}.bin", f"rank-{rank:05d}.json"


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_durably(path: Path, doc: dict[str, Any]) -> None:
    """Write under a temporary name, fsync, rename, fsync the directory."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(doc, fh, separators=(",", ":"))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def read_json(path: Path, tag: str) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError("missing", file=str(path)) from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"unreadable ({exc})", file=str(path)) from None
    schemas.check(doc, tag, str(path))
    return doc


def file_crc(path: Path) -> int:
    crc = 0
    with open(path, "rb", buffering=0) as fh:
        while chunk := fh.read(CRC_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


@dataclass
class Found:
    """One checkpoint directory as found on disk."""

    step: int
    path: Path
    committed: bool
    manifest: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def size(self) -> int:
        if not self.manifest:
            return 0
        return sum(r["size"] for r in self.manifest["ranks"].values())


def is_checkpoint_dir(root: Path) -> bool:
    try:
        return any(_STEP.match(p.name) or _PARTIAL.match(p.name) for p in root.iterdir())
    except OSError:
        return False


def scan(root: Path) -> list[Found]:
    """Every committed and partial checkpoint under ``root``, oldest step first; committed
    ones carry their manifest (or the problem reading it)."""
    found: list[Found] = []
    try:
        entries = list(root.iterdir())
    except FileNotFoundError:
        return []
    for p in entries:
        m = _STEP.match(p.name)
        if m and p.is_dir():
            f = Found(int(m.group(1)), p, True)
            try:
                f.manifest = read_json(p / MANIFEST, TAG)
            except UsageError as exc:
                f.problems.append(str(exc))
            found.append(f)
        elif (m := _PARTIAL.match(p.name)) and p.is_dir():
            found.append(Found(int(m.group(1)), p, False))
    return sorted(found, key=lambda f: (f.step, f.committed))


def verify(found: Found, ranks: list[int] | None = None, *, checksums: bool = True) -> list[str]:
    """Problems with a committed checkpoint's files (sizes always; crc32 when ``checksums``);
    empty when it is good. ``ranks``: only these ranks' shards."""
    if found.problems or not found.manifest:
        return found.problems or ["no manifest"]
    problems = []
    for key, rec in found.manifest["ranks"].items():
        rank = int(key)
        if ranks is not None and rank not in ranks:
            continue
        problems += verify_shard(found.path, rank, rec, checksums=checksums)
    return problems


def verify_shard(directory: Path, rank: int, rec: dict[str, Any], *, checksums: bool = True) -> list[str]:
    bin_name, json_name = shard_names(rank)
    problems = []
    for name, size_key, crc_key in ((bin_name, "size", "crc32"), (json_name, "json_size", "json_crc32")):
        path = directory / name
        try:
            size = path.stat().st_size
        except OSError:
            problems.append(f"{path}: missing")
            continue
        if size != rec[size_key]:
            problems.append(f"{path}: {size} bytes, the manifest says {rec[size_key]}")
        elif checksums and file_crc(path) != rec[crc_key]:
            problems.append(f"{path}: checksum mismatch (corrupt)")
    return problems
