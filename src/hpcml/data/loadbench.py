"""Loader benchmark: what a loader gets out of a dataset, next to what the storage gives.

A *pass* reads a whole dataset (or ``limit`` of it) the way DataLoader workers would:
``workers`` forked processes, each reading its part, reporting samples, payload bytes and
read calls. For a shard set a worker iterates ``ShardDataset.stream(w, W, 1)``; for a
directory of files (a mounted squashfs image is one) a sample is one file, read whole with
open/read/close, and the sorted or shuffled list is cut into W contiguous parts.

The *ceiling* is the same storage read with large sequential reads (16 MiB, four threads
for queue depth) in the same run: the shard files themselves, or for a directory of files
a temporary file written next to them (else the squashfs image below the mount, else the
largest files). fio would measure it
too, but it is not on every node and would not read the dataset's own files.

Written here rather than taken from DLIO (MLCommons Storage) because that one simulates a
training job over generated data; this one measures a given dataset and the real reader.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import queue as queue_mod
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from hpcml import objstore, scratch
from hpcml.data.pagecache import Mount, backing_files, drop_caches, evict, mount_of
from hpcml.errors import HpcmlError, UsageError
from hpcml.proctree import stop_processes
from hpcml.schemas import tag

KINDS = ("shards", "files")
ORDERS = ("sequential", "shuffled")
CACHE_MODES = ("cold", "warm", "drop")
READ_SIZE = 16 << 20
CEILING_THREADS = 4
CEILING_BYTES = 1 << 30
TEMP_PREFIX = ".hpcml-bench-ceiling"
REPORT_EVERY = 0.1          # seconds between a worker's progress messages
GRACE = 1.0                 # seconds to wait for the last message of a worker that exited

Progress = Callable[[int], None]


class WorkerError(HpcmlError):
    """A loader worker raised something other than bad input, or died."""


# -- the target -------------------------------------------------------------------------

@dataclass
class Target:
    path: Path | str                  # a directory, or a shard set's s3:// prefix
    kind: str                         # "shards" or "files"
    mount: Mount
    samples: int
    bytes: int                        # on disk: file sizes, or shard sizes for a shard set
    files: list[tuple[str, int]]      # files: every sample's file; shards: the shard tars
    cache_files: list[str] = field(default_factory=list)   # evicted before each pass
    backing: list[str] = field(default_factory=list)       # below a squashfs mount: see pagecache.backing_files
    skipped: int = 0                  # files: entries that could not be listed


def open_target(path: str | os.PathLike, kind: str | None = None) -> Target:
    """A shard set (a directory with manifest.json, or an ``s3://`` prefix with one) or a
    directory of files, validated."""
    if objstore.is_url(str(path)):
        return _object_target(str(path), kind)
    p = Path(path)
    if not p.exists():
        raise UsageError("does not exist", file=str(p))
    if p.is_file() and p.name == "manifest.json":
        p = p.parent
    if not p.is_dir():
        raise UsageError("not a directory: give a shard set, a directory of files or a mounted "
                         "squashfs image", file=str(p))
    if kind in (None, "auto"):
        kind = "shards" if (p / "manifest.json").is_file() else "files"
    if kind not in KINDS:
        raise UsageError(f"unknown kind {kind!r}: auto, shards or files", key="kind")
    mount = mount_of(p)
    backing = backing_files(mount)
    if kind == "shards":
        from hpcml.data.manifest import load_manifest
        m = load_manifest(p)
        if not m.shards or not sum(s.samples for s in m.shards):
            raise UsageError("empty shard set: no samples", file=str(p / "manifest.json"))
        files = [(str(p / s.name), s.bytes) for s in m.shards]
        cache = [f for f, _ in files] + [str(p / s.index) for s in m.shards] + [str(p / "manifest.json")]
        return Target(p, kind, mount, sum(s.samples for s in m.shards), sum(b for _, b in files),
                      files, cache + backing, backing)
    from hpcml.data.sources import list_files
    listing = list_files(p)
    files = [(str(p / f.rel), f.size) for f in listing.files if not Path(f.rel).name.startswith(TEMP_PREFIX)]
    if not files:
        raise UsageError("no files to read", file=str(p))
    return Target(p, kind, mount, len(files), sum(s for _, s in files), files,
                  [f for f, _ in files] + backing, backing, skipped=len(listing.unreadable))


def _object_target(url: str, kind: str | None) -> Target:
    """A shard set in object storage: its shards read over the network (no page cache here)."""
    if kind not in (None, "auto", "shards"):
        raise UsageError("an s3:// target is a shard set (its manifest.json in the bucket)", key="kind")
    from hpcml.data.manifest import load_manifest
    base = objstore.S3Url.parse(url, key="TARGET")
    m = load_manifest(str(base))
    if not m.shards or not sum(s.samples for s in m.shards):
        raise UsageError("empty shard set: no samples", file=f"{base}/manifest.json")
    files = [(objstore.url_of(*objstore.locate(base, s.name)), s.bytes) for s in m.shards]
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "AWS"
    return Target(str(base), "shards", Mount(str(base), endpoint, "s3"), sum(s.samples for s in m.shards),
                  sum(b for _, b in files), files)


def read_objects(objects: Sequence[tuple[str, int]], max_bytes: int,
                 threads: int = CEILING_THREADS) -> tuple[int, int, float]:
    """(bytes, GETs, seconds) of reading whole objects (URL, size), ``threads`` at once, the
    first ones up to ``max_bytes``: the store's ceiling for this node, as the loader's
    ranged GETs meet it."""
    picked, total = [], 0
    for u, n in objects:
        if total >= max_bytes:
            break
        picked.append(u)
        total += n
    s3 = objstore.client()

    def get(url: str) -> int:
        b = objstore.S3Url.parse(url)
        got = 0
        try:
            body = s3.get_object(Bucket=b.bucket, Key=b.prefix)["Body"]
            while chunk := body.read(READ_SIZE):
                got += len(chunk)
            body.close()
        except objstore.errors() as exc:
            raise objstore.problem(exc, url) from None
        return got
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        got = sum(pool.map(get, picked))
    return got, len(picked), time.perf_counter() - t0


# -- the page cache -----------------------------------------------------------------------

def make_cold(target: Target, cache: str = "cold") -> None:
    if target.mount.fstype == "s3":
        return                          # nothing of it in this node's page cache
    if cache == "drop":
        drop_caches()
    if cache != "warm":
        evict(target.cache_files)


def cache_note(target: Target, cache: str) -> str:
    if target.mount.fstype == "s3":
        return "object storage: every pass read over the network (no page cache on this node)"
    if cache == "warm":
        return "warm: nothing evicted, reads may come from the page cache"
    how = "posix_fadvise(DONTNEED)" + (" and /proc/sys/vm/drop_caches" if cache == "drop" else "")
    note = f"page cache evicted before each pass and the ceiling ({how}); a hypervisor or storage server may still cache"
    if "squash" in target.mount.fstype and not target.backing and cache != "drop":
        note += "; the squashfs image's own cache was not found and stays warm (use --drop-caches)"
    return note


# -- the ceiling ----------------------------------------------------------------------------

@dataclass
class Ceiling:
    method: str        # "shards", "objects", "temp-file", "image" or "largest-files"
    detail: str
    bytes: int
    seconds: float
    reads: int
    read_size: int = READ_SIZE
    threads: int = CEILING_THREADS

    @property
    def mb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e6 if self.seconds > 0 else 0.0

    def to_json(self) -> dict:
        return {**asdict(self), "mb_per_s": round(self.mb_per_s, 3)}


def _read_chunk(chunk: tuple[str, int, int]) -> int:
    path, off, n = chunk
    fd = os.open(path, os.O_RDONLY)
    try:
        # The whole chunk queued at once, as the reader does: without the hint a cold
        # pread is fed one readahead window at a time and the "ceiling" is the kernel's.
        os.posix_fadvise(fd, off, n, os.POSIX_FADV_WILLNEED)
        return len(os.pread(fd, n, off))
    finally:
        os.close(fd)


def read_sequential(paths: Sequence[str], max_bytes: int, read_size: int = READ_SIZE,
                    threads: int = CEILING_THREADS) -> tuple[int, int, float]:
    """(bytes, reads, seconds) of reading ``paths`` front to back in ``read_size`` preads,
    ``threads`` in flight, up to ``max_bytes``."""
    chunks, total = [], 0
    try:
        for p in paths:
            size = os.stat(p).st_size
            for off in range(0, size, read_size):
                if total >= max_bytes:
                    break
                n = min(read_size, size - off, max_bytes - total)
                chunks.append((p, off, n))
                total += n
            if total >= max_bytes:
                break
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=threads) as pool:
            got = sum(pool.map(_read_chunk, chunks))
        return got, len(chunks), time.perf_counter() - t0
    except OSError as exc:
        raise UsageError(f"cannot read for the ceiling: {exc.strerror}", file=exc.filename) from None


def _write_temp(directory: Path, size: int) -> int:
    """Random (incompressible) bytes, fsynced so that eviction can drop them, in a file
    nothing outlives (``scratch``: a benchmark killed mid-write leaves no 1 GB behind).
    Its descriptor: read it through ``scratch.fd_path``; closing it is deleting it."""
    fd = scratch.scratch(directory, TEMP_PREFIX)
    rng = np.random.default_rng()
    try:
        left = size
        while left > 0:
            n = min(READ_SIZE, left)
            view = memoryview(rng.bytes(n))
            while view:
                view = view[os.write(fd, view):]
            left -= n
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def measure_ceiling(target: Target, *, cache: str = "cold", max_bytes: int = CEILING_BYTES,
                    temp_dir: Path | None = None, threads: int = CEILING_THREADS) -> Ceiling:
    """Large sequential reads of the same storage. For files: a temporary file written in
    ``temp_dir`` when one is given (a directory on the same storage the user may write
    to; never the dataset's own directory unasked), else the squashfs image below the
    mount, else the largest files."""
    size = min(max_bytes, target.bytes)
    if target.mount.fstype == "s3":
        got, reads, secs = read_objects(target.files, size, threads=threads)
        return Ceiling("objects", f"whole shard objects, {threads} GETs at once", got, secs, reads, threads=threads)
    if target.kind == "shards":
        paths = [f for f, _ in target.files]
        if cache != "warm":
            evict(paths + target.backing)
        got, reads, secs = read_sequential(paths, size, threads=threads)
        return Ceiling("shards", f"the shard files, {len(paths)} shards", got, secs, reads, threads=threads)
    if temp_dir is not None:
        try:
            fd = _write_temp(Path(temp_dir), size)
        except OSError as exc:
            raise UsageError(f"cannot write the ceiling's temporary file: {exc.strerror}",
                             file=str(temp_dir), key="ceiling_dir") from None
        try:
            tmp = scratch.fd_path(fd)
            if cache != "warm":
                evict([tmp])
            got, reads, secs = read_sequential([tmp], size, threads=threads)
        finally:
            os.close(fd)
        return Ceiling("temp-file", f"a {size:,}-byte temporary file written to {temp_dir} "
                       "(fsynced, evicted, read, deleted)", got, secs, reads, threads=threads)
    image = next((b for b in target.backing if not b.startswith("/dev/")), None)
    if image:
        if cache != "warm":
            evict([image])
        got, reads, secs = read_sequential([image], size, threads=threads)
        return Ceiling("image", f"the squashfs image {image}", got, secs, reads, threads=threads)
    big, total = [], 0
    for path, n in sorted(target.files, key=lambda f: -f[1]):
        if total >= size:
            break
        big.append(path)
        total += n
    if cache != "warm":
        evict(big + target.backing)
    got, reads, secs = read_sequential(big, size, threads=threads)
    return Ceiling("largest-files", f"the {len(big)} largest files of the set (the directory is not "
                   "writable); small files make this a low ceiling", got, secs, reads, threads=threads)


# -- passes ---------------------------------------------------------------------------------

@dataclass
class WorkerStats:
    samples: int = 0
    payload: int = 0
    reads: int = 0
    read_bytes: int = 0


@dataclass
class PassResult:
    kind: str
    order: str
    workers: int
    samples: int
    payload_bytes: int
    seconds: float
    reads: int
    read_bytes: int
    pct_of_ceiling: float | None = None

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        """Payload delivered to the loop, MB (10^6) per second."""
        return self.payload_bytes / self.seconds / 1e6 if self.seconds > 0 else 0.0

    @property
    def mean_read(self) -> float:
        return self.read_bytes / self.reads if self.reads else 0.0

    def to_json(self) -> dict:
        return {**asdict(self), "samples_per_s": round(self.samples_per_s, 3),
                "mb_per_s": round(self.mb_per_s, 3), "mean_read_bytes": round(self.mean_read, 1)}


class _Reporter:
    def __init__(self, q) -> None:
        self.q, self.pending, self.last = q, 0, time.monotonic()

    def __call__(self, n: int) -> None:
        self.pending += n
        now = time.monotonic()
        if now - self.last >= REPORT_EVERY:
            self.flush()
            self.last = now

    def flush(self) -> None:
        if self.pending:
            self.q.put(("progress", self.pending))
            self.pending = 0


def _read_files(paths: Sequence[str], report: Progress) -> WorkerStats:
    """open, read whole (as ``f.read()`` does: fstat, then reads until end of file), close.
    Read calls count those that returned data, not the end-of-file probe."""
    st = WorkerStats()
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError as exc:
            raise UsageError(f"cannot open: {exc.strerror}", file=p) from None
        try:
            want = os.fstat(fd).st_size + 1
            while True:
                data = os.read(fd, max(want, 1 << 16))
                if not data:
                    break
                st.reads += 1
                st.read_bytes += len(data)
                st.payload += len(data)
                want -= len(data)
        except OSError as exc:
            raise UsageError(f"cannot read: {exc.strerror}", file=p) from None
        finally:
            os.close(fd)
        st.samples += 1
        report(1)
    return st


def _read_shards(ds, worker: int, workers: int, quota: int | None, quota_bytes: int | None,
                 report: Progress) -> WorkerStats:
    st = WorkerStats()
    it = ds.stream(worker, workers, 1)
    try:
        for sample in it:
            st.samples += 1
            st.payload += sum(len(v) for k, v in sample.items() if not k.startswith("__"))
            report(1)
            if (quota is not None and st.samples >= quota) or (quota_bytes is not None and st.payload >= quota_bytes):
                break
    finally:
        it.close()
    st.reads, st.read_bytes = ds.reads, ds.read_bytes
    return st


def _child(w: int, job: Callable[[Progress], WorkerStats], q, go) -> None:
    rep = _Reporter(q)
    try:
        go.wait()
        st = job(rep)
        rep.flush()
        q.put(("done", w, asdict(st)))
    except HpcmlError as exc:
        q.put(("error", w, str(exc), exc.exit_code))
    except BaseException as exc:      # noqa: BLE001 - anything must reach the parent as a message
        q.put(("error", w, f"{type(exc).__name__}: {exc}", 1))


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        import signal
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def run_workers(jobs: Sequence[Callable[[Progress], WorkerStats]],
                on_progress: Progress | None = None) -> tuple[list[WorkerStats], float]:
    """Run each job in a forked process, like DataLoader workers; (stats, wall seconds).

    The first failure (an exception, or a process that dies without a word) stops the
    others and is raised here; nothing waits on a dead worker.
    """
    ctx = multiprocessing.get_context("fork")
    q, go = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_child, args=(w, job, q, go), daemon=True) for w, job in enumerate(jobs)]
    done: dict[int, WorkerStats] = {}
    dead_since: dict[int, float] = {}
    try:
        for p in procs:
            p.start()
        t0 = time.perf_counter()
        go.set()
        while len(done) < len(procs):
            try:
                msg = q.get(timeout=0.2)
            except queue_mod.Empty:
                now = time.monotonic()
                for w, p in enumerate(procs):
                    if w not in done and p.exitcode is not None:
                        if now - dead_since.setdefault(w, now) >= GRACE:
                            raise WorkerError(f"loader worker {w} died ({_exit_text(p.exitcode)}) "
                                              "without reporting") from None
                continue
            if msg[0] == "progress":
                if on_progress:
                    on_progress(msg[1])
            elif msg[0] == "done":
                done[msg[1]] = WorkerStats(**msg[2])
            else:
                _, w, text, code = msg
                if code == 2:
                    raise UsageError(text)
                raise WorkerError(f"loader worker {w} failed: {text}")
        seconds = time.perf_counter() - t0
    finally:
        stop_processes(procs, timeout=5)
        q.close()
        q.cancel_join_thread()
    return [done[w] for w in range(len(procs))], seconds


def _ordered(target: Target, shuffled: bool, seed: int) -> list[tuple[str, int]]:
    if not shuffled:
        return target.files
    perm = np.random.default_rng([abs(seed), 0xB0C4]).permutation(len(target.files))
    return [target.files[i] for i in perm]


def _limited(files: list[tuple[str, int]], limit: int | None, limit_bytes: int | None) -> list[str]:
    if limit is not None:
        files = files[:limit]
    if limit_bytes is not None:
        sizes = np.cumsum([s for _, s in files])
        files = files[:int(np.searchsorted(sizes, limit_bytes)) + 1]
    return [f for f, _ in files]


def _share(total: int | None, w: int, workers: int) -> int | None:
    return None if total is None else total // workers + (w < total % workers)


def run_pass(target: Target, order: str = "sequential", workers: int = 1, *, limit: int | None = None,
             limit_bytes: int | None = None, seed: int = 0, on_progress: Progress | None = None) -> PassResult:
    """One pass over ``target`` (or its first ``limit`` samples / ``limit_bytes`` of payload)."""
    if order not in ORDERS:
        raise UsageError(f"unknown order {order!r}: sequential or shuffled", key="order")
    if workers < 1:
        raise UsageError(f"workers must be at least 1, found {workers}", key="workers")
    shuffled = order == "shuffled"
    jobs: list[Callable[[Progress], WorkerStats]] = []
    if target.kind == "shards":
        # Made here, before the fork, as DataLoader does: its constructor may import torch.
        from hpcml.data.reader import ShardDataset
        ds = ShardDataset(target.path, seed=seed, shuffle=shuffled, rank=0, world_size=1)
        for w in range(workers):
            jobs.append(functools.partial(_read_shards, ds, w, workers, _share(limit, w, workers),
                                          _share(limit_bytes, w, workers)))
    else:
        paths = _limited(_ordered(target, shuffled, seed), limit, limit_bytes)
        bounds = [len(paths) * w // workers for w in range(workers + 1)]
        for w in range(workers):
            jobs.append(functools.partial(_read_files, paths[bounds[w]:bounds[w + 1]]))
    stats, seconds = run_workers(jobs, on_progress)
    return PassResult(target.kind, order, workers, sum(s.samples for s in stats), sum(s.payload for s in stats),
                      seconds, sum(s.reads for s in stats), sum(s.read_bytes for s in stats))


# -- the whole benchmark --------------------------------------------------------------------

@dataclass
class BenchResult:
    target: str
    kind: str
    mount: Mount
    samples: int
    bytes: int
    cache: str
    ceiling: Ceiling
    passes: list[PassResult]
    notes: list[str]

    def to_json(self) -> dict:
        return {"schema": tag("data.bench", 1), "target": self.target, "kind": self.kind, "fstype": self.mount.fstype,
                "mount": asdict(self.mount), "samples": self.samples, "bytes": self.bytes,
                "cache": self.cache, "ceiling": self.ceiling.to_json(),
                "passes": [p.to_json() for p in self.passes], "notes": self.notes}


def expected_samples(target: Target, limit: int | None, limit_bytes: int | None) -> int:
    """Samples a pass will deliver (an estimate under a byte limit), for a progress bar."""
    n = target.samples if limit is None else min(limit, target.samples)
    if limit_bytes is not None and target.bytes:
        n = min(n, max(1, round(target.samples * limit_bytes / target.bytes)))
    return n


def bench(path: str | os.PathLike, *, kind: str | None = None, orders: Sequence[str] = ORDERS,
          workers: Sequence[int] = (1,), limit: int | None = None, limit_bytes: int | None = None,
          seed: int = 0, cache: str = "cold", ceiling_bytes: int = CEILING_BYTES,
          ceiling_dir: str | os.PathLike | None = None,
          on_stage: Callable[[str, int | None], None] | None = None,
          on_progress: Progress | None = None) -> BenchResult:
    """The ceiling, then one pass per (order, workers). ``on_stage(label, samples)`` announces each."""
    if cache not in CACHE_MODES:
        raise UsageError(f"unknown cache mode {cache!r}: cold, warm or drop", key="cache")
    if cache == "drop" and os.geteuid() != 0:
        raise UsageError("dropping the kernel's caches needs root", key="drop-caches")
    for o in orders:
        if o not in ORDERS:
            raise UsageError(f"unknown order {o!r}: sequential or shuffled", key="order")
    if not orders or not workers or min(workers) < 1:
        raise UsageError("at least one order and worker counts of at least 1 are needed", key="workers")
    target = open_target(path, kind)
    stage = on_stage or (lambda label, n: None)
    stage("ceiling", None)
    if cache == "drop":
        drop_caches()
    ceiling = measure_ceiling(target, cache=cache, max_bytes=ceiling_bytes, temp_dir=Path(ceiling_dir) if ceiling_dir else None)
    passes = []
    for o in orders:
        for w in workers:
            stage(f"{o}, {w} worker{'s' * (w > 1)}", expected_samples(target, limit, limit_bytes))
            make_cold(target, cache)
            r = run_pass(target, o, w, limit=limit, limit_bytes=limit_bytes, seed=seed, on_progress=on_progress)
            r.pct_of_ceiling = 100 * r.mb_per_s / ceiling.mb_per_s if ceiling.mb_per_s else None
            passes.append(r)
    notes = [cache_note(target, cache), f"ceiling: {ceiling.detail}"]
    if target.kind == "files":
        notes.append("a sample is one file here (open, read whole, close)")
    if target.skipped:
        notes.append(f"{target.skipped} entries could not be listed and were left out")
    return BenchResult(str(target.path), target.kind, target.mount, target.samples, target.bytes, cache,
                       ceiling, passes, notes)
