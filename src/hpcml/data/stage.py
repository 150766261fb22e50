"""Staging a shard set to node-local storage: copy once, verify against the manifest, reuse.

One pass per file reads the shared copy in large chunks, hashes and writes it (the read
from the parallel filesystem is what costs, so it is done once), into a temporary name
that is renamed only when the sha256 matches the manifest. ``shutil.copyfile`` and
``copy_file_range`` copy without showing the bytes to the hash, hence the loop here.

Staged files are recorded in a stamp (``.hpcml-stage.json``: size, mtime and sha256 of
each copy), so a rerun skips them after a ``stat``, without re-reading them. Everything
happens under an exclusive ``flock`` on the dataset's directory: tasks of one node (and
virtual nodes sharing a directory) queue on it, the first copies and the others find the
files stamped. A lock dies with its holder, so nothing stale can block a later job, unlike
a completion marker keyed by job id (local clusters reuse job ids after a restart).
The manifest is written last: a directory with a manifest is a complete copy.

A directory of memmapped token arrays (nanoGPT's ``train.bin``/``val.bin`` and
``meta.pkl``, Megatron's ``.bin``/``.idx`` pairs, a Hugging Face dataset's Arrow files: the
doctor's ``token_arrays``) has no manifest and is never packed: its files are staged as they
are, under their relative names, each hashed as it is copied (the stamp keeps the sha256, and
``--verify`` re-hashes the copy against it), the source's size and mtime checked after the
copy (a file that changed while it was read is refused) and kept in the stamp, so a rerun
copies again exactly the files that changed. Its dataset id comes from those names, sizes
and mtimes. No link is followed and no hidden file is copied.

Without ``--to`` the copy goes where ``hpcml data doctor`` advises (``advise``): RAM
(/dev/shm, or ``$HPCML_DATA_RAM_DIR``) when it fits in the doctor's RAM budget, else the
node-local disk ($SLURM_TMPDIR, else $TMPDIR/hpcml-data-JOB), else nowhere: the job
streams. These default copies are named by job, and ``cleanup`` removes them at the job's
end (``hpcml data stage --cleanup``: the batch script's last line, or an epilog); only
$SLURM_TMPDIR is removed by Slurm itself. A ``--to`` of your own is a cache you keep.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import re
import shutil
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping

import orjson

from hpcml import objstore, scratch
from hpcml.cluster.allocation import this_node
from hpcml.data.manifest import (
    MANIFEST,
    Manifest,
    dataset_id,
    load_manifest,
    manifest_bytes,
    manifest_path,
)
from hpcml.errors import HpcmlError, UsageError
from hpcml.files import JSON_MAX, load_json_bounded, write_atomic

CHUNK = 8 << 20
THREADS = 4
STAMP = ".hpcml-stage.json"
LOCK = ".hpcml-stage.lock"
KEEP_FRACTION = 0.05          # of the target filesystem, kept free ...
KEEP_BYTES = 1 << 30          # ... or this much, whichever is smaller
RUNS_KEPT = 50
RAM_DIR, RAM_DIR_ENV = "/dev/shm", "HPCML_DATA_RAM_DIR"
_VAR = re.compile(r"\$(?:\{([A-Za-z_]\w*)\}|([A-Za-z_]\w*))")


class TargetUnavailable(HpcmlError):
    """DIR cannot be resolved on this node: the job streams from the source instead."""


@dataclass
class StageResult:
    """One node's (one task's) staging: what the job should read, and what it cost."""

    node: str
    src: str                        # the shard-set directory
    path: str                       # what to read: the staged copy, or ``src`` on fallback
    target: str | None              # DIR/<dataset>, None when DIR could not be resolved
    dataset: str
    staged: bool
    reason: str = ""                # why it fell back to streaming
    note: str = ""                  # e.g. the target's variable was unset, the default was used
    placement: str = "given"        # ram | local-disk | stream (the doctor's advice), given (--to)
    files_copied: int = 0
    files_skipped: int = 0
    files_verified: int = 0         # hashed in place and found valid (counted as skipped)
    bytes_copied: int = 0
    bytes_total: int = 0
    needed: int = 0                 # bytes to copy, as planned
    free: int = 0                   # free bytes on the target before copying
    keep_free: int = 0
    seconds: float = 0.0
    waited: float = 0.0             # for the lock held by another task of this node
    job: str | None = None
    step: str | None = None
    task: int = 0

    @property
    def mb_per_s(self) -> float:
        return self.bytes_copied / self.seconds / 1e6 if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "mb_per_s": round(self.mb_per_s, 1), "seconds": round(self.seconds, 3),
                "waited": round(self.waited, 3)}


@dataclass
class _File:
    name: str
    bytes: int
    sha256: str | None              # the manifest's, for shards; None for indexes
    action: str = "copy"            # copy | check | skip
    src_stat: tuple[int, int] | None = None
    src: str = ""                   # where it is read, when not ``name`` beside the manifest


@dataclass
class _Run:
    src: Path
    dst: Path
    stamp: dict
    advance: Callable[[int], None]
    tag: str
    bad: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    copied: int = 0
    verified: int = 0
    bytes_copied: int = 0


# --- where -----------------------------------------------------------------------------

def default_dir(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    if env.get("SLURM_TMPDIR"):
        return env["SLURM_TMPDIR"]
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    tmp = env.get("TMPDIR") or "/tmp"
    return f"{tmp}/hpcml-data-{job}" if job else f"{tmp}/hpcml-data"


def _job(env: Mapping[str, str]) -> str | None:
    return env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")


def _ram_dir(env: Mapping[str, str]) -> str:
    return env.get(RAM_DIR_ENV) or RAM_DIR


@dataclass
class Placement:
    kind: str                       # ram | local-disk | stream
    to: str | None                  # the target DIR; None: stream from the source
    reason: str


def advise(nbytes: int, env: Mapping[str, str] | None = None) -> Placement:
    """Where a copy of ``nbytes`` goes without ``--to``: ``hpcml data doctor``'s placement
    for this node (one copy per node, shared by its tasks)."""
    from hpcml.data.doctor import detect_resources, place
    env = os.environ if env is None else env
    local = next((d for d in (env.get("SLURM_TMPDIR"), env.get("TMPDIR"), "/tmp") if d and os.path.isdir(d)), "/tmp")
    ram = _ram_dir(env)
    res = detect_resources(local_dir=local, ram_dir=ram, **({} if os.path.isdir(ram) else {"ram_free": 0}))
    kind, _, why = place(nbytes, res)
    job = _job(env)
    to = {"ram": f"{ram}/hpcml-data-{job}" if job else f"{ram}/hpcml-data",
          "local-disk": default_dir(env)}.get(kind)
    return Placement(kind, to, why)


def cleanup(env: Mapping[str, str] | None = None) -> list[str]:
    """Remove this job's default copies on this node (RAM and local disk, ``hpcml-data-JOB``;
    without a job ``hpcml-data``); returns what was removed."""
    env = os.environ if env is None else env
    job = _job(env)
    name = f"hpcml-data-{job}" if job else "hpcml-data"
    removed = []
    for root in dict.fromkeys((_ram_dir(env), env.get("TMPDIR") or "/tmp", "/tmp")):
        d = Path(root) / name
        gone = d.with_name(f".{name}.removing.{os.getpid()}")
        try:
            os.rename(d, gone)          # one remover wins where nodes share the directory
            if gone.is_symlink():
                gone.unlink()
            else:
                shutil.rmtree(gone)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise HpcmlError(f"{d}: cannot remove the staged copy: {exc.strerror}") from None
        removed.append(str(d))
    return removed


def resolve_dir(template: str | None, env: Mapping[str, str] | None = None) -> Path:
    """DIR on this node: ``$VARS`` and ``~`` expanded here (so ``--to '$SLURM_TMPDIR'`` means
    each node's own), ``%n`` the node name, ``%j`` the job id, ``%%`` a percent sign.
    TargetUnavailable when a variable is not set."""
    env = os.environ if env is None else env
    raw = template if template else default_dir(env)
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or "local"
    text = re.sub(r"%([nj%])", lambda m: {"n": this_node(env), "j": job, "%": "%"}[m.group(1)], raw)
    unset = []

    def var(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        if not env.get(name):
            unset.append(name)
        return env.get(name, "")
    text = _VAR.sub(var, text)
    if unset:
        raise TargetUnavailable(f"{unset[0]} is not set (target '{raw}')")
    return Path(os.path.abspath(os.path.expanduser(text)))


def source_dir(src: str | Path) -> Path:
    return Path(os.path.abspath(manifest_path(src))).parent


def source_of(src: str | Path) -> str:
    """What the tasks read when they stream: the shard set's directory, or its s3:// prefix."""
    return str(src).rstrip("/") if objstore.is_url(src) else str(source_dir(src))


# --- what -----------------------------------------------------------------------------

def _plain_name(name: str, key: str, manifest: Path) -> str:
    if not name or name != Path(name).name or name.startswith("."):
        raise UsageError(f"not a plain file name: {name!r}", file=str(manifest), key=key)
    return name


def _object_files(m: Manifest, url: objstore.S3Url) -> list[_File]:
    """A shard set whose manifest is in an object store: its shards and indexes, each read
    by a streamed GET (an index's size and ETag stand for a file's size and mtime)."""
    s3 = objstore.client()
    listed = {k: (n, tag) for k, n, tag in objstore.list_objects(s3, url)}
    out = []
    for i, s in enumerate(m.shards):
        bucket, key = objstore.locate(url, s.name)
        if bucket != url.bucket:                  # a manifest in a bucket names its own bucket's objects only
            raise UsageError(f"names a shard in another bucket ({s.name}): not staged",
                             file=objstore.url_of(url.bucket, url.key(MANIFEST)))
        out.append(_File(_plain_name(key.rsplit("/", 1)[-1], f"shards.{i}.name", Path(str(url))), s.bytes, s.sha256,
                         src=objstore.url_of(bucket, key)))
        ibucket, ikey = objstore.locate(url, s.index)
        if ikey not in listed:
            raise UsageError("shard index missing", file=objstore.url_of(ibucket, ikey))
        size, tag = listed[ikey]
        out.append(_File(_plain_name(s.index, f"shards.{i}.index", Path(str(url))), size, None,
                         src_stat=(size, int(hashlib.sha256(tag.encode()).hexdigest()[:15], 16)),
                         src=objstore.url_of(ibucket, ikey)))
    return out


class _ObjectReader:
    """A streamed GET read as a file: ``readinto`` over botocore's body."""

    def __init__(self, url: str) -> None:
        u = objstore.S3Url.parse(url)
        self.url = url
        try:
            self.body = objstore.client().get_object(Bucket=u.bucket, Key=u.prefix)["Body"]
        except objstore.errors() as exc:
            raise objstore.problem(exc, url) from None

    def readinto(self, buf: bytearray | memoryview) -> int:
        try:
            data = self.body.read(len(buf))
        except objstore.errors() as exc:
            raise objstore.problem(exc, self.url) from None
        buf[:len(data)] = data
        return len(data)

    def __enter__(self) -> _ObjectReader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.body.close()


def _files(m: Manifest, src: Path) -> list[_File]:
    mpath = src / MANIFEST
    out = []
    for i, s in enumerate(m.shards):
        if objstore.is_url(s.name):      # indexed into a directory from an object store: copied beside it
            out.append(_File(_plain_name(s.name.rsplit("/", 1)[-1], f"shards.{i}.name", mpath), s.bytes, s.sha256,
                             src=s.name))
        elif os.path.isabs(s.name):       # indexed elsewhere (hpcml data index --out): copied beside the manifest
            out.append(_File(_plain_name(Path(s.name).name, f"shards.{i}.name", mpath), s.bytes, s.sha256,
                             src=s.name))
        else:
            out.append(_File(_plain_name(s.name, f"shards.{i}.name", mpath), s.bytes, s.sha256))
        idx = _plain_name(s.index, f"shards.{i}.index", mpath)
        try:
            st = (src / idx).stat()
        except OSError as exc:
            raise UsageError(f"shard index unreadable: {exc.strerror}", file=str(src / idx)) from None
        out.append(_File(idx, st.st_size, None, src_stat=(st.st_size, st.st_mtime_ns)))
    return out


ARRAY_FILES_MAX = 10_000      # files in a token-array directory staged as it is (more: per-sample files)


def _array_source(src: Path) -> tuple[str, list[_File], list[str]] | None:
    """A directory of memmapped token arrays without a manifest (``hpcml data doctor``'s
    judgement): (its dataset id, its files, the entries not staged: links, special files),
    or None where it is not one."""
    from hpcml.data.doctor import scan, token_arrays
    if not src.is_dir() or (src / MANIFEST).exists() or not token_arrays(scan(src, jobs=4)):
        return None
    files: list[_File] = []
    left: list[str] = []
    h = hashlib.sha256()
    for here, dirs, names in os.walk(src):                  # links to directories are not walked
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            if name.startswith("."):                        # a stamp, a lock, a part of an earlier copy
                continue
            path = Path(here) / name
            rel = path.relative_to(src).as_posix()
            try:
                st = os.lstat(path)
            except OSError as exc:
                raise UsageError(f"cannot read: {exc.strerror}", file=str(path)) from None
            if not stat.S_ISREG(st.st_mode):
                left.append(rel)
                continue
            files.append(_File(rel, st.st_size, None, src_stat=(st.st_size, st.st_mtime_ns)))
            h.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
            if len(files) > ARRAY_FILES_MAX:
                raise UsageError(f"more than {ARRAY_FILES_MAX:,} files: not a directory of token arrays to stage "
                                 "as it is (hpcml data doctor says how to read it)", file=str(src))
    return "arrays-" + h.hexdigest()[:16], files, left


def source_bytes(src: str | Path) -> int:
    """The bytes ``stage`` would copy from ``src``: a shard set's, or a token-array directory's."""
    if objstore.is_url(src):
        return sum(sh.bytes for sh in load_manifest(str(src)).shards)
    arrays = _array_source(Path(src)) if not manifest_path(src).exists() else None
    if arrays is not None:
        return sum(f.bytes for f in arrays[1])
    return sum(sh.bytes for sh in load_manifest(src).shards)


def _staged_manifest(m: Manifest, srcdir: Path) -> bytes:
    """The copy's manifest: the source's bytes, or, where it names shards elsewhere by
    their path, the same manifest naming their copies beside it (same dataset id)."""
    if not any(os.path.isabs(s.name) or objstore.is_url(s.name) for s in m.shards):
        return (srcdir / MANIFEST).read_bytes()
    return _local_manifest(m)


def _local_manifest(m: Manifest) -> bytes:
    """``m`` naming each shard by its base name: the copies beside the staged manifest."""
    return manifest_bytes(m.model_copy(update={"shards": [s.model_copy(update={"name": s.name.rsplit("/", 1)[-1]})
                                                         for s in m.shards]}))


def _plan(files: list[_File], dst: Path, stamp: dict, verify: bool) -> None:
    """Decide per file: skip (stamped, unchanged), check (right size: hash in place), copy."""
    for f in files:
        try:
            st = (dst / f.name).stat()
        except FileNotFoundError:
            continue
        e = stamp.get(f.name) or {}
        same_copy = e.get("bytes") == st.st_size == f.bytes and e.get("mtime_ns") == st.st_mtime_ns
        if f.sha256 is not None:
            valid = same_copy and e.get("sha256") == f.sha256
        else:
            valid = same_copy and e.get("src") == list(f.src_stat or ())
        if valid and not verify:
            f.action = "skip"
        elif st.st_size == f.bytes and (f.sha256 is not None or valid):
            f.action = "check"
        else:
            (dst / f.name).unlink()          # wrong size, or an index whose source changed


# --- how -------------------------------------------------------------------------------

def _sha_of(path: Path, advance: Callable[[int], None]) -> str:
    h, buf = hashlib.sha256(), bytearray(CHUNK)
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(buf):
            h.update(memoryview(buf)[:n])
            advance(n)
    return h.hexdigest()


def _entry(path: Path, sha: str, f: _File) -> dict:
    st = path.stat()
    e = {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha}
    if f.src_stat:
        e["src"] = list(f.src_stat)
    return e


def _copy(run: _Run, f: _File) -> None:
    remote = objstore.is_url(f.src)
    src, dst = (f.src if remote else Path(f.src)) if f.src else run.src / f.name, run.dst / f.name
    dst.parent.mkdir(parents=True, exist_ok=True)            # a token array in a subdirectory (HF's train/)
    tmp = dst.parent / f".{dst.name}.{run.tag}.part"
    h, buf, n_total = hashlib.sha256(), bytearray(CHUNK), 0
    try:
        fi: Any = _ObjectReader(f.src) if remote else open(src, "rb", buffering=0)
    except OSError as exc:
        raise UsageError(f"cannot read: {exc.strerror}", file=str(src)) from None
    # nameless (``scratch``): a stage killed mid-copy leaves no partial shard on the node's
    # disk; where the filesystem cannot, under ``tmp``, which the next stage here removes
    nameless = scratch.anonymous(run.dst, 0o666, to_publish=True)   # as open(): the umask narrows
    try:
        with fi, (os.fdopen(nameless, "wb", buffering=0, closefd=False) if nameless is not None
                  else open(tmp, "wb", buffering=0)) as fo:
            while True:
                try:
                    n = fi.readinto(buf)
                except OSError as exc:
                    raise UsageError(f"cannot read: {exc.strerror}", file=str(src)) from None
                if not n:
                    break
                view = memoryview(buf)[:n]
                h.update(view)
                fo.write(view)
                n_total += n
                run.advance(n)
        sha = h.hexdigest()
        if f.sha256 is not None and (sha != f.sha256 or n_total != f.bytes):
            with run.lock:
                run.bad.append(f"{src}: sha256 {sha[:12]}... ({n_total} bytes), {MANIFEST} says "
                               f"{f.sha256[:12]}... ({f.bytes} bytes)")
            tmp.unlink(missing_ok=True)
            return
        if f.sha256 is None and f.src_stat is not None and not remote and _stat_of(Path(src)) != f.src_stat:
            with run.lock:
                run.bad.append(f"{src}: changed while it was copied (size or mtime); stage again once it is written")
            tmp.unlink(missing_ok=True)
            return
        if nameless is not None:
            scratch.replace_with(nameless, dst, tmp, mode=0o666, exact=False)
        else:
            os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        if nameless is not None:
            os.close(nameless)
    with run.lock:
        run.stamp[f.name] = _entry(dst, sha, f)
        run.copied += 1
        run.bytes_copied += n_total


def _stat_of(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns)


def _one(run: _Run, f: _File) -> None:
    if f.action == "check":
        path = run.dst / f.name
        sha = _sha_of(path, run.advance)
        want = f.sha256 if f.sha256 is not None else (run.stamp.get(f.name) or {}).get("sha256")
        if sha == want:
            with run.lock:
                run.stamp[f.name] = _entry(path, sha, f)
                run.verified += 1
            return
        path.unlink(missing_ok=True)
    _copy(run, f)


def _free(dst: Path, keep: int | None) -> tuple[int, int]:
    st = os.statvfs(dst)
    free = st.f_bavail * st.f_frsize
    if keep is None:
        keep = int(min(KEEP_FRACTION * st.f_blocks * st.f_frsize, KEEP_BYTES))
    return free, keep


def _read_stamp(path: Path, dataset: str) -> dict:
    try:
        doc = load_json_bounded(path, JSON_MAX, loads=orjson.loads)
    except (OSError, ValueError):
        return {"dataset": dataset, "files": {}, "runs": []}
    if not isinstance(doc, dict) or doc.get("dataset") != dataset or not isinstance(doc.get("files"), dict):
        return {"dataset": dataset, "files": {}, "runs": []}
    doc.setdefault("runs", [])
    return doc


def _owned_here(dst: Path, base: Path) -> None:
    """The dataset's directory is a directory of this user's right under ``base``: not a
    symlink someone planted in a shared temp directory (the default target's name is known
    in advance), nor another user's. ``OSError`` (said as the target's problem) otherwise."""
    import errno
    st = os.lstat(dst)
    if dst.parent.resolve() != base.resolve() or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise OSError(errno.EPERM, "not a directory of this user's under the target (a symlink, or another "
                      "user's)", str(dst))


def _locked(path: Path, timeout: float | None) -> int:
    fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o644)     # a planted link is not followed
    if timeout is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd
    end = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > end:
                os.close(fd)
                raise HpcmlError(f"{path}: another task held the staging lock for more than "
                                 f"{timeout:g} s") from None
            time.sleep(0.2)


