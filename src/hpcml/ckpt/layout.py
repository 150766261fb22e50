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

import errno
import json
import math
import os
import re
import stat
import zlib
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcml import files, schemas
from hpcml.ckpt.shardread import CheckpointError as CheckpointError
from hpcml.ckpt.shardread import ChecksumMismatch
from hpcml.errors import UsageError
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


class CorruptIndex(CheckpointError, UsageError):
    """A shard's index that does not describe its shard (a leaf outside it, a shape that is
    not its bytes, a skeleton that names a leaf it lacks): bad input naming the file and the
    key, exit 2, as ``hpcml.data``'s ``CorruptShardError``; still a ``CheckpointError``."""


class Fault(str):
    """A line of ``verify`` that is an index's fault, with the ``CorruptIndex`` a load of it
    raises (``offline.check``): every caller keeps its list of lines."""

    error: CorruptIndex

    def __new__(cls, error: CorruptIndex) -> Fault:
        line = super().__new__(cls, str(error))
        line.error = error
        return line


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


def open_shard(path: Path) -> int:
    """A shard's file descriptor, opened as a file from anyone: a symbolic link is not
    followed (it could name any file), a FIFO not waited on, only a regular file read,
    whatever ``path`` was when it was checked (``lstat``) a moment before."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        fd = -1
    if fd < 0 or not stat.S_ISREG(os.fstat(fd).st_mode):
        if fd >= 0:
            os.close(fd)
        raise CheckpointError(f"{path}: not a regular file (a link or special file is never read)")
    return fd


def read_index(path: Path, rec: dict[str, Any] | None = None) -> dict[str, Any]:
    """A shard's index as the loader reads it: never through a symbolic link (``verify``
    refuses one). With ``rec`` (the manifest's record of the pair), parsed from the very
    bytes whose length and crc32 are checked against it (``ChecksumMismatch``): an index
    replaced after a check is never followed."""
    def checked(data: bytes) -> None:
        if rec is not None and (len(data) != rec["json_size"] or zlib.crc32(data) != rec["json_crc32"]):
            raise ChecksumMismatch(str(path))
    try:
        doc = files.load_json_bounded(path, JSON_MAX, follow_symlinks=False, check=checked)
    except FileNotFoundError:
        raise UsageError("missing", file=str(path)) from None
    except OSError as exc:
        raise UsageError(f"unreadable ({exc.strerror or exc})", file=str(path)) from None
    except ValueError as exc:       # the bytes read: not JSON, or not a file (a FIFO): an index no load follows
        raise CorruptIndex(f"not a JSON index ({exc})", file=str(path)) from None
    try:
        schemas.check(doc, SHARD_TAG, str(path))
    except UsageError as exc:       # another document, a newer hpcml's
        raise CorruptIndex(exc.problem, file=str(path), key=exc.key) from None
    return doc


def record(manifest: dict[str, Any], kind: str, rank: int) -> dict[str, Any]:
    """The manifest's record (sizes, crc32s) of ``rank``'s ``kind`` files (``shards``)."""
    return manifest["ranks" if kind == "rank" else "per_rank"][str(rank)]


def file_crc(path: Path) -> int:
    crc = 0
    with open(open_shard(path), "rb", buffering=0) as fh:
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


def verify(found: Found, *, checksums: bool = True, index: bool = True,
           files: Collection[tuple[str, int]] | None = None, but: Collection[tuple[str, int]] = ()) -> list[str]:
    """Problems with a committed checkpoint's files (sizes always; crc32 when ``checksums``;
    the indexes when ``index``: ``verify_shard``); empty when it is good. ``files``: only
    these ``(kind, rank)`` (``shards``); ``but``: not these."""
    if found.problems or not found.manifest:
        return found.problems or ["no manifest"]
    problems = []
    for kind, rank, rec in shards(found.manifest):
        if files is not None and (kind, rank) not in files or (kind, rank) in but:
            continue
        problems += verify_shard(found.path, rank, rec, checksums=checksums, kind=kind, index=index)
    if problems or but or not index or not found.manifest.get("per_rank"):
        return problems                 # (``but``, no ``index``: sizes only; the load's own pass joins them)
    return own_problems(found.path, found.manifest, files)


def own_problems(directory: Path, manifest: dict[str, Any], files: Collection[tuple[str, int]] | None = None) -> list[str]:
    """A replicated checkpoint's per-rank places (``{"__own": i}`` in the rank shards'
    skeletons) each need an ``i``-th value in every rank's own file, which a load reads
    beside the shared state: two files, each good alone, that a load cannot join are a
    checkpoint that never loads, so ``verify`` says so (``prune`` keeps the older one, and
    ``load_latest`` falls back to it). Only the shards in question (``files``): their indexes
    are small and were checked just before."""
    picked = [(kind, rank) for kind, rank, _ in shards(manifest) if files is None or (kind, rank) in files]
    problems: list[str] = []
    for kind, rank in picked:
        if kind != "rank":
            continue
        index = directory / shard_names(rank, kind)[1]
        places = _places(index)                  # read once, however many ranks' values it joins
        for other, own in picked:
            if other == "own":
                gap = own_gap(index, directory / shard_names(own, other)[1], places)
                problems += [gap] if gap else []
    return problems


class _Unread(str):
    """Why an index checked a moment ago could not be read again."""


def _skeleton(index: Path) -> Any:
    """An index's skeleton, or ``_Unread`` saying why it is not there now."""
    try:
        return read_json(index, SHARD_TAG).get("skeleton")
    except OSError as exc:                         # removed by a prune meanwhile
        return _Unread(f"{exc.filename}: unreadable ({exc.strerror})")
    except (CheckpointError, UsageError) as exc:   # replaced since it was checked
        return _Unread(exc)


