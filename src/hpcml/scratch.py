"""Scratch files that cannot outlive their process.

A file hpcml writes only to use it (the disk check's write test, the loader benchmark's
ceiling file) or to publish it whole under another name (``files.write_atomic``, a farm
task's end record, an owner's claim) must leave nothing when its process is killed with
SIGKILL, where no ``finally`` runs. Two ways, the first where the filesystem allows it:

* ``O_TMPFILE`` (Linux 3.11; ext4, XFS, Btrfs, tmpfs, overlayfs, Lustre): the file never has
  a name. The kernel frees it when its last descriptor closes, which a kill does. Published
  by ``link``-ing ``/proc/self/fd/N`` into place (``linkat(AT_SYMLINK_FOLLOW)``, open(2)'s
  documented way, no privilege needed).
* elsewhere (NFS, an old kernel, no ``/proc``): a named file, created ``O_EXCL`` under a
  name that says whose it is (``PREFIX-HOST-PID-RANDOM``) and, for scratch, unlinked at once.
  A kill in the microseconds between create and unlink leaves that name, and ``sweep``
  removes it the next time the same tool uses the same directory on the same host (its pid
  is dead, or reused by a younger process), or anywhere once it is a day old.

NFS has no ``O_TMPFILE`` but its client keeps an unlinked open file as ``.nfsXXXX`` and
removes it at the last close, which a kill also does.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
import time

#: errors of an open(O_TMPFILE) that mean "not on this filesystem or kernel", not "cannot write"
_UNSUPPORTED = {errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOSYS}
#: a leftover named scratch file of another host (a shared filesystem) is removed only when
#: older than this: its pid means nothing here, and no hpcml scratch file lives a day
STALE_S = 86400.0

_HAS_PROC_FD = os.path.isdir("/proc/self/fd")


def host_tag() -> str:
    """This host's name as it goes into a file name (no dots or dashes: the name splits on them)."""
    return "".join(c if c.isalnum() else "_" for c in socket.gethostname())[:64] or "host"


def anonymous(directory: str | os.PathLike, mode: int = 0o600, *, to_publish: bool = False) -> int | None:
    """A descriptor (read-write, close-on-exec) of a new file in ``directory`` that has no
    name, or None where the filesystem or kernel cannot make one (then use ``named``), or,
    ``to_publish``, where ``publish`` could not name it later (no ``/proc``). OSError for a
    directory that cannot be written (full, read-only, missing)."""
    flag = getattr(os, "O_TMPFILE", 0)
    if not flag or (to_publish and not _HAS_PROC_FD):
        return None
    try:
        return os.open(directory, flag | os.O_RDWR | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno in _UNSUPPORTED:
            return None
        raise


def named(directory: str | os.PathLike, prefix: str, mode: int = 0o600) -> tuple[int, str]:
    """``(fd, path)`` of a new file ``DIRECTORY/PREFIX-HOST-PID-RANDOM``, created O_EXCL
    (never through a link planted there), for where ``anonymous`` cannot be had."""
    path = os.path.join(os.fspath(directory), f"{prefix}-{host_tag()}-{os.getpid()}-{os.urandom(4).hex()}")
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, mode), path


def scratch(directory: str | os.PathLike, prefix: str, mode: int = 0o600) -> int:
    """A read-write descriptor of a file in ``directory`` that nothing can outlive: nameless
    where the filesystem allows, else named (``PREFIX-HOST-PID-RANDOM``) and unlinked at once;
    the leftovers of earlier holders killed in between are swept first."""
    sweep(directory, prefix)
    fd = anonymous(directory, mode)
    if fd is not None:
        return fd
    fd, path = named(directory, prefix, mode)
    try:
        os.unlink(path)
    except OSError:
        os.close(fd)
        raise
    return fd


class NotPublished(OSError):
    """``publish`` could not link this nameless file (the kernel refuses links through
    ``/proc`` here, or the directory went away): write it under a name instead."""


#: errors of the link through /proc that mean "not here, ever": later calls skip the attempt
_NEVER = {errno.EXDEV, errno.EPERM, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS}