def _clean_parts(dst: Path) -> None:
    """Temporary copies left by a task that died (we hold the lock: none is in flight)."""
    for p in dst.rglob(".*.part"):                           # token arrays' subdirectories too
        p.unlink(missing_ok=True)


def stage(src: str | Path, to: str | None = None, *, threads: int = THREADS, verify: bool = False,
          keep_free: int | None = None, lock_timeout: float | None = None,
          env: Mapping[str, str] | None = None, on_plan: Callable[[int], None] | None = None,
          advance: Callable[[int], None] = lambda n: None) -> StageResult:
    """Stage the shard set ``src`` on this node into ``to``/<dataset id>.

    Returns a result with ``staged=False`` and the reason when the copy does not fit or the
    target cannot be used (the job then reads ``src``); raises UsageError (exit 2) for a bad
    manifest, a missing source file or a checksum mismatch, naming the file.
    ``on_plan(bytes)`` announces the bytes to read (copies and in-place checks).
    """
    env = os.environ if env is None else env
    t0 = time.monotonic()
    remote = objstore.is_url(src)
    arrays = _array_source(Path(src)) if not remote and not manifest_path(src).exists() else None
    if arrays is not None:                        # token arrays: staged as they are, no manifest
        srcdir = Path(os.path.abspath(src))
        ds, files, left = arrays
        manifest_bytes = b""
    elif remote:                                  # a shard set in an object store: GETs, checked alike
        url = objstore.S3Url.parse(str(src), key="SRC")
        m = load_manifest(str(url))
        srcdir = Path(str(url))
        ds = m.dataset or dataset_id(m.shards)
        files = _object_files(m, url)
        manifest_bytes = _local_manifest(m)      # the one validated, naming the copies beside it
        left = []
    else:
        m = load_manifest(src)
        srcdir = source_dir(src)
        ds = m.dataset or dataset_id(m.shards)
        files = _files(m, srcdir)
        manifest_bytes = _staged_manifest(m, srcdir)
        left = []
    where = str(src).rstrip("/") if remote else str(srcdir)
    res = StageResult(node=this_node(env), src=where, path=where, target=None, dataset=ds,
                      staged=False, bytes_total=sum(f.bytes for f in files) + len(manifest_bytes),
                      job=env.get("SLURM_JOB_ID"), step=env.get("SLURM_STEP_ID"),
                      task=int(env.get("SLURM_LOCALID") or 0))
    if arrays is not None:
        res.note = (f"memmapped token arrays, staged as they are ({len(files)} files"
                    + (f"; not staged: {len(left)} links or special files, e.g. {left[0]}" if left else "") + ")")
    if not to:
        advice = advise(res.bytes_total, env)
        res.placement = advice.kind
        res.note = "; ".join(filter(None, [res.note, f"placed as hpcml data doctor advises: {advice.reason}"]))
        if advice.to is None:
            res.reason = "the doctor advises streaming (give --to DIR to stage anyway)"
            return res
        to = advice.to
    try:
        try:
            base = resolve_dir(to, env)
        except TargetUnavailable as exc:
            base = resolve_dir(None, env)                 # the default: $SLURM_TMPDIR, else /tmp/hpcml-data-JOB
            res.note = f"{exc}; staged to the default {base} instead"
        dst = base / ds
        res.target = str(dst)
        dst.mkdir(parents=True, exist_ok=True)
        _owned_here(dst, base)
        fd = _locked(dst / LOCK, lock_timeout)
    except TargetUnavailable as exc:
        res.reason = f"cannot use the target: {exc}"
        return res
    except OSError as exc:
        res.reason = f"cannot create {exc.filename or res.target}: {exc.strerror}"
        return res
    try:
        res.waited = time.monotonic() - t0
        _stage_locked(res, files, manifest_bytes, Path(res.target), srcdir, threads=threads,
                      verify=verify, keep_free=keep_free, on_plan=on_plan, advance=advance)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise HpcmlError(f"{exc.filename or res.target}: cannot write the staged copy: "
                             f"{exc.strerror}") from None
        res.reason = f"ran out of space in {res.target} (planned {res.needed:,} B, {res.free:,} B free)"
    finally:
        os.close(fd)
    return res


