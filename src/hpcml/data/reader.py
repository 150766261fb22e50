"""``ShardDataset``: the reader of a shard set, for plain Python loops and (through
``hpcml.data.torchloader``) torch's DataLoader.

It reads whole blocks (``block_bytes``, default 1 MiB) with one ``pread`` each, several
blocks at once from a small thread pool, one window ahead of what it yields, and slices
samples out of memory; it never issues a system call per sample. A hint thread queues the
window after that with the kernel once the reads before it are done. The order is planned
by ``hpcml.data.order``; the resume state is the rank's position in that plan.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import stat
import threading
import warnings
from collections import OrderedDict
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from hpcml import objstore
from hpcml.cluster.ranks import ranks
from hpcml.data import index as shard_index
from hpcml.data import order
from hpcml.data.index import BLOCK, ShardIndex, header_problem, load_index, load_index_bytes
from hpcml.data.manifest import MAX_SAMPLES, load_manifest, manifest_path
from hpcml.errors import UsageError
from hpcml.files import JSON_MAX
from hpcml.schemas import check, tag

STATE_SCHEMA = tag("data.state", 1)
LEGACY_STATE_FORMAT = "hpcml-shard-state/1"   # "format" of states saved before tags: still resumed
BLOCK_BYTES = 1 << 20       # default block: 4 MiB before issue 72 (states of those resume, see load_state_dict)
#: an object store's default block: each ranged GET pays a round trip, so blocks stay 4 MiB there
OBJECT_BLOCK_BYTES = 4 << 20
WINDOW = 32                 # default blocks per window
#: reads in flight per rank from files, shared by its loader workers (at least 2 each): at 4
#: workers, 8 threads each (32 in flight) read 13 % slower than 2 each on this project's
#: benchmark disk (benchmarks/README.md, ``hpcml data``). An object store's ranged GETs wait
#: on round trips and a compressed shard's reads on decompression, not the disk: there each
#: reading process keeps this many.
READ_THREADS = 8


_closer: tuple[int, queue.SimpleQueue] | None = None        # (the process it serves, its queue)
_closer_lock = threading.Lock()


def _closer_queue() -> queue.SimpleQueue:
    """The queue of this process's stream closer: a thread that closes the streams left
    unfinished. Such a stream is closed by the garbage collector in whichever thread it runs,
    at any point of it: inside ``threading``'s own bookkeeping (a new thread's start holds
    its lock, which a join needs: that thread and the one starting it then wait for ever) or
    in one of the stream's own threads. There nothing may join or start a thread, and
    ``SimpleQueue.put`` is what Python says may be called from there. Made at a stream's
    start, anew after a fork (a DataLoader worker has no thread of its parent's)."""
    global _closer
    with _closer_lock:
        if _closer is None or _closer[0] != os.getpid():
            q: queue.SimpleQueue = queue.SimpleQueue()
            threading.Thread(target=_close_loop, args=(q,), name="hpcml-reader-close", daemon=True).start()
            _closer = (os.getpid(), q)
        return _closer[1]


def _close_loop(q: queue.SimpleQueue) -> None:
    while True:
        close = q.get()
        try:
            close()
        except Exception as exc:  # noqa: BLE001 - one stream's close must not end the others'
            warnings.warn(f"hpcml data: a stream left unfinished was not closed cleanly: {exc}", stacklevel=1)
#: layout settings that only tune reading: left to their defaults, a resume takes the state's
TUNING = ("block_bytes", "window")
#: what a reading process holds is two windows (``2 * window * block_bytes``): bounded, so
#: neither an argument nor a resumed state (a file) can make one read ask for terabytes
MAX_BLOCK_BYTES = 1 << 30
MAX_WINDOW = 4096
MAX_WINDOW_BYTES = 16 << 30
#: a ranged GET of more than this is made in slices of it, each allocated once the one
#: before came back whole: an index's claim (a file: anyone's) past an object's real end
#: costs one slice of memory, not what it claims
OBJECT_SLICE = 64 << 20
#: a compressed block's buffer grows by at most this much at a time (``_Shards._inflate``)
INFLATE_STEP = 16 << 20
#: a compressed shard in an object store is read whole into memory (``_object_file``): at
#: most its decompressed bound and what compression adds to incompressible data (under 1 %)
MAX_COMPRESSED_OBJECT = shard_index.MAX_INFLATED_BYTES + (shard_index.MAX_INFLATED_BYTES >> 5)
#: an epoch's plan of up to this many blocks (about 100 MB: a tuple in a list each) is built
#: without asking the storage; a larger one only when the shards' real bytes can fill it
PLAN_FREE_BLOCKS = 1 << 20
#: bounds of a resume state's numbers beyond what any run reaches (a state is a file)
MAX_EPOCH = 1 << 31
MAX_WORLD = 1 << 24
MAX_WORKERS = 1 << 12
MAX_BATCH = 1 << 31


def tuning_problem(block_bytes: int, window: int) -> tuple[str, str] | None:
    """The key and the problem where a block size and a window are out of bounds."""
    if not 1 <= block_bytes <= MAX_BLOCK_BYTES:
        return "block_bytes", f"{block_bytes} is not between 1 and {MAX_BLOCK_BYTES} (1 GiB)"
    if not 1 <= window <= MAX_WINDOW:
        return "window", f"{window} is not between 1 and {MAX_WINDOW} blocks"
    if block_bytes * window > MAX_WINDOW_BYTES:
        return "window", (f"{window} blocks of {block_bytes} bytes is more than {MAX_WINDOW_BYTES >> 30} GiB "
                          "a window (a reading process holds two)")
    return None


class CorruptShardError(UsageError):
    """A shard that does not match its index: names the shard and the byte offset."""

    def __init__(self, shard: Path | str, offset: int, problem: str) -> None:
        super().__init__(f"offset {offset}: {problem}", file=str(shard))
        self.shard, self.offset = shard, offset


class ResumeStateError(UsageError, ValueError):
    """A resume state that belongs to another dataset, seed or layout."""


def resize_problem(state: dict, samples: int | None = None) -> str | None:
    """Why ``state`` cannot resume at another world size, or None: only a state at an epoch
    boundary can (nothing of the epoch delivered, or all of it). Mid-epoch, the samples a
    rank has delivered are scattered over the new ranks' slices, so no position of theirs
    says what is left. ``samples``: the rank's samples per epoch (default: the state's)."""
    position = state.get("position", 0)
    n = samples if samples is not None else state.get("samples")
    if position == 0 or type(n) is int and position >= n:
        return None
    of = f" of {n}" if type(n) is int else ""
    return (f"the data loader's state is mid-epoch (epoch {state.get('epoch')}, sample {position}{of} of rank "
            f"{state.get('rank')}), and a position within an epoch does not carry over to another world size")


#: a resume state's numbers: (key, least, most, required); ``rank`` is below ``world_size`` too
STATE_NUMBERS = (("epoch", 0, MAX_EPOCH, True), ("position", 0, MAX_SAMPLES, True), ("samples", 0, MAX_SAMPLES, False),
                 ("world_size", 1, MAX_WORLD, True), ("rank", 0, MAX_WORLD - 1, True), ("workers", 1, MAX_WORKERS, False),
                 ("batch_size", 1, MAX_BATCH, False))


def _check_numbers(state: dict) -> None:
    """Refuse, in one line naming the key, a number of a resume state that is missing, not
    an integer (a bool, a float or a string is not one, though ``int()`` would take them),
    or out of range. A state is a file (a checkpoint's): before this, ``position: -5``
    read the epoch from its start while counting from -5, and ``epoch: "1"`` or ``true``
    resumed as 1."""
    for key, least, most, required in STATE_NUMBERS:
        if key not in state and not required:
            continue
        value = state.get(key)
        if isinstance(value, np.integer):       # a numpy integer the program gave set_epoch, saved as such
            value = state[key] = int(value)
        if type(value) is not int:
            found = "missing" if key not in state else f"not an integer (found {value!r:.40})"
            raise ResumeStateError(found, key=key)
        if not least <= value <= most:
            raise ResumeStateError(f"{value:,} is not between {least:,} and {most:,}", key=key)
    if state["rank"] >= state["world_size"]:
        raise ResumeStateError(f"rank {state['rank']} is outside world size {state['world_size']}", key="rank")


def _real_bytes(root: Path | objstore.S3Url, names: list[str]) -> list[int]:
    """The length of each shard as the storage has it (0 for one that is not there): a
    ``stat`` of each file (16 at a time: a parallel filesystem answers each in a round
    trip), one LIST of each object prefix."""
    urls: list[tuple[str, str] | None] = []
    for n in names:
        if objstore.is_url(n):
            u = objstore.S3Url.parse(n, key="shards.name")
            urls.append((u.bucket, u.prefix))
        elif isinstance(root, objstore.S3Url):
            urls.append(objstore.locate(root, n))
        else:
            urls.append(None)
    sizes: dict[tuple[str, str], int] = {}
    for bucket, parent in sorted({(b, k.rpartition("/")[0]) for b, k in (u for u in urls if u is not None)}):
        listed = objstore.list_objects(objstore.client(), objstore.S3Url(bucket, parent))
        sizes.update(((bucket, key), size) for key, size, _etag in listed)

    def one(i: int) -> int:
        url = urls[i]
        if url is not None:
            return sizes.get(url, 0)
        assert isinstance(root, Path)
        try:
            return os.stat(root / names[i]).st_size
        except OSError:
            return 0
    with ThreadPoolExecutor(max_workers=16) as pool:
        return list(pool.map(one, range(len(names))))


def _env_rank() -> tuple[int, int]:
    who = ranks()
    return who.rank, who.world_size


class _Shards:
    """Open files and loaded indexes of one process, a bounded number of each. A shard in an
    object store (its name an ``s3://`` URL, or the manifest itself in one) is read by ranged
    GETs of the same blocks (``hpcml.objstore``: one client per process, made in it: a
    DataLoader worker's own)."""

    def __init__(self, root: Path | objstore.S3Url, names: list[str], index_names: list[str], keep: int = 64,
                 compression: list[str] | None = None, sizes: list[int] | None = None,
                 counts: list[int] | None = None) -> None:
        self.sizes = sizes or [0] * len(names)      # the manifest's bytes of each: a whole object read is bounded
        self.counts = counts                        # the manifest's samples of each: its index must hold as many
        self.real: dict[int, int] = {}              # a file's length, from fstat of the descriptor read
        self.root, self.names, self.index_names, self.keep = root, names, index_names, keep
        self.remote: list[tuple[str, str] | None] = []
        for n in names:
            if objstore.is_url(n):
                u = objstore.S3Url.parse(n, key="shards.name")
                if isinstance(root, objstore.S3Url) and u.bucket != root.bucket:
                    raise UsageError(f"names a shard in another bucket ({n}): a manifest in a bucket reads "
                                     "its own bucket's objects only", file=objstore.url_of(root.bucket, root.key("manifest.json")))
                self.remote.append((u.bucket, u.prefix))
            elif isinstance(root, objstore.S3Url):
                self.remote.append(objstore.locate(root, n))
            else:
                self.remote.append(None)
        self._client: tuple[int, Any] | None = None
        self.compression = compression or [""] * len(names)
        self.fds: OrderedDict[int, int] = OrderedDict()
        self.indexes: OrderedDict[int, ShardIndex] = OrderedDict()
        self.reads = self.read_bytes = 0
        self.free: list[bytearray] = []
        self.lock = threading.Lock()
        # the hint thread, the readers and the yielding thread share the two caches
        self.open_lock, self.load_lock = threading.Lock(), threading.Lock()

    def path(self, s: int) -> Path | str:
        """The shard's file, or its object's ``s3://`` URL."""
        remote = self.remote[s]
        if remote is not None:
            return objstore.url_of(*remote)
        assert isinstance(self.root, Path)
        return self.root / self.names[s]

    def client(self) -> Any:
        if self._client is None or self._client[0] != os.getpid():
            self._client = (os.getpid(), objstore.client())
        return self._client[1]

    def index(self, s: int) -> ShardIndex:
        """The shard's index, loaded once: at a window's start the hint thread and the
        readers ask for the same ones, and parsing holds the GIL, so loads go one at a time
        (unguarded, a worker parsed some indexes two or three times before its first read)."""
        with self.open_lock:
            if s in self.indexes:
                self.indexes.move_to_end(s)
                return self.indexes[s]
        with self.load_lock:
            with self.open_lock:
                if s in self.indexes:          # loaded while this thread waited
                    return self.indexes[s]
            count = self.counts[s] if self.counts is not None else None
            if isinstance(self.root, objstore.S3Url):
                bucket, key = objstore.locate(self.root, self.index_names[s])
                where = objstore.url_of(bucket, key)
                idx = load_index_bytes(objstore.read_object(self.client(), bucket, key, JSON_MAX), where, samples=count)
            else:
                where = str(self.root / self.index_names[s])
                idx = load_index(self.root / self.index_names[s], samples=count)
            limit = shard_index.MAX_INFLATED_BYTES
            if self.compression[s] and len(idx) and int(idx.ends[-1]) > limit:
                raise UsageError(f"its samples end at byte {int(idx.ends[-1]):,} of the decompressed tar, past the "
                                 f"{limit:,} bytes a compressed shard may hold: it is read whole, as one block; "
                                 "decompress the shard (gunzip, xz -d) and index the .tar", file=where, key="samples")
            with self.open_lock:
                self.indexes[s] = idx
                if len(self.indexes) > self.keep:
                    self.indexes.popitem(last=False)
            return idx

    def fd(self, s: int) -> int:
        """The shard's descriptor (and its length, in ``real``); the least recently used is
        closed first, and ``keep`` exceeds the shards that reads and hints in flight use (two
        windows), so none is closed under a ``pread``."""
        with self.open_lock:
            if s in self.fds:
                self.fds.move_to_end(s)
                return self.fds[s]
            fd, st = _open_regular(self.path(s))
            self.fds[s], self.real[s] = fd, st.st_size
            if len(self.fds) > self.keep:
                os.close(self.fds.popitem(last=False)[1])
            return fd

    def advise(self, pieces: list[order.Piece], after: list[Future] | None = None) -> None:
        """Tell the kernel which blocks come next, so it queues them all at once (a deep
        queue from a few threads) instead of one readahead window per ``pread``. First wait
        for the reads ``after``: hinted beside them, these blocks delayed them (the disk
        serves what is queued in its own order), so the first window came late."""
        for f in after or []:
            try:                           # not futures.wait: a cancel does not wake it
                if f.exception() is not None:
                    return                 # the yielding thread raises it
            except CancelledError:
                return                     # the stream is closing
        for s, lo, hi in pieces:
            if self.compression[s] or self.remote[s] is not None:
                continue                   # offsets are in the decompressed tar; an object has no page cache
            idx = self.index(s)
            fd = self.fd(s)
            start, end = int(idx.starts[lo]), min(int(idx.ends[hi - 1]), self.real[s])
            if end > start:                # a length of 0 would mean: to the end of the file
                os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_WILLNEED)

    def read(self, piece: order.Piece) -> tuple[int, memoryview, bytearray]:
        """One block into a reused buffer: a fresh 4 MiB ``bytes`` per read costs the kernel
        a page fault per 4 KiB, which doubled the system time of a cold pass.

        Never more than the shard holds: a file's read stops at its length (``fstat``), an
        object's comes in slices (``OBJECT_SLICE``), a compressed shard's at the bound its
        index was checked against. What the index places beyond is the shard's end for
        every sample there ("truncated": refused, or skipped with ``on_corrupt="skip"``)."""
        s, lo, hi = piece
        idx = self.index(s)
        start, end = int(idx.starts[lo]), int(idx.ends[hi - 1])
        if self.compression[s]:           # memory as it decompresses: an index's claim allocates nothing
            buf = self._inflate(s, start, end - start)
            return start, memoryview(buf), buf
        remote = self.remote[s]
        if remote is not None:
            return self._read_object(remote, start, end)
        fd = self.fd(s)
        end = max(start, min(end, self.real[s]))
        buf = self._take(end - start)
        got = os.preadv(fd, [memoryview(buf)[:end - start]], start) if end > start else 0
        self.reads += 1
        self.read_bytes += got
        return start, memoryview(buf)[:got], buf

    def _read_object(self, remote: tuple[str, str], start: int, end: int) -> tuple[int, memoryview, bytearray]:
        """Bytes ``start`` to ``end`` of an object: one ranged GET up to ``OBJECT_SLICE``,
        beyond that slice by slice, each allocated after the one before came back whole, so
        memory follows what the object holds, not what its index claims."""
        if end - start <= OBJECT_SLICE:
            buf = self._take(end - start)
            got = objstore.read_range(self.client(), *remote, start, end, memoryview(buf)[:end - start])
        else:
            buf, got = bytearray(), 0
            while start + got < end:
                n = min(OBJECT_SLICE, end - start - got)
                buf += bytes(n)
                with memoryview(buf) as view, view[got:got + n] as into:
                    k = objstore.read_range(self.client(), *remote, start + got, start + got + n, into)
                got += k
                if k < n:
                    del buf[got:]
                    break
        self.reads += 1
        self.read_bytes += got
        return start, memoryview(buf)[:got], buf

    def _inflate(self, s: int, start: int, length: int) -> bytearray:
        """``length`` bytes from ``start`` of a compressed shard's tar: decompressed from the
        shard's beginning (no compression webdataset uses allows a seek), kept only from
        ``start``, stopped at the piece's end. A compressed shard is one block
        (``ShardDataset``). The buffer grows by what decompresses, ``INFLATE_STEP`` at a
        time: 40 shards of 150 bytes whose indexes each claim a GiB allocate kilobytes, not
        the 40 GiB the claims add up to."""
        from hpcml.data.wdsindex import open_decompressed
        path = self.path(s)
        remote = self.remote[s]
        try:
            raw = _object_file(self.client(), *remote, self.sizes[s]) if remote is not None \
                else os.fdopen(_open_regular(path)[0], "rb")
            out = bytearray()
            with raw, open_decompressed(raw, self.compression[s]) as fh:
                fh.seek(start)
                while len(out) < length and (chunk := fh.read(min(INFLATE_STEP, length - len(out)))):
                    out += chunk
        except (OSError, EOFError, ValueError) as exc:
            raise CorruptShardError(path, start, f"cannot decompress ({self.compression[s]}): {exc}") from None
        self.reads += 1
        self.read_bytes += len(out)
        return out

    def _take(self, n: int) -> bytearray:
        with self.lock:
            for i, b in enumerate(self.free):
                if len(b) >= n:
                    return self.free.pop(i)
        # room for the larger blocks of the same size (they vary with their samples' sizes),
        # so a window's buffers serve the next; a fresh one costs a page fault per 4 KiB
        return bytearray(-(-(n + min(n // 4, 1 << 20)) // (64 << 10)) * (64 << 10))

    def give(self, bufs: list[bytearray]) -> None:
        with self.lock:
            self.free.extend(bufs)

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


def _object_file(s3: Any, bucket: str, key: str, size: int) -> Any:
    """A compressed shard in an object store, whole in memory (it is one block anyway), no
    larger than the manifest says it is, nor than ``MAX_COMPRESSED_OBJECT`` (the manifest
    is a file too: its claim of a petabyte must not be the bound)."""
    import io
    return io.BytesIO(objstore.read_object(s3, bucket, key, min(max(size, 1), MAX_COMPRESSED_OBJECT)))


def _open_regular(path: Path | str) -> tuple[int, os.stat_result]:
    """A descriptor of the shard ``path`` and its status, if it is a regular file: a FIFO
    is not waited on (O_NONBLOCK), a device (a link to /dev/zero) or a directory is refused
    naming the shard."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise CorruptShardError(path, 0, f"cannot open: {exc.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise CorruptShardError(path, 0, "not a regular file (a directory, a FIFO or a device)")
    return fd, st


class ShardDataset:
    """Samples of a shard set as dicts ``{"__key__": ..., ext: bytes, ...}``.

    ``rank``/``world_size`` default to torch.distributed, else RANK/WORLD_SIZE, else
    SLURM_PROCID/SLURM_NTASKS. Every rank gets ``len(ds)`` samples per epoch. Memory: about
    two windows (``2 * window * block_bytes``, 64 MiB by default) per reading process.

    The shuffle mixes ``window`` blocks at a time, so its quality depends on the number of
    blocks, not their size; the size sets memory and how long each loader worker reads
    before its first sample (a window) and after its last read (the last window). Left to
    their defaults, ``block_bytes`` and ``window`` are taken from a resumed state, so a
    state saved with other defaults (4 MiB blocks before issue 72) resumes in its own order.
    """

    def __init__(self, path: str | os.PathLike, *, seed: int = 0, shuffle: bool = True,
                 rank: int | None = None, world_size: int | None = None,
                 block_bytes: int | None = None, window: int | None = None, drop_last: bool = True,
                 read_threads: int | None = None, on_corrupt: str = "raise",
                 decode: Callable[[dict], Any] | None = None) -> None:
        if on_corrupt not in ("raise", "skip"):
            raise UsageError(f"must be 'raise' or 'skip', got {on_corrupt!r}", key="on_corrupt")
        self.manifest = load_manifest(path)
        self.root: Path | objstore.S3Url = objstore.S3Url.parse(str(path), key="path") if objstore.is_url(path) \
            else manifest_path(path).parent
        env_rank, env_world = _env_rank() if rank is None or world_size is None else (rank, world_size)
        self.rank = env_rank if rank is None else rank
        self.world_size = env_world if world_size is None else world_size
        if not 0 <= self.rank < self.world_size:
            raise UsageError(f"rank {self.rank} is outside world size {self.world_size}",
                             key="rank" if rank is not None else "world_size")
        self._given = frozenset(k for k, v in (("block_bytes", block_bytes), ("window", window)) if v is not None)
        remote = isinstance(self.root, objstore.S3Url) or any(objstore.is_url(s.name) for s in self.manifest.shards)
        default_block = OBJECT_BLOCK_BYTES if remote else BLOCK_BYTES
        self.layout = order.Layout(seed=seed, shuffle=shuffle,
                                   block_bytes=default_block if block_bytes is None else block_bytes,
                                   window=WINDOW if window is None else window, drop_last=drop_last)
        bad = tuning_problem(self.layout.block_bytes, self.layout.window)
        if bad is not None:
            raise UsageError(bad[1], key=bad[0])
        if read_threads is not None and read_threads < 1:
            raise UsageError(f"must be at least 1, got {read_threads}", key="read_threads")
        #: reads that wait on something other than the disk: each process keeps READ_THREADS
        self._reads_per_process = remote or any(s.compression for s in self.manifest.shards)
        self.read_threads, self.on_corrupt, self.decode = read_threads, on_corrupt, decode
        self.epoch = 0
        self.position = 0               # samples of this epoch already delivered on this rank
        self._workers, self._batch = 1, 1
        self._resumed = self._hold = False   # set_epoch(the state's epoch) right after a resume
        self.skipped = 0                # samples skipped as corrupt (on_corrupt="skip")
        self.reads = self.read_bytes = 0   # read calls and bytes of this process (for benchmarks)
        self._counts = [s.samples for s in self.manifest.shards]
        # a compressed shard is read whole (decompressed from its start), so it is one block:
        # a size of 0 makes order.blocks keep all its samples together
        self._sizes = [0 if s.compression else s.bytes for s in self.manifest.shards]
        self._held: int | None = None    # the shards' real bytes, once asked (``_plan_problem``)
        bad_plan = self._plan_problem(self.layout.block_bytes)
        if bad_plan is not None:
            raise UsageError(bad_plan, file=self._manifest_where(), key="shards")

    def _manifest_where(self) -> str:
        root = self.root
        return objstore.url_of(root.bucket, root.key("manifest.json")) if isinstance(root, objstore.S3Url) \
            else str(root / "manifest.json")

    def _plan_problem(self, block_bytes: int) -> str | None:
        """Why an epoch's plan at ``block_bytes`` would not fit the real data, or None.

        The plan holds a tuple per block of the whole dataset, cut from the manifest's counts
        and sizes before any index is read (``order.blocks``). The manifest is a file, so
        those are claims: a shard that claims a billion samples and a petabyte is a billion
        blocks. The plan's size is counted first (``order.block_count``, nothing built); up
        to ``PLAN_FREE_BLOCKS`` it is built without asking the storage, beyond only if the
        shards' real bytes can fill it: an honest manifest cuts a shard of B bytes into at
        most 1.5 B / block_bytes + 1 blocks, so twice what the bytes on disk allow (plus the
        free allowance, which also covers shards cut short) is refused. One ``stat`` per
        shard, or one LIST per object prefix, and only for a set that large. The counts
        themselves are checked against each index as it is loaded (``index.index_of``)."""
        blocks = order.block_count(self._counts, self._sizes, block_bytes)
        if blocks <= PLAN_FREE_BLOCKS:
            return None
        if self._held is None:
            self._held = sum(_real_bytes(self.root, [s.name for s in self.manifest.shards]))
        fill = 2 * (self._held // block_bytes + len(self._counts)) + PLAN_FREE_BLOCKS
        if blocks <= fill:
            return None
        return (f"its {len(self._counts):,} shards would be read in {blocks:,} blocks of {block_bytes:,} bytes, "
                f"more than the {self._held:,} bytes they hold can fill: the manifest's sample counts or sizes are "
                "not its shards' (index the shards again)")

    # -- plan and state -------------------------------------------------------------------
    def __len__(self) -> int:
        return order.per_rank(sum(self._counts), self.world_size, self.layout.drop_last)

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` (its first sample), or keep the position when it is the current
        one. Right after ``load_state_dict`` of a state taken at the end of that epoch, the
        epoch stays finished (the next iteration yields nothing) instead of rolling on to the
        next epoch: the training loop's epoch number and the data's stay the same."""
        if epoch != self.epoch:
            self.epoch, self.position = epoch, 0
        elif self._resumed:
            self._hold = True

    def plan(self, workers: int = 1, batch: int = 1) -> order.RankPlan:
        return order.rank_plan(self._counts, self._sizes, self.layout, self.epoch, self.rank,
                               self.world_size, max(1, workers), max(1, batch))

    def state_dict(self) -> dict:
        return {"schema": STATE_SCHEMA, "dataset": self.manifest.dataset, "epoch": self.epoch,
                "position": self.position, "samples": len(self), "rank": self.rank,
                "world_size": self.world_size, "workers": self._workers, "batch_size": self._batch,
                "layout": dict(self.layout.__dict__)}

    def load_state_dict(self, state: dict) -> None:
        """Resume exactly where ``state`` was taken; refuse a state of another run. A state
        of another world size resumes only at an epoch boundary (``resize_problem``): the
        epoch it was in, at its start or finished."""
        legacy = isinstance(state, dict) and "schema" not in state and state.get("format") == LEGACY_STATE_FORMAT
        if not legacy:
            try:
                check(state, STATE_SCHEMA, "resume state")
            except UsageError as exc:     # a newer hpcml's state is refused, not misread
                raise ResumeStateError(exc.problem, key="schema") from None
        if state.get("dataset") != self.manifest.dataset:
            raise ResumeStateError(f"state is of dataset {str(state.get('dataset'))[:80]!r}, this is "
                                   f"{self.manifest.dataset}", key="dataset")
        _check_numbers(state)
        layout = self._resumed_layout(state.get("layout"))
        mine = {**self.state_dict(), "layout": dict(layout.__dict__)}
        resized = state["world_size"] != mine["world_size"]
        if resized:
            old = order.per_rank(sum(self._counts), state["world_size"], self.layout.drop_last)
            problem = resize_problem(state, old)
            if problem:
                raise ResumeStateError(f"state has {state['world_size']}, this reader {mine['world_size']}: {problem}",
                                       key="world_size")
        for key in ("layout",) if resized else ("rank", "world_size", "layout"):
            if state.get(key) != mine[key]:
                raise ResumeStateError(self._differ(key, state.get(key), mine[key]), key=key)
        n = order.per_rank(sum(self._counts), state["world_size"], layout.drop_last) if resized else len(self)
        if state["position"] > n:
            raise ResumeStateError(f"{state['position']:,} is beyond the {n:,} samples of rank {state['rank']} "
                                   "in an epoch", key="position")
        self.layout = layout
        self.epoch, self.position = state["epoch"], state["position"]
        if resized and self.position:
            self.position = len(self)            # the epoch was finished: finished here too
        self._workers, self._batch = state.get("workers", 1), state.get("batch_size", 1)
        self._resumed, self._hold = True, False

    def _resumed_layout(self, theirs: Any) -> order.Layout:
        """This reader's layout with the state's tuning settings (``TUNING``) where this
        reader was not given them: the order they made is the one the state continues."""
        if not isinstance(theirs, dict):
            return self.layout
        take = {k: theirs[k] for k in TUNING if k not in self._given and type(theirs.get(k)) is int
                and theirs[k] >= 1 and theirs[k] != getattr(self.layout, k)}
        if not take:
            return self.layout
        layout = dataclasses.replace(self.layout, **take)
        bad = tuning_problem(layout.block_bytes, layout.window)
        if bad is not None:
            raise ResumeStateError(f"state has {bad[0]} {bad[1]}", key="layout")
        plan = self._plan_problem(layout.block_bytes)     # smaller blocks: more of them
        if plan is not None:
            raise ResumeStateError(f"state has block_bytes {layout.block_bytes}: {plan}", key="layout")
        return layout

    def _differ(self, key: str, theirs: Any, ours: Any) -> str:
        """One line: what of ``key`` differs between the state and this reader."""
        if isinstance(theirs, dict) and isinstance(ours, dict):
            keys = [k for k in (*ours, *(k for k in theirs if k not in ours)) if theirs.get(k) != ours.get(k)]
            given = [k for k in keys if k in self._given]
            return (f"state has {', '.join(f'{k}={theirs.get(k)!r}' for k in keys)}, this reader "
                    f"{', '.join(f'{k}={ours.get(k)!r}' for k in keys)}"
                    f"{' (given explicitly: ' + ', '.join(given) + ')' if given else ''}: the order would differ")
        return f"state has {theirs!r}, this reader {ours!r}: the order would differ"

    def resume_problem(self, workers: int, batch: int) -> ResumeStateError | None:
        """Mid-epoch, the loader must deal batches as when the state was taken: the plan
        (which worker reads which batch) and the position's batch count depend on both."""
        workers, batch = max(1, workers), max(1, batch)
        if not 0 < self.position < len(self) or (self._workers, self._batch) == (workers, batch):
            return None
        return ResumeStateError(f"state was taken with {self._workers} workers and batch size {self._batch}, this "
                                f"loader has {workers} and {batch}; resume mid-epoch with the same",
                                key="workers" if self._workers != workers else "batch_size")

    def begin(self, workers: int, batch: int) -> None:
        """Start an iteration: after a finished epoch the next one begins (a new order
        even without ``set_epoch``); mid-epoch, the loader must deal batches as when the
        state was taken."""
        workers, batch = max(1, workers), max(1, batch)
        if self.position >= len(self) > 0 and not self._hold:
            self.epoch, self.position = self.epoch + 1, 0
        self._resumed = self._hold = False
        problem = self.resume_problem(workers, batch)
        if problem is not None:
            raise problem
        self._workers, self._batch = workers, batch

    # -- reading --------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        """Iterate in this process (no loader workers), counting what was delivered."""
        self.begin(1, self._batch)
        n = len(self)
        for sample in self.stream(0, 1, self._batch):
            self.position = min(self.position + 1, n)
            yield sample
        self.position = n

    def stream(self, worker: int, workers: int, batch: int) -> Iterator[Any]:
        """What loader worker ``worker`` of ``workers`` yields, from the current position.

        After a mid-epoch resume the loader starts its round robin at worker 0 again, so
        worker ``p`` plays the planned stream ``(p + k) % W`` where ``k`` is the next batch.
        """
        workers, batch = max(1, workers), max(1, batch)
        plan = self.plan(workers, batch)
        k = self.position // batch
        logical = (worker + k) % workers if self.position < plan.samples else worker
        skip = order.consumed_per_stream(self.position, plan.samples, batch, workers)[logical]
        return self._read_windows(plan.streams[logical], skip, self.threads(workers))

    def threads(self, workers: int) -> int:
        """Read threads of each of ``workers`` reading processes: ``read_threads`` where
        given, else ``READ_THREADS`` shared by the workers from files (at least 2 each, so a
        read overlaps the next), all of it each from an object store or compressed shards."""
        if self.read_threads is not None:
            return max(1, self.read_threads)
        return READ_THREADS if self._reads_per_process else max(2, READ_THREADS // max(1, workers))

    def _read_windows(self, windows: list[order.Window], skip: int, threads: int) -> Iterator[Any]:
        while windows and skip >= len(windows[0]):
            skip -= len(windows[0])
            windows = windows[1:]
        if not windows:
            return
        shards = _Shards(self.root, [s.name for s in self.manifest.shards],
                         [s.index for s in self.manifest.shards], keep=max(64, 4 * self.layout.window),
                         compression=[s.compression for s in self.manifest.shards],
                         sizes=[s.bytes for s in self.manifest.shards], counts=self._counts)
        closer = _closer_queue()                # made here, where starting a thread is safe
        finished = False
        own: set[int] = set()                   # the idents of this stream's own threads
        pool = ThreadPoolExecutor(max_workers=threads, initializer=lambda: own.add(threading.get_ident()))
        # The first window is all wait (nothing to yield yet): its reads go at the full
        # READ_THREADS however many workers share the rank's reads after it.
        wide = max(threads, self.read_threads or READ_THREADS)
        first = pool if wide == threads else ThreadPoolExecutor(max_workers=wide, initializer=lambda: own.add(threading.get_ident()))
        hints = ThreadPoolExecutor(max_workers=1, initializer=lambda: own.add(threading.get_ident()))
        try:
            # Reads run one window ahead of what is yielded, hints two: the kernel's queue
            # never drains at a window's end (that tail cost a tenth of the throughput).
            # Each hint waits for the reads of the window before it, so the disk delivers
            # windows in the order they are yielded, and runs on its own thread: queueing
            # 128 MiB (page-cache allocation) held the yielding thread ~25 ms a window.
            hints.submit(shards.advise, windows[0].pieces)
            pending = [first.submit(shards.read, p) for p in windows[0].pieces]
            if len(windows) > 1:
                hints.submit(shards.advise, windows[1].pieces, pending)
            for i, win in enumerate(windows):
                bufs = [f.result() for f in pending]
                if i == 0 and first is not pool:
                    first.shutdown(wait=False)
                nxt = windows[i + 1].pieces if i + 1 < len(windows) else []
                pending = [pool.submit(shards.read, p) for p in nxt]
                if i + 2 < len(windows):
                    hints.submit(shards.advise, windows[i + 2].pieces, pending)
                if not nxt:      # nothing left to read: the spare buffers go now, not at
                    shards.free.clear()          # the stream's end, where the last batch waits
                yield from self._window_samples(shards, win, bufs, skip)
                if nxt:
                    shards.give([b for _start, _view, b in bufs])
                skip = 0
            finished = True
        finally:
            def close() -> None:
                first.shutdown(wait=True, cancel_futures=True)
                pool.shutdown(wait=True, cancel_futures=True)
                hints.shutdown(wait=True, cancel_futures=True)
                shards.close()
                self.reads += shards.reads
                self.read_bytes += shards.read_bytes
            # A stream read to its end is closed here; one left unfinished (broken out of, an
            # error, the garbage collector) by the closer thread (``_closer_queue``: here may
            # be inside threading's own locks, or in one of this stream's threads).
            if finished and threading.get_ident() not in own:
                close()
            else:
                closer.put(close)

    def _window_samples(self, shards: _Shards, win: order.Window, bufs, skip: int) -> Iterator[Any]:
        counts = np.array([hi - lo for _s, lo, hi in win.pieces])
        first = np.concatenate(([0], np.cumsum(counts)[:-1]))
        which = np.repeat(np.arange(len(counts)), counts)
        sources = [(s, lo, shards.index(s), start, view) for (s, lo, _hi), (start, view, _b) in zip(win.pieces, bufs)]
        decode = self.decode
        for j in win.order[skip:].tolist():
            p = which[j]
            s, lo, idx, base, buf = sources[p]
            i = lo + j - int(first[p])
            out: dict[str, Any] = {"__key__": idx.keys[i], "__shard__": shards.names[s], "__index__": i}
            for ext, doff, size in idx.members[i]:
                rel = doff - base
                problem: str | None
                if rel + size > len(buf):
                    problem = f"truncated: the shard ends before this sample's '{ext}' ({size} bytes)"
                else:
                    problem = header_problem(buf, rel - BLOCK, size)
                if problem:
                    self._corrupt(shards.path(s), doff - BLOCK, f"{problem} (sample {idx.keys[i]!r})")
                    break
                out[ext] = bytes(buf[rel:rel + size])
            else:                              # no corrupt member: the sample is whole
                yield decode(out) if decode else out

    def _corrupt(self, shard: Path | str, offset: int, problem: str) -> None:
        if self.on_corrupt == "raise":
            raise CorruptShardError(shard, offset, problem)
        if not self.skipped:
            warnings.warn(f"{shard}: offset {offset}: {problem}; skipping corrupt samples", stacklevel=2)
        self.skipped += 1
        return None