def publish(fd: int, path: str | os.PathLike) -> None:
    """Give the nameless file of ``fd`` (``anonymous(..., to_publish=True)``) the name
    ``path``, atomically: FileExistsError if something has that name (of two racing
    publishers one wins, as with ``link``); ``NotPublished`` where it cannot be done.

    ``linkat(AT_FDCWD, "/proc/self/fd/N", dirfd, name, AT_SYMLINK_FOLLOW)``: CPython's
    ``os.link`` calls plain ``link(2)``, which links the /proc symlink itself (EXDEV),
    unless a directory descriptor is given, hence ``dst_dir_fd``."""
    global _HAS_PROC_FD
    path = os.fspath(path)
    try:
        dfd = os.open(os.path.dirname(path) or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise NotPublished(exc.errno, exc.strerror, path) from None
    try:
        os.link(f"/proc/self/fd/{fd}", os.path.basename(path), dst_dir_fd=dfd, follow_symlinks=True)
    except FileExistsError:
        raise
    except OSError as exc:
        if exc.errno in _NEVER:
            _HAS_PROC_FD = False
        raise NotPublished(exc.errno, exc.strerror, path) from None
    finally:
        os.close(dfd)


def _copy_named(fd: int, tmp: str, mode: int, durable: bool, exact: bool) -> None:
    """The bytes of ``fd``'s file into a new file ``tmp`` (where it could not be linked):
    ``mode`` exactly when ``exact``, else narrowed by the umask as a plain create is."""
    out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
    try:
        if exact:
            os.fchmod(out, mode)
        size, done = os.fstat(fd).st_size, 0
        while done < size:
            n = os.sendfile(out, fd, done, size - done)
            if n == 0:
                break
            done += n
        if durable:
            os.fsync(out)
    except BaseException:
        os.close(out)
        os.unlink(tmp)
        raise
    os.close(out)


def replace_with(fd: int, path: str | os.PathLike, tmp: str | os.PathLike, *, mode: int = 0o600,
                 durable: bool = False, exact: bool = True) -> None:
    """Put the nameless file of ``fd`` at ``path``, replacing what is there: linked in as
    ``tmp`` (for the microseconds before the rename), then renamed. Where it cannot be
    linked its bytes are copied to ``tmp`` first (``mode``, exactly unless not ``exact``;
    fsynced when ``durable``)."""
    tmp = os.fspath(tmp)
    try:
        publish(fd, tmp)
    except NotPublished:
        _copy_named(fd, tmp, mode, durable, exact)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def place_new(fd: int, path: str | os.PathLike, tmp: str | os.PathLike, *, mode: int = 0o600,
              durable: bool = False, exact: bool = True) -> None:
    """Put the nameless file of ``fd`` at ``path`` only if nothing is there (FileExistsError
    otherwise). Where it cannot be linked, its bytes are copied to ``tmp`` and that is
    linked to ``path``, then removed."""
    try:
        publish(fd, path)
        return
    except NotPublished:
        pass
    tmp = os.fspath(tmp)
    _copy_named(fd, tmp, mode, durable, exact)
    try:
        os.link(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def fd_path(fd: int) -> str:
    """A path that opens the file of ``fd`` again in this process (its threads and the
    readers it hands paths to), nameless or not."""
    return f"/proc/self/fd/{fd}"


def dead_here(pid: int, mtime: float) -> bool:
    """Whether the process ``pid`` of this host that made a file at ``mtime`` is gone: no such
    pid, a zombie, or one started after the file was made (the pid was reused)."""
    from hpcml.proctree import start_time
    started = start_time(pid)
    return started is None or started > mtime + 1.0


def removable(entry: os.DirEntry) -> bool:
    """A leftover this process may remove: a regular file (never a link or a directory) of
    its own user (root: any), so that a sweep never fails on another user's file in a
    shared sticky directory, and never touches one."""
    try:
        st = entry.stat(follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and (os.geteuid() == 0 or st.st_uid == os.geteuid())


def sweep(directory: str | os.PathLike, prefix: str, *, stale_s: float = STALE_S) -> int:
    """Remove the named scratch files ``PREFIX-HOST-PID-RANDOM`` in ``directory`` whose maker
    is dead: on this host, by its pid; of another host (a shared directory), only once older
    than ``stale_s``. Returns how many went; a directory that cannot be listed sweeps none."""
    gone, now, here = 0, time.time(), host_tag()
    try:
        entries = list(os.scandir(os.fspath(directory)))
    except OSError:
        return 0
    for entry in entries:
        if not entry.name.startswith(prefix + "-"):
            continue
        parts = entry.name[len(prefix) + 1:].rsplit("-", 2)
        if len(parts) != 3 or not parts[1].isdigit():
            continue
        if not removable(entry):
            continue
        mtime = entry.stat(follow_symlinks=False).st_mtime
        old = now - mtime > stale_s
        if not old and (parts[0] != here or not dead_here(int(parts[1]), mtime)):
            continue
        try:
            os.unlink(entry.path)
            gone += 1
        except OSError:                                 # gone meanwhile, or not ours to remove
            pass
    return gone