def _stage_locked(res: StageResult, files: list[_File], manifest_bytes: bytes, dst: Path, srcdir: Path, *,
                  threads: int, verify: bool, keep_free: int | None, on_plan, advance) -> None:
    t1 = time.monotonic()
    stamp = _read_stamp(dst / STAMP, res.dataset)
    _clean_parts(dst)
    _plan(files, dst, stamp["files"], verify)
    res.needed = sum(f.bytes for f in files if f.action == "copy")
    res.free, res.keep_free = _free(dst, keep_free)
    if res.needed and res.needed > res.free - res.keep_free:
        res.reason = _no_fit(res)
        return
    todo = [f for f in files if f.action != "skip"]
    if on_plan:
        on_plan(sum(f.bytes for f in todo))
    run = _Run(srcdir, dst, stamp["files"], advance, f"{res.node}.{os.getpid()}")
    try:
        _run_pool(run, todo, threads)
    finally:
        res.files_copied, res.files_verified, res.bytes_copied = run.copied, run.verified, run.bytes_copied
        res.files_skipped = sum(f.action == "skip" for f in files) + run.verified
        res.seconds = time.monotonic() - t1
        _save_stamp(dst, stamp, res, run)
    if run.bad:
        more = f" (and {len(run.bad) - 1} more: {'; '.join(run.bad[1:3])})" if len(run.bad) > 1 else ""
        raise UsageError(f"checksum mismatch, copy refused and deleted: {run.bad[0]}{more}")
    if not manifest_bytes:                        # token arrays: the stamp is the record, no manifest
        pass
    elif (dst / MANIFEST).is_file() and (dst / MANIFEST).read_bytes() == manifest_bytes:
        res.files_skipped += 1
    else:
        write_atomic(dst / MANIFEST, manifest_bytes.decode())
        res.files_copied += 1
        res.bytes_copied += len(manifest_bytes)
    res.seconds = time.monotonic() - t1
    res.staged, res.path = True, str(dst)


def _run_pool(run: _Run, todo: list[_File], threads: int) -> None:
    """All files are tried (each good copy is kept for the next run); then the first error:
    bad input before I/O trouble."""
    if not todo:
        return
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(todo)))) as pool:
        futures = [pool.submit(_one, run, f) for f in todo]
        errors = [exc for fut in futures if (exc := fut.exception()) is not None]
    if errors:
        raise next((e for e in errors if not isinstance(e, OSError)), errors[0])


def _no_fit(res: StageResult) -> str:
    from hpcml.units import fmt_bytes
    return (f"does not fit: needs {fmt_bytes(res.needed)}, {res.target} has {fmt_bytes(res.free)} free "
            f"and {fmt_bytes(res.keep_free)} is kept free")


def _save_stamp(dst: Path, stamp: dict, res: StageResult, run: _Run) -> None:
    stamp["runs"] = stamp["runs"][-(RUNS_KEPT - 1):] + [{
        "node": res.node, "job": res.job, "step": res.step, "task": res.task, "pid": os.getpid(),
        "at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "copied": run.copied,
        "verified": run.verified, "bytes_copied": run.bytes_copied, "refused": len(run.bad)}]
    write_atomic(dst / STAMP, orjson.dumps(stamp).decode())
