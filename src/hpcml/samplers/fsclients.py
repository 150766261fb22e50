"""The node's parallel-filesystem client counters: what every process of the node read from
and wrote to Lustre and NFS, so the report can tell a job's own I/O from another job's load
on the same filesystem (the node's client moved bytes the job's ranks did not).

* **Lustre**: each mounted filesystem's llite ``stats`` (``lctl get_param llite.*.stats``:
  ``/sys/kernel/debug/lustre/llite/*/stats``, ``/proc/fs/lustre/llite/*/stats`` before
  2.12). A counter line is ``name count samples [unit] min max sum [sumsq]``
  (``lprocfs_stats_seq_show``); ``read_bytes`` and ``write_bytes`` carry the bytes in
  their sum.
* **NFS**: ``/proc/self/mountstats``, each ``fstype nfs``/``nfs4`` mount's ``bytes:`` line
  (``nfs_show_stats``: normal read, normal written, direct read, direct written, server
  read, server written, read pages, written pages): the application's bytes are the normal
  plus the direct ones.

Rows (cumulative since the counters began, summed over the node's mounts of each kind):
``fs_lustre_read_bytes``, ``fs_lustre_write_bytes``, ``fs_nfs_read_bytes``,
``fs_nfs_write_bytes``. Where a node has no such client (no file, nothing mounted) there
are no rows: a documented no-op, never a zero. Each file is read bounded; a line that does
not parse is skipped.
"""

from __future__ import annotations

import glob
import os

from hpcml.files import read_bounded

LUSTRE_GLOBS = ("/sys/kernel/debug/lustre/llite/*/stats", "/proc/fs/lustre/llite/*/stats")
MOUNTSTATS = "/proc/self/mountstats"
MAX_BYTES = 4 << 20                 # a mountstats of hundreds of mounts fits
NFS_TYPES = ("nfs", "nfs4")


def lustre_bytes(text: str) -> tuple[int, int] | None:
    """(read, written) bytes of one llite ``stats`` file; None where it has neither line."""
    got: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 7 and parts[0] in ("read_bytes", "write_bytes") and parts[2] == "samples":
            try:
                got[parts[0]] = int(parts[6])
            except ValueError:
                continue
    if not got:
        return None
    return got.get("read_bytes", 0), got.get("write_bytes", 0)


def nfs_bytes(text: str) -> tuple[int, int] | None:
    """(read, written) bytes of every NFS mount in a ``mountstats`` text, summed; None
    where none is mounted."""
    read = written = 0
    seen = False
    nfs = False
    counted: set[str] = set()
    for line in text.splitlines():
        if line.startswith("device "):
            words = line.split()
            nfs = "fstype" in words and words.index("fstype") + 1 < len(words) \
                and words[words.index("fstype") + 1] in NFS_TYPES
            # bind mounts of one export share its superblock and print the same counters: once
            nfs = nfs and len(words) > 1 and words[1] not in counted
            if nfs:
                counted.add(words[1])
            continue
        if nfs and line.strip().startswith("bytes:"):
            fields = line.split(":", 1)[1].split()
            try:
                numbers = [int(x) for x in fields[:4]]
            except ValueError:
                continue
            if len(numbers) == 4:
                read += numbers[0] + numbers[2]
                written += numbers[1] + numbers[3]
                seen = True
    return (read, written) if seen else None


class FsClients:
    """The node's Lustre and NFS client counters, read once a sample (a few small files)."""

    def __init__(self, lustre_globs: tuple[str, ...] = LUSTRE_GLOBS, mountstats: str = MOUNTSTATS) -> None:
        self.lustre_globs, self.mountstats = lustre_globs, mountstats

    def sample(self) -> dict[str, float]:
        out: dict[str, float] = {}
        totals = [0, 0]
        found = False
        for pattern in self.lustre_globs:
            for path in glob.glob(pattern):
                got = lustre_bytes(_text(path))
                if got is not None:
                    totals[0] += got[0]
                    totals[1] += got[1]
                    found = True
            if found:                       # the newer place: the older one is the same counters
                break
        if found:
            out["fs_lustre_read_bytes"], out["fs_lustre_write_bytes"] = float(totals[0]), float(totals[1])
        if os.path.exists(self.mountstats):
            nfs = nfs_bytes(_text(self.mountstats))
            if nfs is not None:
                out["fs_nfs_read_bytes"], out["fs_nfs_write_bytes"] = float(nfs[0]), float(nfs[1])
        return out


def _text(path: str) -> str:
    try:
        return read_bounded(path, MAX_BYTES, follow_symlinks=True).decode("utf-8", "replace")
    except (OSError, ValueError):
        return ""
