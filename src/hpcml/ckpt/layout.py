"""Where a checkpoint's files live, what makes one committed, and how each is verified.

::

    DIR/step-00000100/             committed: renamed into place, complete on every rank
        manifest.json              hpcml.ckpt/1: step, world size, every rank's shard + checksums
        rank-00000.bin             the rank's tensors and arrays, 4 KiB aligned, never pickled
        rank-00000.json            hpcml.ckpt.shard/1: the state's structure, entry offsets, crc32
        own-00000.bin, .json       a replicated state's per-rank values (``PerRank``, data-loader
                                   states), one pair per rank; listed under ``per_rank``
    DIR/.partial-step-00000100/    being written; never read by ``load_latest``
        .attempt-TOKEN             which save attempts wrote here (a partial without the live
                                   owner's mark is a dead attempt's: ``prune`` removes it)
    DIR/.old-step-00000100-TOKEN/  a committed step being replaced by a re-save of the same step
    DIR/.owner                     the job that writes here (``hpcml.ckpt.owner``)

A checkpoint is visible only through the one ``rename`` of its partial directory, done by
the committing rank after every rank's shard was written, fsynced and renamed into the
partial directory under its own name, and the manifest fsynced: a reader sees all of it or
nothing. Each shard says which save attempt wrote it (``token``), so a shard left behind by
a crashed attempt at the same step is never taken for this attempt's.

Re-saving a committed step takes two renames (``step-00000100`` out to
``.old-step-00000100-TOKEN``, the partial in); a crash between them leaves no
``step-00000100``, so ``scan`` takes the ``.old`` one for step 100 (and the next writer
renames it back): the step is never lost, whatever moment the crash hit. A manifest is
checked key by key (``manifest_problem``): valid JSON with a key missing or of the wrong
type makes that checkpoint corrupt, never a ``KeyError``.
"""

from __future__ import annotations

import json
import os
import re
import stat
import zlib
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcml import files, schemas
from hpcml.errors import HpcmlError, UsageError
from hpcml.files import write_atomic

MANIFEST = "manifest.json"
TAG = schemas.tag("ckpt", 1)
SHARD_TAG = schemas.tag("ckpt.shard", 1)
_STEP = re.compile(r"^step-(\d{8,})$")
_PARTIAL = re.compile(r"^\.partial-step-(\d{8,})$")
_OLD = re.compile(r"^\.old-step-(\d{8,})-")
_RANK = re.compile(r"[0-9]+")
CRC_CHUNK = 16 << 20
FILE_MODE = 0o600                       # checkpoints hold model weights: private unless asked
_RANK_KEYS = ("size", "crc32", "json_size", "json_crc32")


class CheckpointError(HpcmlError):
    """A save or load that could not complete (the message says which file)."""


def step_name(step: int) -> str:
    return f"step-{step:08d}"


def partial_name(step: int) -> str:
    return f".partial-{step_name(step)}"


def shard_names(rank: int, kind: str = "rank") -> tuple[str, str]:
    """The files of ``rank``'s shard (``kind="rank"``) or of its per-rank values in a
    replicated checkpoint (``kind="own"``)."""
    return f"{kind}-{rank:05d}.bin", f"{kind}-{rank:05d}.json"


def shards(manifest: dict[str, Any]) -> list[tuple[str, int, dict[str, Any]]]:
    """Every file pair a manifest lists: ``(kind, rank, record)``, the ranks' shards first."""
    return [("rank", int(k), rec) for k, rec in manifest["ranks"].items()] + \
        [("own", int(k), rec) for k, rec in manifest.get("per_rank", {}).items()]


def attempt_mark(token: str) -> str:
    """The empty file a save attempt leaves in each partial directory it writes into."""
    return ".attempt-" + re.sub(r"[^A-Za-z0-9._-]", "_", token)


def dir_mode(mode: int) -> int:
    """The directory mode that goes with a file mode: x wherever r is (0600 -> 0700)."""
    return mode | (mode & 0o444) >> 2


