"""Scan files and directories: recognise each file by content and dispatch to its format
(``hpcml.scan.formats.FORMATS``, in order; what none recognises is walked as a pickle).

Files are independent, so a directory is scanned by a pool of processes (one per CPU);
within a file, memory stays bounded because every format reads in chunks.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from hpcml import progress
from hpcml.scan import pickles
from hpcml.scan.context import FileScan
from hpcml.scan.formats import FORMATS, MAX_ARCHIVE_DEPTH, claimed
from hpcml.scan.model import FileResult, Verdict
from hpcml.scan.picklewalk import looks_like_pickle
from hpcml.scan.policy import Policy, default_policy

PICKLE_SUFFIXES = {".pkl", ".pickle", ".pck", ".pt", ".pth", ".bin", ".ckpt", ".joblib", ".dat",
                   ".npy", ".model", ".sav", ".p", ".pkl.gz", ".pt.gz", ".pyd"}   # .pyd: webdataset's pickle field


def _pickle_name(name: str) -> bool:
    lower = name.lower()
    return any(lower.endswith(s) for s in PICKLE_SUFFIXES) or lower.endswith("data.pkl")


_TEXT_CONTROLS = frozenset(range(32)) - {9, 10, 12, 13}
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def _accidental_text(fh: BinaryIO, size: int, head: bytes) -> bool:
    """Text (source, requirements, configs) that protocol 0 reads a few opcodes of, by
    accident: UTF-8 without control characters, the walk fails before its STOP, and
    nothing it met could have imported code: a "global" whose module or name is not a
    dotted identifier (``import setuptools`` reads as INST of module "mport setuptools")
    cannot be imported, and without an import no unpickler runs anything. A real
    protocol-0 pickle parses to its STOP, or imports a real name before it fails."""
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 4:           # not a character cut by the 512-byte head
            return False
    if any(b in _TEXT_CONTROLS for b in head):
        return False
    res = pickles.walk_one(fh, 0, size)
    fh.seek(0)
    if res.stopped or not res.error:
        return False
    return all(ev.kind == "global" and not (_IDENTIFIER.fullmatch(ev.module) and _IDENTIFIER.fullmatch(ev.name))
               for ev in res.events)


def scan_content(fs: FileScan, fh: BinaryIO, size: int, member: str, name: str, depth: int) -> None:
    """Scan ``size`` bytes of ``fh`` from its start, recognising the format by content."""
    fh.seek(0)
    head = fh.read(512)
    fh.seek(0)
    if not head:
        if member or _pickle_name(name):
            fs.error("empty file: not a valid pickle", member)
        else:
            fs.result.scanned = False
        return
    for fmt_name in FORMATS:
        fmt = FORMATS.get(fmt_name)
        if not fmt.looks_like(head, size, name):
            continue
        if fmt.archive and depth >= MAX_ARCHIVE_DEPTH:
            fs.error(f"archives nested more than {MAX_ARCHIVE_DEPTH} deep", member)
            return
        fmt.scan(fs, fh, size, member, name, depth, scan_content)
        return
    if looks_like_pickle(head):
        fs.set_format("pickle")
        pickles.scan_stream(fs, fh, 0, size, member)
        return
    # Protocol 0 and 1 pickles have no header: a text file may be one. Walk it; a file
    # that does not parse and imports nothing is simply not a pickle.
    required = _pickle_name(name)
    if not required and _accidental_text(fh, size, head):
        if not member:
            fs.result.scanned = False
        return
    if pickles.scan_stream(fs, fh, 0, size, member, required=required):
        fs.set_format("pickle")
    elif not member and not fs.result.errors:
        fs.result.scanned = False


def scan_file(path: str | os.PathLike, policy: Policy | None = None) -> FileResult:
    policy = policy or default_policy()
    p = Path(path)
    fs = FileScan(str(p), policy, 0, scan_content)
    try:
        st = p.stat()
        if not stat.S_ISREG(st.st_mode):
            fs.error("not a regular file (a device, FIFO or socket is never read)")
            return fs.finish()
        fh = open(p, "rb")
    except OSError as exc:
        fs.error(f"cannot read: {exc.strerror or exc}")
        return fs.finish()
    with fh:
        return _scan_open(fs, fh, p, claimed(p))


def scan_handle(fh: BinaryIO, path: str | os.PathLike, policy: Policy | None = None) -> FileResult:
    """Scan the bytes of an open file (``safe_load``'s private copy, which it then loads),
    named ``path`` in the result and recognised by its content and that name alone."""
    return _scan_open(FileScan(os.fspath(path), policy or default_policy(), 0, scan_content), fh, Path(path), None)


def _scan_open(fs: FileScan, fh: BinaryIO, p: Path, claim: tuple | None) -> FileResult:
    try:
        size = os.fstat(fh.fileno()).st_size
        fs.result.size = size
        fh.seek(0)
        if claim is not None and claim[0].scan_claimed is not None:   # by what lies beside it
            claim[0].scan_claimed(fs, fh, size, claim[1])
        else:
            scan_content(fs, fh, size, "", p.name, 0)
            as_torch_tar(fs, fh)
    except OSError as exc:
        fs.error(f"read failed: {exc.strerror or exc}")
    except Exception as exc:  # noqa: BLE001 - fail closed: a scanner bug is an error verdict
        fs.error(f"internal error while scanning ({type(exc).__name__}: {exc}); "
                  "please report it")
    return fs.finish()


def scan_as_loaders_read_it(fs: FileScan, fh: BinaryIO, size: int) -> None:
    """The whole file from offset 0, as ``torch.load``, ``pickle.load``, ``np.load`` or
    joblib would read it, whatever format claimed it by what lies beside it (an hpcml.ckpt
    shard's index, an MDS shard's index.json): a tar as torch tries it first, a zip, npy or
    compressed stream by its magic, else a stream of pickles of any protocol (legacy
    ``torch.load`` reads several, protocol 0 has no header). Bytes that parse as no pickle
    and import nothing (a tensor's) are not one."""
    fh.seek(0)
    head = fh.read(512)
    fh.seek(0)
    if not head:
        return
    as_torch_tar(fs, fh)          # torch.load's first reading of a file that is not a zip
    for name in FORMATS:
        fmt = FORMATS.get(name)
        if fmt.looks_like(head, size, ""):
            fmt.scan(fs, fh, size, f"@0 read as {name}", "", 0, scan_content)
            return
    first = pickles.walk_one(fh, 0, size)
    if first.error and first.events and all(ev.kind == "ext" for ev in first.events):
        return          # tensor bytes starting with EXT1/2/4 (1 in 80 of random ones): pickle.load stops there
    pickles.scan_stream(fs, fh, 0, size, "@0 read as a plain pickle", required=False)


def as_torch_tar(fs: FileScan, fh: BinaryIO) -> None:
    """``torch.load`` opens a file that is not a zip as a tar first (its oldest format), with
    Python's tarfile, which also takes a V7 header with no magic, whatever the file's content
    says it is: a file tarfile opens is scanned as that tar too (its format stays what its
    content is), so a pickle torch would read from a member is judged."""
    import tarfile

    from hpcml.scan.formats import tarred, zipped
    fh.seek(0)
    head = fh.read(512)
    if fs.result.format == "tar" or tarred.looks_like(head) or zipped.looks_like(head):
        return
    fh.seek(0)
    try:
        with tarfile.open(fileobj=fh, mode="r:") as tf:
            first = tf.next()
    except (tarfile.TarError, OSError, EOFError, ValueError, UnicodeError):
        return
    finally:
        fh.seek(0)
    if first is None:
        return
    fmt = fs.result.format
    fs.note("Python's tarfile, which torch.load tries first on a file that is not a zip, reads it as a "
            "tar: scanned as that tar too")
    tarred.scan_tar(fs, fh, "", 0, scan_content)
    fs.result.format = fmt


def iter_files(paths: Iterable[str | os.PathLike]) -> Iterator[Path]:
    """Files under each path, in a stable order; symlinked directories are not followed."""
    for path in paths:
        p = Path(path)
        if p.is_dir():
            for root, dirs, files in os.walk(p):
                dirs.sort()
                for f in sorted(files):
                    yield Path(root) / f
        else:
            yield p


def scan_paths(paths: Iterable[str | os.PathLike], policy: Policy | None = None, *,
               jobs: int | None = None, on_result: Callable[[FileResult], None] | None = None
               ) -> list[FileResult]:
    policy = policy or default_policy()
    files = list(iter_files(paths))
    jobs = min(jobs or os.cpu_count() or 1, len(files)) or 1
    results: list[FileResult] = []
    if jobs == 1:
        for f in files:
            results.append(scan_file(f, policy))
            progress.advance("scanning files", len(results), len(files))
            if on_result:
                on_result(results[-1])
        return results
    from concurrent.futures import ProcessPoolExecutor  # ~8 ms: not for one file
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for res in pool.map(scan_file, files, [policy] * len(files), chunksize=4):
            results.append(res)
            progress.advance("scanning files", len(results), len(files))
            if on_result:
                on_result(res)
    return results


def exit_code(results: list[FileResult], policy: Policy) -> int:
    """0 safe, 5 unknown (blocked by the allowlist), 6 dangerous, 7 error (could not decide),
    8 not scanned (a format hpcml recognises but does not read), in that order."""
    worst = Verdict.worst(r.verdict for r in results)
    if worst is Verdict.DANGEROUS:
        return 6
    if worst is Verdict.UNKNOWN and policy.block_unknown:
        return 5
    if any(r.verdict is Verdict.ERROR for r in results):
        return 7
    if any(r.verdict is Verdict.NOT_SCANNED for r in results):
        return 8
    return 0
