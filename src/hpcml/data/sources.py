"""Listing a dataset directory: every regular file with its size, and what could not be read.

Threads over directories because ``scandir`` and ``stat`` release the GIL: on a parallel
filesystem the metadata round trips overlap, which is where a single ``os.walk`` loses.
"""

from __future__ import annotations

import os
import stat
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator


@dataclass(frozen=True)
class SourceFile:
    rel: str          # path relative to the root, '/'-separated
    size: int
    mtime_ns: int


@dataclass
class Listing:
    root: Path
    files: list[SourceFile] = field(default_factory=list)
    unreadable: list[tuple[str, str]] = field(default_factory=list)   # (path, reason)
    directories: int = 0


def sample_key(rel: str) -> tuple[str, str] | None:
    """WebDataset's grouping rule: ``dir/name.ext.more`` is sample ``dir/name``, field ``ext.more``.

    None when WebDataset could not group the file (no extension, or a dot-file).
    """
    head, _, base = rel.rpartition("/")
    stem, dot, ext = base.partition(".")
    if not dot or not stem or not ext:
        return None
    return (f"{head}/{stem}" if head else stem), ext


def readable_by_mode(st: os.stat_result, euid: int, groups: set[int]) -> bool:
    """Permission bits only (no ACLs): an extra ``access`` call per file would double the cost."""
    if euid == 0:
        return True
    if st.st_uid == euid:
        return bool(st.st_mode & stat.S_IRUSR)
    if st.st_gid in groups:
        return bool(st.st_mode & stat.S_IRGRP)
    return bool(st.st_mode & stat.S_IROTH)


def examine(e: os.DirEntry, euid: int, groups: set[int]) -> tuple[str, os.stat_result | str | None]:
    """``("dir", None)``, ``("file", stat)`` or ``("bad", reason)``: one rule for doctor and pack."""
    try:
        if e.is_dir(follow_symlinks=False):
            return "dir", None
        st = e.stat(follow_symlinks=True)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError) and e.is_symlink():
            try:
                return "bad", f"dangling symlink -> {os.readlink(e.path)}"
            except OSError:
                pass
        return "bad", exc.strerror or str(exc)
    if stat.S_ISDIR(st.st_mode):
        return "bad", "symlink to a directory (not followed)"
    if not stat.S_ISREG(st.st_mode):
        return "bad", "not a regular file"
    if not readable_by_mode(st, euid, groups):
        return "bad", "permission denied (mode bits)"
    return "file", st


def identity() -> tuple[int, set[int]]:
    return os.geteuid(), set(os.getgroups()) | {os.getegid()}


def _scan_dir(root: Path, rel: str, euid: int, groups: set[int]):
    files: list[SourceFile] = []
    dirs: list[str] = []
    bad: list[tuple[str, str]] = []
    path = root / rel if rel else root
    try:
        with os.scandir(path) as it:
            entries = list(it)
    except OSError as exc:
        return files, dirs, [(str(path), exc.strerror or str(exc))]
    for e in entries:
        r = f"{rel}/{e.name}" if rel else e.name
        kind, what = examine(e, euid, groups)
        if kind == "dir":
            dirs.append(r)
        elif kind == "bad":
            assert isinstance(what, str)
            bad.append((str(root / r), what))
        else:
            assert isinstance(what, os.stat_result)
            files.append(SourceFile(r, what.st_size, what.st_mtime_ns))
    return files, dirs, bad


def walk(first, scan_dir: Callable, subdirs_of: Callable, jobs: int) -> Iterator:
    """Each directory's ``scan_dir`` result as it completes, the tree fanned out over
    ``jobs`` threads (``subdirs_of(result)`` says what to scan next)."""
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        pending = {pool.submit(scan_dir, first)}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                result = fut.result()
                pending |= {pool.submit(scan_dir, d) for d in subdirs_of(result)}
                yield result


def list_files(root: str | Path, jobs: int = 8, on_dir=None) -> Listing:
    """All regular files under ``root`` (symlinks followed, directories not), sorted by path."""
    out = Listing(Path(root))
    euid, groups = identity()
    for files, _dirs, bad in walk("", lambda rel: _scan_dir(out.root, rel, euid, groups),
                                  lambda r: r[1], jobs):
        out.files.extend(files)
        out.unreadable.extend(bad)
        out.directories += 1
        if on_dir:
            on_dir(len(files))
    out.files.sort(key=lambda f: f.rel)
    out.unreadable.sort()
    return out