def make_dir(path: Path, mode: int = FILE_MODE) -> None:
    """``mkdir -p`` whose new directories get ``dir_mode(mode)`` exactly (not the umask's)."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:
            continue
        os.chmod(d, dir_mode(mode))


def create(path: Path | str, mode: int = FILE_MODE, flags: int = os.O_TRUNC) -> int:
    """Open a new file for writing with ``mode`` exactly (fchmod: the umask only narrows)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | flags, mode)
    os.fchmod(fd, mode)
    return fd


def write_json_durably(path: Path, doc: dict[str, Any], mode: int = FILE_MODE) -> None:
    """Write under a temporary name, fsync, rename, fsync the directory."""
    write_atomic(path, json.dumps(doc, separators=(",", ":")), mode=mode, durable=True)


#: a manifest or shard index lists ranks and tensors: tens of MB at the largest scale; more is
#: not one (and is not read into memory whole)
JSON_MAX = 256 << 20


def read_json(path: Path, tag: str) -> dict[str, Any]:
    return files.read_json(path, tag, max_bytes=JSON_MAX)   # a FIFO, '[' * 100000, a huge file: one line


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
    link: bool = False                  # a symbolic link: read through, never removed
    superseded: bool = False            # an ``.old-step-00000100-*`` whose ``step-00000100`` exists

    @property
    def size(self) -> int:
        if not self.manifest:
            return 0
        return sum(rec["size"] for _kind, _rank, rec in shards(self.manifest))


def is_checkpoint_dir(root: Path) -> bool:
    try:
        return any(_STEP.match(p.name) or _PARTIAL.match(p.name) or _OLD.match(p.name) for p in root.iterdir())
    except OSError:
        return False


def _is_int(value: Any, low: int = 0) -> bool:
    return type(value) is int and value >= low


def manifest_problem(doc: dict[str, Any]) -> str | None:
    """What is wrong with a tagged manifest's keys (hpcml.ckpt/1's schema, checked by hand:
    jsonschema is not a dependency), or None."""
    for key, ok, want in (("step", _is_int, "an integer >= 0"),
                          ("world_size", lambda v: _is_int(v, 1), "an integer >= 1"),
                          ("replicated", lambda v: isinstance(v, bool), "true or false"),
                          ("token", lambda v: isinstance(v, str), "a string"),
                          ("committed_at", lambda v: type(v) in (int, float), "a number"),
                          ("ranks", lambda v: isinstance(v, dict) and bool(v), "an object of ranks")):
        if key not in doc:
            return f"key '{key}': missing"
        if not ok(doc[key]):
            return f"key '{key}': expected {want}, found {doc[key]!r}"
    per_rank = doc.get("per_rank")
    if "per_rank" in doc and not (isinstance(per_rank, dict) and doc["replicated"]):
        return f"key 'per_rank': expected an object of ranks in a replicated checkpoint, found {per_rank!r}"
    for section in ("ranks", "per_rank") if per_rank else ("ranks",):
        for rank, rec in doc[section].items():
            if not _RANK.fullmatch(rank) or not isinstance(rec, dict):     # not isdigit(): '²' is one
                return f"key '{section}.{rank}': expected a rank number with its shard's record"
            for key in _RANK_KEYS:
                if not _is_int(rec.get(key)):
                    return f"key '{section}.{rank}.{key}': expected an integer, found {rec.get(key)!r}"
    # the ranks a commit lists: every one of world_size (rank 0 alone when replicated); a
    # world_size that the ranks do not cover passed verify and was kept by prune, then load
    # refused it ("world size 2; this job has 1 ranks") with the good older one pruned
    n = 1 if doc["replicated"] else doc["world_size"]
    if len(doc["ranks"]) != n or set(doc["ranks"]) != {str(r) for r in range(n)}:
        return (f"key 'ranks': expected the shards of ranks 0 to {n - 1} (world_size {doc['world_size']}"
                f"{', replicated' if doc['replicated'] else ''}), found ranks {sorted(doc['ranks'])[:8]}")
    w = doc["world_size"]
    # the count first: a forged world_size of 10**12 is not a set of that many ranks to build
    if per_rank is not None and (len(per_rank) != w or set(per_rank) != {str(r) for r in range(w)}):
        return (f"key 'per_rank': expected the per-rank values of ranks 0 to {w - 1} (world_size {w}), "
                f"found ranks {sorted(per_rank)[:8]}")
    return None


