"""``hpcml data doctor``: what a dataset directory costs a loader, and how to store it.

The scan runs threads over directories because ``scandir`` and ``stat`` release the GIL:
on a parallel filesystem the metadata round trips overlap. Each directory is reduced to
counts in its worker (sizes, WebDataset samples, extensions), so millions of files cost
8 bytes each, not one object each. Written by hand: ``os.walk`` is serial, fsspec's
``find`` returns one dict per file, and no library gives the staging decision.

Semantics follow the packer (``hpcml.data.sources``): symlinks to files are followed,
symlinks to directories are not, and whatever cannot be read is listed, never dropped.
The recommendation is a pure function of the scan and a ``Resources`` value, so every
branch is testable without the machine's RAM or disks.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from hpcml.data.manifest import is_shard_name
from hpcml.data.sources import examine, identity, sample_key, walk
from hpcml.errors import UsageError
from hpcml.schemas import tag
from hpcml.units import fmt_bytes

MiB = 2**20
MB = 10**6
DEFAULT_SHARD = 256 * MB
MIN_SHARD = 1 * MB
PERCENTILES = (10, 50, 90, 99)
LOOSE_META_PER_FILE = 3      # open + fstat + close
PACKED_META_PER_SHARD = 6    # the same for the tar and for its index
TAR_BLOCK = 512              # a tar member is a 512-byte header plus data padded to 512


@dataclass
class Problem:
    path: str
    reason: str


@dataclass
class Bucket:
    low: int     # sizes in [low, high); the empty-file bucket is [0, 1)
    high: int
    files: int


@dataclass
class SizeStats:
    min: int = 0
    max: int = 0
    mean: float = 0.0
    percentiles: dict[str, int] = field(default_factory=dict)   # "p50" -> bytes (nearest rank)
    histogram: list[Bucket] = field(default_factory=list)       # power-of-two buckets


@dataclass
class ScanResult:
    root: str
    files: int = 0
    bytes: int = 0
    directories: int = 0
    sizes: SizeStats = field(default_factory=SizeStats)
    extensions: list[tuple[str, int]] = field(default_factory=list)   # top 10, "" = none
    samples: int = 0                 # WebDataset keys: dir/stem up to the basename's first '.'
    largest_sample_bytes: int = 0    # a shard must hold at least this
    tar_bytes: int = 0               # the files as tar members: 512 B header + padding (PAX ignored)
    ungroupable_count: int = 0       # no extension or a dot-file: WebDataset cannot group it
    ungroupable: list[str] = field(default_factory=list)   # paths, first `listed_limit`
    unreadable: list[Problem] = field(default_factory=list)  # all of them
    shards: int = 0                  # WebDataset tar shards (.tar, .tar.gz, .tgz, ...) among the files
    shard_bytes: int = 0
    compressed_shards: int = 0       # by name: .tar.gz, .tgz, .tar.bz2, .tar.xz
    indexed: bool = False            # a manifest.json at the root: hpcml reads the shards as they are
    mds_files: int = 0               # MosaicML streaming shards (.mds, .mds.zstd, ...)
    token_arrays: int = 0            # memmapped token arrays (TOKEN_ARRAY_EXT, Megatron's .idx beside its .bin)
    token_array_bytes: int = 0
    token_array_names: list[str] = field(default_factory=list)   # the largest few, relative to the root
    seconds: float = 0.0
    files_per_s: float = 0.0
    jobs: int = 1
    file_sizes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)

    def to_json(self) -> dict:
        out = asdict(replace(self, file_sizes=np.zeros(0, np.int64)))   # no deep copy of the sizes
        out.pop("file_sizes")
        out["extensions"] = [{"ext": e, "files": n} for e, n in self.extensions]
        return out


@dataclass
class Resources:
    ram_free: int                  # bytes the OS could give us now
    local_dir: str                 # node-local disk for staging
    local_free: int
    tasks: int = 1                 # tasks on this node that each stage their own copy
    ram_dir: str = "/dev/shm"
    ram_dir_free: int | None = None   # tmpfs limit of ram_dir; None = unlimited

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class Ops:
    units: int           # files (loose) or shards (packed) opened per epoch
    metadata_ops: int
    read_ops: int


@dataclass
class EpochOps:
    read_size: int
    loose: Ops
    packed: Ops


@dataclass
class Recommendation:
    pack: bool
    pack_reason: str
    shard_bytes: int     # what to pass to `hpcml data pack` if packing
    shards: int
    shard_reason: str
    placement: str       # "ram" | "local-disk" | "stream"
    target: str
    placement_reason: str
    stage_bytes: int     # bytes that would be staged (tar size when packing)
    notes: list[str] = field(default_factory=list)


@dataclass
class DoctorReport:
    scan: ScanResult
    resources: Resources
    readers: int
    ops: EpochOps
    recommendation: Recommendation

    def to_json(self) -> dict:
        return {"schema": tag("data.doctor", 1), "scan": self.scan.to_json(), "resources": self.resources.to_json(),
                "readers": self.readers, "epoch_ops": asdict(self.ops),
                "recommendation": asdict(self.recommendation)}


# --- scan -----------------------------------------------------------------------------

@dataclass
class _Dir:
    sizes: array = field(default_factory=lambda: array("q"))
    samples: int = 0
    largest_sample: int = 0
    ext: Counter = field(default_factory=Counter)
    ungroupable: list[str] = field(default_factory=list)
    unreadable: list[Problem] = field(default_factory=list)
    subdirs: list[Path] = field(default_factory=list)
    shards: int = 0
    shard_bytes: int = 0
    compressed_shards: int = 0
    mds_files: int = 0
    arrays: list[tuple[str, int]] = field(default_factory=list)   # token arrays: (path, bytes)


#: a memmapped token array's file, by extension: nanoGPT's and Megatron's .bin (with
#: Megatron's .idx beside it), numpy's .npy, the Arrow files of a Hugging Face dataset
TOKEN_ARRAY_EXT = (".bin", ".npy", ".arrow")
MIN_TOKEN_ARRAY = MiB               # smaller .bin/.npy files are something else (a config, a table)
MAX_TOKEN_ARRAYS = 64               # in one directory: more are per-sample files (an image each)
#: share of the bytes in token arrays for the dataset to be read as token arrays
TOKEN_ARRAY_SHARE = 0.9


def _scan_dir(path: Path, euid: int, groups: set[int]) -> _Dir:
    out = _Dir()
    try:
        with os.scandir(path) as it:
            entries = list(it)
    except OSError as exc:
        out.unreadable.append(Problem(str(path), exc.strerror or str(exc)))
        return out
    files: list[tuple[str, str, int]] = []
    for e in entries:
        kind, st = examine(e, euid, groups)
        if kind == "dir":
            out.subdirs.append(Path(e.path))
            continue
        if kind == "bad":
            assert isinstance(st, str)
            out.unreadable.append(Problem(e.path, st))
            continue
        assert isinstance(st, os.stat_result)
        files.append((e.name, e.path, st.st_size))
    _tally(out, files)
    return out


def _tally(out: _Dir, files: list[tuple[str, str, int]]) -> None:
    """One directory's regular files (name, path, bytes): sizes, shards, samples, token arrays.
    The same for a directory and for the objects under one prefix of an object store."""
    samples: dict[str, int] = {}
    for name, path, size in files:
        out.sizes.append(size)
        if is_shard_name(name):
            out.shards += 1
            out.shard_bytes += size
            out.compressed_shards += not name.lower().endswith(".tar")
        elif ".mds" in name.lower():
            out.mds_files += 1
        key = sample_key(name)
        if key is None:
            out.ungroupable.append(path)
            out.ext[""] += 1
            continue
        samples[key[0]] = samples.get(key[0], 0) + size
        out.ext[key[1]] += 1
    out.samples = len(samples)
    out.largest_sample = max(samples.values(), default=0)
    names = {name for name, _, _ in files}
    found = [(path, size) for name, path, size in files
             if name.lower().endswith(TOKEN_ARRAY_EXT) or (name.lower().endswith(".idx") and name[:-4] + ".bin" in names)]
    # a few large arrays (val.bin beside train.bin counts with it); thousands of .npy or .bin
    # files are per-sample files, whatever their size
    if len(found) <= MAX_TOKEN_ARRAYS and any(size >= MIN_TOKEN_ARRAY and not p.endswith(".idx") for p, size in found):
        out.arrays = found


def _object_dirs(root: str) -> tuple[list[_Dir], bool]:
    """An ``s3://bucket/prefix``'s objects (every level below it), as the directories their
    keys name, tallied as files are; and whether a manifest.json is at the prefix."""
    from hpcml import objstore
    url = objstore.S3Url.parse(root, key="PATH")
    s3 = objstore.client()
    prefix = url.key("") if url.prefix else ""
    by_dir: dict[str, list[tuple[str, str, int]]] = {}
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=url.bucket, Prefix=prefix):
            for o in page.get("Contents", []):
                key = o["Key"]
                rel = key[len(prefix):]
                if not rel or rel.endswith("/"):
                    continue
                parent, _, name = rel.rpartition("/")
                by_dir.setdefault(parent, []).append((name, objstore.url_of(url.bucket, key), int(o["Size"])))
    except objstore.errors() as exc:
        raise objstore.problem(exc, root) from None
    dirs = []
    for files in by_dir.values():
        d = _Dir()
        _tally(d, files)
        dirs.append(d)
    return dirs, any(name == "manifest.json" for name, _, _ in by_dir.get("", []))


def _size_stats(sizes: np.ndarray) -> SizeStats:
    if sizes.size == 0:
        return SizeStats()
    pct = {f"p{p}": int(np.percentile(sizes, p, method="inverted_cdf")) for p in PERCENTILES}
    # frexp gives size = m * 2**e with m in [0.5, 1): e is the bit length, exact below 2**53
    exps = np.where(sizes > 0, np.frexp(sizes.astype(np.float64))[1], 0)
    counts = np.bincount(exps)
    lo = int(exps.min())
    hist = [Bucket(0 if e == 0 else 2 ** (e - 1), 1 if e == 0 else 2 ** e, int(counts[e]))
            for e in range(lo, len(counts))]
    return SizeStats(int(sizes.min()), int(sizes.max()), float(sizes.mean()), pct, hist)


def scan(path: str | Path, *, jobs: int = 16, listed_limit: int = 1000,
         on_progress: Callable[[int, int], None] | None = None) -> ScanResult:
    """Scan ``path`` with ``jobs`` threads; ``on_progress(files, bytes)`` after each directory.
    ``s3://bucket/prefix``: its objects, listed (every level below the prefix), each key's
    parent as its directory.

    Raises UsageError when ``path`` does not exist or is not a directory.
    """
    from hpcml.objstore import is_url
    root = Path(path)
    remote = is_url(str(path))
    if not remote and not root.exists():
        raise UsageError("no such directory", file=str(root))
    if not remote and not root.is_dir():
        raise UsageError("not a directory", file=str(root))
    euid, groups = identity()
    res = ScanResult(str(path).rstrip("/") if remote else str(root), jobs=max(1, jobs))
    sizes = array("q")
    ext: Counter[str] = Counter()
    arrays: list[tuple[int, str]] = []
    start = time.perf_counter()
    object_dirs, object_manifest = _object_dirs(str(path)) if remote else ([], False)
    listing = iter(object_dirs) if remote else walk(root, lambda p: _scan_dir(p, euid, groups), lambda d: d.subdirs,
                                                    res.jobs)
    for d in listing:
        res.directories += 1
        sizes.extend(d.sizes)
        ext.update(d.ext)
        res.samples += d.samples
        res.largest_sample_bytes = max(res.largest_sample_bytes, d.largest_sample)
        res.ungroupable_count += len(d.ungroupable)
        room = listed_limit - len(res.ungroupable)
        res.ungroupable.extend(d.ungroupable[:max(0, room)])
        res.unreadable.extend(d.unreadable)
        res.shards += d.shards
        res.shard_bytes += d.shard_bytes
        res.compressed_shards += d.compressed_shards
        res.mds_files += d.mds_files
        for name, size in d.arrays:
            res.token_arrays += 1
            res.token_array_bytes += size
            arrays.append((size, name))
        res.files += len(d.sizes)
        res.bytes += sum(d.sizes)
        if on_progress:
            on_progress(res.files, res.bytes)
    res.indexed = object_manifest if remote else (root / "manifest.json").is_file()
    res.seconds = time.perf_counter() - start
    res.files_per_s = res.files / res.seconds if res.seconds > 0 else 0.0
    res.file_sizes = np.frombuffer(sizes, dtype=np.int64).copy() if sizes else np.zeros(0, np.int64)
    res.sizes = _size_stats(res.file_sizes)
    res.tar_bytes = int((TAR_BLOCK + -(-res.file_sizes // TAR_BLOCK) * TAR_BLOCK).sum())
    res.extensions = sorted(ext.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
    res.token_array_names = [n[len(res.root) + 1:] if remote else os.path.relpath(n, root)
                             for _, n in sorted(arrays, reverse=True)[:5]]
    res.ungroupable.sort()
    res.unreadable.sort(key=lambda p: p.path)
    return res


# --- resources, operations, recommendation -------------------------------------------

def detect_resources(*, ram_free: int | None = None, local_dir: str | None = None,
                     local_free: int | None = None, tasks: int = 1,
                     ram_dir: str = "/dev/shm") -> Resources:
    """This node's figures; any argument given replaces the detected one.

    The local disk is $SLURM_TMPDIR, else $TMPDIR, else /tmp (the first that exists).
    """
    if ram_free is None:
        import psutil
        ram_free = int(psutil.virtual_memory().available)
    if local_dir is None:
        candidates = [os.environ.get("SLURM_TMPDIR"), os.environ.get("TMPDIR"), "/tmp"]
        local_dir = next((c for c in candidates if c and os.path.isdir(c)), "/tmp")
    elif not os.path.isdir(local_dir):
        raise UsageError("local disk directory does not exist", file=local_dir)
    if local_free is None:
        local_free = shutil.disk_usage(local_dir).free
    ram_dir_free = shutil.disk_usage(ram_dir).free if os.path.isdir(ram_dir) else None
    return Resources(int(ram_free), local_dir, int(local_free), max(1, tasks), ram_dir, ram_dir_free)


def _reads(nbytes: int, read_size: int) -> int:
    return -(-nbytes // read_size)


def epoch_ops(scan: ScanResult, shard_bytes: int, read_size: int = MiB) -> EpochOps:
    """Operations one pass over the data costs, as loose files and as shards of ``shard_bytes``."""
    reads = int(np.maximum(1, -(-scan.file_sizes // read_size)).sum()) if scan.files else 0
    loose = Ops(scan.files, LOOSE_META_PER_FILE * scan.files, reads)
    full, rest = divmod(scan.tar_bytes, shard_bytes)
    shards = full + (1 if rest else 0)
    packed = Ops(shards, PACKED_META_PER_SHARD * shards,
                 full * _reads(shard_bytes, read_size) + _reads(rest, read_size))
    return EpochOps(read_size, loose, packed)


def fmt_size(n: float) -> str:
    """Powers of two such as 1 MiB are shown as such, not as '1.05 MB'; others in SI units."""
    for unit, scale in (("GiB", 2**30), ("MiB", MiB), ("KiB", 1024)):
        if n >= scale and n % scale == 0 and n // scale < 1024:
            return f"{int(n // scale)} {unit}"
    return fmt_bytes(n)


def _n(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


SHARDED = 0.9                # of the bytes in tar shards: the dataset is shards already


def sharded(scan: ScanResult) -> bool:
    """Mostly WebDataset tar shards (hpcml's or anyone's): read as they are, never repacked."""
    return scan.shards > 0 and scan.shard_bytes >= SHARDED * scan.bytes


def _already(scan: ScanResult) -> str | None:
    """Why not to pack a dataset that is in a shard format already, or None."""
    if sharded(scan):
        what = f"{_n(scan.shards, 'WebDataset tar shard')} hold {fmt_bytes(scan.shard_bytes)}"
        if scan.indexed:
            return f"Read as is: {what}, indexed (manifest.json): ShardDataset, stage and bench read them."
        return (f"Read as is: {what}; do not repack them: 'hpcml data index {scan.root}' (--out DIR when it is "
                "read-only) writes the index ShardDataset, stage and bench need, without rewriting a shard.")
    if scan.mds_files:
        return (f"Do not pack: {_n(scan.mds_files, 'MosaicML streaming (MDS) shard')} - a shard format already, "
                "read by mosaicml-streaming's StreamingDataset; hpcml reads WebDataset tar shards, not MDS.")
    if token_arrays(scan):
        names = ", ".join(scan.token_array_names[:3])
        return (f"Do not pack: {fmt_bytes(scan.token_array_bytes)} of {fmt_bytes(scan.bytes)} are in "
                f"{_n(scan.token_arrays, 'memmapped token array')} ({names}: the layout of nanoGPT, Megatron's "
                "indexed datasets, numpy and Hugging Face Arrow). A loader maps each file and reads random windows of it through the "
                "page cache: few opens, no per-sample files, and packed into tar shards the training script could "
                "no longer map them. What matters is where they are read from: see placement.")
    return None


def token_arrays(scan: ScanResult) -> bool:
    """Whether the dataset is memmapped token arrays: most of its bytes are in them."""
    return scan.token_arrays > 0 and scan.token_array_bytes >= TOKEN_ARRAY_SHARE * scan.bytes


def _pack(scan: ScanResult, small: int, many: int) -> tuple[bool, str]:
    if scan.files == 0:
        return False, "no readable files: nothing to pack"
    already = _already(scan)
    if already:
        return False, already
    median = scan.sizes.percentiles["p50"]
    why = []
    if median < small:
        why.append(f"the median file is {fmt_bytes(median)} (< {fmt_size(small)}), "
                   "so per-file open/stat/close costs more than the read")
    if scan.files > many:
        why.append(f"{scan.files:,} files (> {many:,}) load the metadata server every epoch")
    if why:
        return True, "Pack into shards: " + "; and ".join(why) + "."
    return False, (f"Read as is: {scan.files:,} files with a median of {fmt_bytes(median)} "
                   "are few and large enough that packing gains little.")


def _shard(scan: ScanResult, readers: int, default: int) -> tuple[int, str]:
    """Halve the default until every reader has a shard: WebDataset hangs otherwise (#188);
    ShardDataset does not need it, but small shards also stage and pack in parallel."""
    total, size = scan.tar_bytes, default
    while size > MIN_SHARD and math.ceil(total / size) < readers:
        size //= 2
    size = max(size, MIN_SHARD)
    n = math.ceil(total / size)
    why = f"The packed {fmt_bytes(total)} gives {_n(n, 'shard')} of {fmt_bytes(size)}"
    if size < default:
        why = f"The packed {fmt_bytes(total)} is small: {fmt_bytes(size)} shards give {_n(n, 'shard')}"
    if size < scan.largest_sample_bytes:
        size = scan.largest_sample_bytes
        n = math.ceil(total / size)
        why += f"; raised to {fmt_bytes(size)}, the largest sample, which a shard must hold ({_n(n, 'shard')})"
    if n >= readers:
        why += f", at least one per reader ({readers}), as WebDataset needs"
    else:
        why += (f", fewer than the {readers} readers: fine for hpcml's ShardDataset, which splits shards "
                "into blocks, but WebDataset would leave readers idle")
    return size, why + "."


def place(size: int, res: Resources, *, pack: bool = True, root: str = "",
          ram_fraction: float = 0.4, disk_fraction: float = 0.8) -> tuple[str, str, str]:
    """(placement, target, reason) for ``size`` bytes: "ram" (``res.ram_dir``) when they fit
    in ``ram_fraction`` of the free RAM, else "local-disk" in ``disk_fraction`` of its free
    space, else "stream" from ``root``. ``hpcml data stage`` places its copy by this too."""
    share = f" per task ({res.tasks} tasks stage a copy each)" if res.tasks > 1 else ""
    ram_budget = ram_fraction * res.ram_free / res.tasks
    limit = ""
    if res.ram_dir_free is not None and res.ram_dir_free / res.tasks < ram_budget:
        ram_budget = res.ram_dir_free / res.tasks
        limit = f", capped by {res.ram_dir}'s {fmt_bytes(res.ram_dir_free)} free"
    disk_budget = disk_fraction * res.local_free / res.tasks
    what = "the shards" if pack else "the files"
    if size <= ram_budget:
        return "ram", res.ram_dir, (
            f"Stage {what} to RAM ({res.ram_dir}): {fmt_bytes(size)} fits in {ram_fraction:.0%} of "
            f"{fmt_bytes(res.ram_free)} free RAM ({fmt_bytes(ram_budget)}{share}{limit}), "
            "leaving the rest to training.")
    if size <= disk_budget:
        return "local-disk", res.local_dir, (
            f"Stage {what} to node-local disk ({res.local_dir}): {fmt_bytes(size)} is over the RAM "
            f"budget of {fmt_bytes(ram_budget)}{limit} but fits in {disk_fraction:.0%} of its "
            f"{fmt_bytes(res.local_free)} free ({fmt_bytes(disk_budget)}{share}).")
    how = "as packed shards with large sequential reads" if pack else "with large reads"
    return "stream", root, (
        f"Stream from where it is, {how}: {fmt_bytes(size)} exceeds both the RAM budget "
        f"({fmt_bytes(ram_budget)}{limit}) and the local disk budget ({fmt_bytes(disk_budget)}{share}).")


def recommend(scan: ScanResult, res: Resources, *, readers: int = 64,
              ram_fraction: float = 0.4, disk_fraction: float = 0.8,
              small_file: int = MiB, many_files: int = 10_000,
              shard_bytes: int = DEFAULT_SHARD) -> Recommendation:
    """Pack or not, shard size, and where to put the data; each with its reason."""
    pack, pack_reason = _pack(scan, small_file, many_files)
    shard, shard_reason = _shard(scan, max(1, readers), shard_bytes)
    stage = scan.tar_bytes if pack else scan.bytes
    placement, target, place_reason = place(stage, res, pack=pack or sharded(scan), root=scan.root, ram_fraction=ram_fraction,
                                            disk_fraction=disk_fraction)
    notes = []
    if sharded(scan) and scan.compressed_shards:
        notes.append(f"{_n(scan.compressed_shards, 'shard')} compressed (.tar.gz, .tgz, ...): hpcml reads each whole, "
                     "decompressed from its start, as one block; decompress them once for block reads.")
    if token_arrays(scan) and placement != "stream":
        notes.append(f"Stage them as they are, once per node, checksummed: DATA=$(hpcml data stage {scan.root}) in "
                     "the job script, then point the training script's data directory at $DATA (its file names stay).")
    if pack and scan.ungroupable_count:
        n = scan.ungroupable_count
        has = "file has no extension or starts" if n == 1 else "files have no extension or start"
        notes.append(f"{n:,} {has} with '.': "
                     "WebDataset cannot group them into samples; rename them before packing.")
    if scan.unreadable:
        n = len(scan.unreadable)
        notes.append(f"{n:,} {'entry' if n == 1 else 'entries'} could not be read and are not counted "
                     "above; fix them or a loader will fail on them.")
    n = math.ceil(scan.tar_bytes / shard) if scan.tar_bytes else 0
    return Recommendation(pack, pack_reason, shard, n, shard_reason,
                          placement, target, place_reason, stage, notes)


def diagnose(path: str | Path, resources: Resources | None = None, *, readers: int = 64,
             read_size: int = MiB, jobs: int = 16,
             on_progress: Callable[[int, int], None] | None = None, **policy) -> DoctorReport:
    """Scan ``path``, then recommend; ``policy`` goes to :func:`recommend`."""
    if read_size < 1:
        raise UsageError(f"must be at least 1 byte, found {read_size}", key="read_size")
    if readers < 1:
        raise UsageError(f"must be at least 1, found {readers}", key="readers")
    result = scan(path, jobs=jobs, on_progress=on_progress)
    res = resources if resources is not None else detect_resources()
    rec = recommend(result, res, readers=readers, **policy)
    return DoctorReport(result, res, readers, epoch_ops(result, rec.shard_bytes, read_size), rec)