def _places(index: Path) -> int | str:
    """How many per-rank values the shared state's ``index`` places (its largest ``__own``
    plus one), or the problem reading it."""
    from hpcml.ckpt.flatten import own_slots
    skeleton = _skeleton(index)
    if isinstance(skeleton, _Unread):
        return str(skeleton)
    slots = [s["__own"] for s in own_slots(skeleton)]
    return max(slots) + 1 if slots else 0


def own_gap(index: Path, own: Path, places: int | str | None = None) -> str | None:
    """What keeps the shared state's ``index`` from joining the per-rank values in ``own``
    (both indexes checked already): a place whose value the own file lacks; None if none.
    ``places``: ``_places(index)``, where the caller has it."""
    need = _places(index) if places is None else places
    if isinstance(need, str) or not need:
        return need or None
    values = _skeleton(own)
    if isinstance(values, _Unread):
        return str(values)
    have = len(values) if isinstance(values, list) else 0
    if need > have:
        return f"{own}: key 'skeleton': {have} per-rank values, {index} places value {need - 1}"
    return None


def verify_shard(directory: Path, rank: int, rec: dict[str, Any], *, checksums: bool = True,
                 kind: str = "rank", index: bool = True) -> list[str]:
    """Problems with one pair of files: sizes; crc32s when ``checksums``; the index
    (``index_fault``) when ``index``, and its pickled leaves as the load judges them when
    both. A load judges the index and the checksums itself, on the read that loads."""
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
        except CheckpointError as exc:                 # replaced by a link since the lstat
            problems.append(str(exc))
    if problems or not index:
        return problems
    # sizes and checksums right: is the index one a load can follow (its size the shard's,
    # every leaf's bytes inside it)? A checkpoint whose files match their checksums can still
    # point outside its shard and never load: verify says so, so that prune does not keep it
    # over an older good one. Read once, for this and for the leaves.
    path = directory / json_name
    try:
        doc = read_json(path, SHARD_TAG)
        fault = index_fault(doc, rec["size"]) if isinstance(doc, dict) else (None, "not a JSON object")
    except (CheckpointError, UsageError) as exc:
        return [f"{path}: {exc}"]
    if fault:
        return [Fault(CorruptIndex(fault[1], file=str(path), key=fault[0]))]
    return refused_leaves(directory / bin_name, path, doc) if checksums else []


