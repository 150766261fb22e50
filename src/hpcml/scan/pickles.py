"""A stream of pickles: walk each one, classify what it imports, follow nested pickles.

``pickle.load`` reads one pickle and stops at STOP, but loaders such as legacy
``torch.load`` and joblib read several from one file, and an attacker can append a
second pickle after a harmless first one; so every pickle in the stream is walked.
"""

from __future__ import annotations

from typing import BinaryIO

from hpcml.scan import fastload
from hpcml.scan.context import FileScan
from hpcml.scan.formats import joblib as joblib_format
from hpcml.scan.picklewalk import PickleWalker, WalkResult

TORCH_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
TORCH_LEGACY_PICKLES = 5        # magic, protocol, sys info, the data, the storage keys
MAX_NESTED = 64
MAX_DEPTH = 3


def walk_one(fh: BinaryIO, start: int, end: int) -> WalkResult:
    """One pickle; re-walked with container tracking if it turns out to be joblib's."""
    hooks = frozenset({joblib_format.WRAPPER})
    try:
        return PickleWalker(fh, start, end, on_build=joblib_format.on_build, build_hooks=hooks).walk()
    except joblib_format.NeedTracking:
        return PickleWalker(fh, start, end, track_containers=True,
                            on_build=joblib_format.on_build, build_hooks=hooks).walk()


def scan_stream(fs: FileScan, fh: BinaryIO, start: int, end: int, member: str = "", *,
                required: bool = True, depth: int = 0) -> bool:
    """Scan the pickles from ``start``; False if not even the first one parsed.

    ``required`` says the bytes must be a pickle (an error if not); otherwise a first
    pickle that fails without importing anything just means "not a pickle".
    """
    proven = fastload.plain_data_ends(fh, start, end)
    if proven is not None:
        if len(proven) > 1:
            fs.note(f"{len(proven)} pickles in one stream; every one was scanned")
        return True
    offset, count, legacy = start, 0, False
    while offset < end:
        res = walk_one(fh, offset, end)
        fs.events(res.events, member)
        for off, length in res.nested[:MAX_NESTED]:
            if depth < MAX_DEPTH:
                inner = f"{member} nested@{off}" if member else f"nested@{off}"
                scan_stream(fs, fh, off, off + length, inner, required=False, depth=depth + 1)
        if len(res.nested) > MAX_NESTED:
            fs.note(f"{len(res.nested) - MAX_NESTED} more embedded pickles were not followed")
        if any(ev.module == "joblib.numpy_pickle" for ev in res.events):
            fs.set_format("joblib")
        if res.error:
            if count == 0 and (required or res.events):
                fs.error(f"not a valid pickle: {res.error}", member)
            elif count and res.events:
                fs.error(f"pickle #{count + 1} at offset {offset} is malformed: {res.error}", member)
            elif count:
                fs.note(f"{end - offset if end < 1 << 62 else 'the'} trailing bytes after pickle "
                        f"#{count} at offset {offset} are not a pickle")
            return count > 0 or bool(res.events)
        count += 1
        if count == 1 and res.value == TORCH_LEGACY_MAGIC:
            legacy = True
            fs.set_format("pytorch-legacy")
        offset = res.end
        fh.seek(offset)
        if not fh.read(1):          # the end of a stream whose length was not known
            break
        if legacy and count == TORCH_LEGACY_PICKLES:
            if offset < end:
                fs.note(f"{end - offset} bytes of tensor storage after the pickles (not code)")
            break
    if count > 1 and not legacy:
        fs.note(f"{count} pickles in one stream; every one was scanned")
    return True