def read_manifest(found: Found) -> None:
    """Set ``found.manifest``, or add the problem that makes it corrupt."""
    path = found.path / MANIFEST
    try:
        doc = read_json(path, TAG)
    except UsageError as exc:
        found.problems.append(str(exc))
        return
    problem = manifest_problem(doc)
    if problem is None and doc["step"] != found.step:
        problem = f"key 'step': {doc['step']}, in the directory of step {found.step}"
    if problem:
        found.problems.append(f"{path}: {problem}")
    else:
        found.manifest = doc


def scan(root: Path) -> list[Found]:
    """Every committed and partial checkpoint under ``root``, oldest step first; committed
    ones carry their manifest (or the problem reading it). An ``.old-step-00000100-*`` counts
    as step 100's committed checkpoint when there is no ``step-00000100`` (a re-save cut short)."""
    found: list[Found] = []
    old: list[Found] = []
    try:
        entries = list(root.iterdir())
    except FileNotFoundError:
        return []
    for p in entries:
        if (m := _STEP.match(p.name)) and p.is_dir():
            found.append(Found(int(m.group(1)), p, True, link=p.is_symlink()))
        elif (m := _PARTIAL.match(p.name)) and p.is_dir():
            found.append(Found(int(m.group(1)), p, False, link=p.is_symlink()))
        elif (m := _OLD.match(p.name)) and p.is_dir():
            old.append(Found(int(m.group(1)), p, True, link=p.is_symlink()))
    steps = {f.step for f in found if f.committed}
    for f in sorted(old, key=lambda f: f.path.name):
        if f.step in steps:
            f.committed, f.superseded = False, True
        else:
            steps.add(f.step)
        found.append(f)
    for f in found:
        if f.committed:
            read_manifest(f)
    return sorted(found, key=lambda f: (f.step, f.committed))


def restore_replaced(root: Path) -> None:
    """Rename a re-save's ``.old-step-00000100-*`` that stands for its step back to ``step-00000100`` (by the
    directory's owner, before it writes: nobody is between the two renames then)."""
    for f in scan(root):
        if f.committed and f.path.name.startswith(".old-") and not f.link:
            os.rename(f.path, root / step_name(f.step))


def verify(found: Found, *, checksums: bool = True,
           files: Collection[tuple[str, int]] | None = None, but: Collection[tuple[str, int]] = ()) -> list[str]:
    """Problems with a committed checkpoint's files (sizes always; crc32 when ``checksums``);
    empty when it is good. ``files``: only these ``(kind, rank)`` (``shards``); ``but``:
    not these."""
    if found.problems or not found.manifest:
        return found.problems or ["no manifest"]
    problems = []
    for kind, rank, rec in shards(found.manifest):
        if files is not None and (kind, rank) not in files or (kind, rank) in but:
            continue
        problems += verify_shard(found.path, rank, rec, checksums=checksums, kind=kind)
    return problems


def verify_shard(directory: Path, rank: int, rec: dict[str, Any], *, checksums: bool = True,
                 kind: str = "rank") -> list[str]:
    bin_name, json_name = shard_names(rank, kind)
    problems = []
    for name, size_key, crc_key in ((bin_name, "size", "crc32"), (json_name, "json_size", "json_crc32")):
        path = directory / name
        try:
            st = path.lstat()
        except OSError:
            problems.append(f"{path}: missing")
            continue
        if not stat.S_ISREG(st.st_mode):               # hpcml writes files: a FIFO would hang the
            problems.append(f"{path}: not a regular file (a link or special file is never read)")
            continue                                   # read, a link could name any file
        size = st.st_size
        if size != rec[size_key]:
            problems.append(f"{path}: {size} bytes, the manifest says {rec[size_key]}")
            continue
        try:
            if checksums and file_crc(path) != rec[crc_key]:
                problems.append(f"{path}: checksum mismatch (corrupt)")
        except OSError as exc:                         # removed by a prune meanwhile, unreadable
            problems.append(f"{path}: unreadable ({exc.strerror})")
    if problems:
        return problems
    # sizes and checksums right: is the index one a load can follow (its size the shard's,
    # every leaf's bytes inside it)? A checkpoint whose files match their checksums can still
    # point outside its shard and never load: verify says so, so that prune does not keep it
    # over an older good one. Read once, for this and for the leaves.
    index = directory / json_name
    try:
        doc = read_json(index, SHARD_TAG)
        problem = index_problem(doc, rec["size"]) if isinstance(doc, dict) else "not a JSON object"
    except (CheckpointError, UsageError) as exc:
        return [f"{index}: {exc}"]
    if problem:
        return [f"{index}: {problem}"]
    return refused_leaves(directory / bin_name, index, doc) if checksums else []