def refused_leaves(shard: Path, index: Path, doc: Any = None) -> list[str]:
    """The pickled leaves of a shard that loading would refuse, judged by the rule ``hpcml
    scan`` and the load apply (``leafcheck.judge``): a checkpoint whose
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
    from hpcml.ckpt import leafcheck
    from hpcml.ckpt.flatten import leaf_paths
    names = leaf_paths(doc.get("skeleton"))
    fs = leafcheck.new_scan(str(shard))
    try:
        with open(open_shard(shard), "rb") as fh:
            for i, e in pickled:
                off, n = e.get("offset"), e.get("nbytes")
                if type(off) is not int or type(n) is not int:
                    return [f"{index}: leaf #{i}: no offset and size"]
                leafcheck.judge(fs, fh, off, n, f"leaf {names.get(i, f'#{i}')}")
    except OSError as exc:
        return [f"{shard}: unreadable ({exc.strerror})"]
    except CheckpointError as exc:
        return [str(exc)]
    return [f"{shard}: {line}" for line in leafcheck.refusals(fs.finish())]


LEAF_KINDS = ("torch", "numpy", "bytes", "pickle")
#: numpy's limit on an array's dimensions
MAX_DIMS = 64


def index_problem(doc: dict[str, Any], size: int) -> str | None:
    """What makes a shard's index one a load cannot follow (``index_fault``) in one line, or
    None: ``verify``, ``hpcml scan`` and the load itself judge an index by this."""
    fault = index_fault(doc, size)
    if fault is None:
        return None
    key, problem = fault
    return f"key '{key}': {problem}" if key else problem


def check_index(doc: dict[str, Any], size: int, path: Path) -> None:
    """``CorruptIndex`` naming ``path`` and the key, unless the index describes its ``size``-byte shard."""
    fault = index_fault(doc, size)
    if fault is not None:
        raise CorruptIndex(fault[1], file=str(path), key=fault[0])


def index_fault(doc: dict[str, Any], size: int) -> tuple[str | None, str] | None:
    """``(key, problem)`` when the index does not describe its ``size``-byte shard exactly as
    the load reads it: its schema, its size, a leaf of no known kind, whose bytes lie outside
    the shard, whose dtype is not a plain one or whose shape is not its bytes, or a skeleton
    that would not rebuild from the leaves (``flatten.skeleton_problem``); None when it does.
    Nothing is allocated from what it declares."""
    from hpcml.ckpt.flatten import skeleton_problem
    try:
        schemas.check(doc, SHARD_TAG, "index")
    except UsageError as exc:
        return exc.key, exc.problem
    if doc.get("size") != size:
        return "size", f"{doc.get('size')!r}, the file has {size} bytes"
    entries = doc.get("entries")
    if not isinstance(entries, list):
        return "entries", "expected a list"
    for i, e in enumerate(entries):
        fault = _entry_fault(e, size)
        if fault:
            return f"entries.{i}{fault[0]}", fault[1]
    # each leaf's bytes its own (the writer lays them one after another): leaves that share
    # bytes would be read into memory once each, 400 leaves of one 1 MiB region 400 MiB
    spans = sorted((e["offset"], e["nbytes"], i) for i, e in enumerate(entries) if e["nbytes"])
    for (off, n, _), (nxt, _, j) in zip(spans, spans[1:]):
        if nxt < off + n:
            return f"entries.{j}", f"bytes {nxt}+ overlap another leaf's ({off}+{n}): each leaf's bytes are its own"
    replicated = doc.get("replicated") is True and doc.get("part") != "own"
    bad = skeleton_problem(doc.get("skeleton"), entries, own=replicated)
    if bad:
        return "skeleton", f"at {bad[0] or 'the top'}: {bad[1]}"
    if doc.get("part") == "own" and not isinstance(doc.get("skeleton"), list):
        return "skeleton", "expected the list of a rank's per-rank values"
    return None


def _entry_fault(e: Any, size: int) -> tuple[str, str] | None:
    """``(key under the entry, problem)`` of one leaf's entry: a tensor or array is read
    into memory of its shape's size, so that size must be exactly its bytes in the shard."""
    if not isinstance(e, dict) or e.get("kind") not in LEAF_KINDS:
        return "", f"expected a leaf of kind {', '.join(LEAF_KINDS)}"
    off, n = e.get("offset"), e.get("nbytes")
    if type(off) is not int or type(n) is not int or off < 0 or n < 0 or off + n > size:
        return "", f"bytes {off!r}+{n!r} are not inside the {size}-byte file"
    if e["kind"] not in ("torch", "numpy"):
        return None                             # bytes and pickles: their bytes are the value
    from hpcml.ckpt.flatten import TORCH_ITEMSIZE, array_itemsize
    dtype, shape = e.get("dtype"), e.get("shape")
    itemsize = TORCH_ITEMSIZE.get(dtype) if e["kind"] == "torch" and isinstance(dtype, str) else array_itemsize(dtype)
    if itemsize is None:
        return ".dtype", f"{dtype!r} is not a plain {'tensor' if e['kind'] == 'torch' else 'array'} dtype"
    if not (isinstance(shape, list) and len(shape) <= MAX_DIMS and all(type(d) is int and d >= 0 for d in shape)):
        return ".shape", f"{shape!r} is not a list of at most {MAX_DIMS} sizes"
    if math.prod(max(d, 1) for d in shape) * itemsize >= 1 << 63:
        return ".shape", f"{shape!r} of {dtype} is larger than any array can be"
    if math.prod(shape) * itemsize != n:
        return "", f"shape {shape!r} of {dtype} is {math.prod(shape) * itemsize} bytes, the entry's are {n}"
    return None