def refused_leaves(shard: Path, index: Path, doc: Any = None) -> list[str]:
    """The pickled leaves of a shard that loading would refuse, judged as ``hpcml scan`` and
    the load judge them (the same walk, policy and argument checks): a checkpoint whose
    sizes and checksums are right can still hold a leaf that never loads
    (``Fraction('1e30000000')``), and is not a good checkpoint. ``doc``: the index, if read."""
    if doc is None:
        try:
            doc = read_json(index, SHARD_TAG)
        except (CheckpointError, UsageError) as exc:
            return [f"{index}: {exc}"]
    entries = doc.get("entries") if isinstance(doc, dict) else None
    pickled = [(i, e) for i, e in enumerate(entries or []) if isinstance(e, dict) and e.get("kind") == "pickle"]
    if not pickled:
        return []                       # tensors and arrays only: the scanner is not even imported
    from hpcml.ckpt.flatten import leaf_paths
    from hpcml.scan import pickles
    from hpcml.scan.context import FileScan
    from hpcml.scan.model import Verdict
    from hpcml.scan.policy import default_policy
    names = leaf_paths(doc.get("skeleton"))
    from hpcml.scan.scanner import scan_content
    fs = FileScan(str(shard), default_policy(), 0, scan_content)
    try:
        with open(shard, "rb") as fh:
            for i, e in pickled:
                off, n = e.get("offset"), e.get("nbytes")
                if type(off) is not int or type(n) is not int:
                    return [f"{index}: leaf #{i}: no offset and size"]
                pickles.scan_stream(fs, fh, off, off + n, f"leaf {names.get(i, f'#{i}')}")
    except OSError as exc:
        return [f"{shard}: unreadable ({exc.strerror})"]
    res = fs.finish()
    out = [f"{shard}: {f.location.member}: refused at load: {f.name} ({f.why})"
           for f in res.findings if f.verdict is not Verdict.SAFE]
    return out + [f"{shard}: {e}" for e in res.errors]


LEAF_KINDS = ("torch", "numpy", "bytes", "pickle")


def index_problem(doc: dict[str, Any], size: int) -> str | None:
    """What makes a shard's index one a load cannot follow: its schema, its size not the
    shard's, a leaf of no known kind or whose bytes lie outside the shard, an object dtype."""
    from hpcml import schemas
    try:
        schemas.check(doc, SHARD_TAG, "index")
    except UsageError as exc:
        return exc.problem
    if doc.get("size") != size:
        return f"key 'size': {doc.get('size')!r}, the file has {size} bytes"
    entries = doc.get("entries")
    if not isinstance(entries, list):
        return "key 'entries': expected a list"
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or e.get("kind") not in LEAF_KINDS:
            return f"key 'entries.{i}': expected a leaf of kind {', '.join(LEAF_KINDS)}"
        off, n = e.get("offset"), e.get("nbytes")
        if type(off) is not int or type(n) is not int or off < 0 or n < 0 or off + n > size:
            return f"key 'entries.{i}': bytes {off!r}+{n!r} are not inside the {size}-byte file"
        if e["kind"] == "numpy" and _object_dtype(e.get("dtype")):
            return f"key 'entries.{i}.dtype': {e.get('dtype')!r} is not a plain array dtype"
    return None


def _object_dtype(dtype: Any) -> bool:
    import numpy as np
    try:
        return bool(np.dtype(dtype).hasobject) if isinstance(dtype, str) else True
    except (TypeError, ValueError):
        return True
