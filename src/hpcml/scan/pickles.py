"""A stream of pickles: walk each one, classify what it imports, follow nested pickles.

``pickle.load`` reads one pickle and stops at STOP, but loaders such as legacy
``torch.load`` and joblib read several from one file, and an attacker can append a
second pickle after a harmless first one; so every pickle in the stream is walked.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import io
import os
import re
import tempfile
from typing import BinaryIO, cast

from hpcml.scan import fastload
from hpcml.scan import joblibwalk as joblib_format
from hpcml.scan.context import FileScan
from hpcml.scan.model import Verdict
from hpcml.scan.picklewalk import PickleWalker, WalkResult, looks_like_pickle

TORCH_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
TORCH_LEGACY_PICKLES = 5        # magic, protocol, sys info, the data, the storage keys
MAX_NESTED = 64
MAX_DEPTH = 3


def walk_one(fh: BinaryIO, start: int, end: int, *, joblib: bool = True) -> WalkResult:
    """One pickle as ``joblib.load`` reads it (``joblib``: a wrapper's array bytes are data,
    not opcodes; re-walked with container tracking if it turns out to be joblib's), or as
    a plain unpickler reads it (``pickle.load``, ``torch.load``, numpy's object arrays):
    every byte an opcode."""
    on_build, hooks = (joblib_format.on_build, joblib_format.HOOKS) if joblib else (None, frozenset[str]())
    try:
        return PickleWalker(fh, start, end, on_build=on_build, build_hooks=hooks).walk()
    except joblib_format.NeedTracking:
        return PickleWalker(fh, start, end, track_containers=True, on_build=on_build, build_hooks=hooks).walk()


def _latin1_of_utf8(fh: BinaryIO, off: int, length: int) -> BinaryIO:
    """The bytes ``_codecs.encode(text, 'latin1')`` makes of UTF-8 text in the file (how
    protocols 0-2 write bytes), decoded in chunks into a spooled file: memory stays bounded."""
    out = tempfile.SpooledTemporaryFile(max_size=64 << 20)
    decode = codecs.getincrementaldecoder("utf-8")("surrogatepass").decode
    fh.seek(off)
    left = length
    while left > 0:
        chunk = fh.read(min(left, 1 << 20))
        if not chunk:
            raise ValueError("the text ends before its length")
        left -= len(chunk)
        out.write(decode(chunk, final=left == 0).encode("latin-1"))
    out.seek(0)
    return cast(BinaryIO, out)


def _scan_inner(fs: FileScan, fh: BinaryIO, size: int, member: str, name: str, depth: int) -> None:
    """Scan content the load reaches from this file (bytes it loads, a file it opens) by
    content, as part of this file's verdict; the file's own format stays what it is."""
    if fs.nested is None:                   # fail closed: never called safe unread
        fs.error("content the load reaches from this file was not scanned here", member)
        return
    fmt = fs.result.format
    try:
        fs.nested(fs, fh, size, member, name, depth)
    finally:
        fs.result.format = fmt


def _scan_loaded(fs: FileScan, fh: BinaryIO, loaded: list[tuple[int, int, str | bytes | None]], member: str,
                 depth: int) -> None:
    """Bytes the load hands to ``torch.load`` (``torch.storage._load_from_bytes``: how a
    tensor pickled with plain pickle or joblib carries its storage) are a torch file of
    their own, scanned as one: benign inside, safe; dangerous inside, dangerous."""
    from hpcml.scan.formats.zipped import Window
    for off, length, how in loaded[:MAX_NESTED]:
        inner = f"{member} torch.load@{off}" if member else f"torch.load@{off}"
        if depth >= MAX_DEPTH:
            fs.error(f"torch files nested more than {MAX_DEPTH} deep", inner)
            continue
        try:
            if how is None:
                view: BinaryIO = cast(BinaryIO, Window(fh, off, length))
            elif how == "utf-8":
                view = _latin1_of_utf8(fh, off, length)
            else:
                view = io.BytesIO(cast(bytes, how))
            size = view.seek(0, io.SEEK_END)
            view.seek(0)
            _scan_inner(fs, view, size, inner, "storage.pt", depth + 1)
        except (ValueError, UnicodeError) as exc:       # the load would fail on it too
            fs.error(f"bytes torch.load would read cannot be rebuilt: {exc}", inner)
    if len(loaded) > MAX_NESTED:
        fs.error(f"{len(loaded) - MAX_NESTED} more torch files loaded from bytes were not scanned", member)


def _scan_opened(fs: FileScan, opened: list[tuple[str, int]], member: str, depth: int) -> None:
    """Files the load opens (joblib's old ``NDArrayWrapper``: ``np.load(dirname/filename,
    allow_pickle=True)``) are part of its verdict: each must lie in the pickle's own
    directory (no absolute path, no ``..``, no symlink out of it) and is scanned here."""
    for name, off in opened[:MAX_NESTED]:
        what = f"joblib.numpy_pickle_compat.NDArrayWrapper opens {name!r}"
        if member or not fs.result.path:
            fs.add(Verdict.DANGEROUS, what, "a file named inside an archive member: joblib would open it "
                                            "on the disk, outside what was scanned", member, off, "BUILD")
            continue
        base = os.path.realpath(os.path.dirname(os.path.abspath(fs.result.path)))
        target = os.path.realpath(os.path.join(base, name))
        if os.path.isabs(name) or ".." in name.replace("\\", "/").split("/") or \
                os.path.commonpath([base, target]) != base or target == base:
            fs.add(Verdict.DANGEROUS, what, "a file outside the pickle's directory: np.load(allow_pickle=True) "
                                            "of something that was not scanned", member, off, "BUILD")
            continue
        inner = f"{os.path.basename(target)} (opened by the load)"
        if depth >= MAX_DEPTH:
            fs.error("files opened by files nested too deep", inner)
            continue
        try:
            with open(target, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                _scan_inner(fs, fh, size, inner, os.path.basename(target), depth + 1)
        except OSError as exc:
            fs.error(f"cannot read the file the load opens: {exc.strerror or exc}", inner)


ENCODED_SCAN_MAX = 16 << 20     # bytes of a stream searched for pickles encoded as text
_ENCODED = re.compile(rb"gA[JNSW][A-Za-z0-9+/]{13,}={0,2}|80 ?0[2-5] ?(?:[0-9a-fA-F]{2} ?){6,}")


def _note_encoded(fs: FileScan, fh: BinaryIO, start: int, end: int, member: str) -> None:
    """Pickles carried as base64 or hex text: nothing in this file decodes them (that would
    take a global, judged on its own), so they do not change its verdict; but whoever
    decodes and loads them later runs what they import, which the note names."""
    if end - start > ENCODED_SCAN_MAX:
        return
    fh.seek(start)
    data = fh.read(end - start)
    notes = 0
    for m in _ENCODED.finditer(data):
        text = m.group().replace(b" ", b"")
        try:
            raw = base64.b64decode(text + b"=" * (-len(text) % 4)) if text[:1] == b"g" else bytes.fromhex(text.decode())
        except (ValueError, binascii.Error):
            continue
        if not looks_like_pickle(raw[:3]):
            continue
        res = walk_one(io.BytesIO(raw), 0, len(raw))
        names = sorted({f"{ev.module}.{ev.name}" for ev in res.events if ev.kind == "global"})
        kind = "base64" if text[:1] == b"g" else "hex"
        where = f"{member}@{start + m.start()}" if member else f"offset {start + m.start()}"
        fs.note(f"a pickle encoded as {kind} text at {where} (not loaded by this file); it imports "
                + (", ".join(names[:5]) if names else "nothing"))
        notes += 1
        if notes >= 8:
            break


def _as_plainly_read(fs: FileScan, fh: BinaryIO, start: int, end: int, member: str, depth: int,
                     joblib_read: WalkResult) -> None:
    """The same pickle as ``pickle.load`` or ``torch.load`` reads it, where joblib's reading
    took bytes as an array's: those bytes are opcodes to them, and the file's verdict is the
    worse of the two readings. What a plain load does before the array bytes stop it (for a
    real joblib file they are not a pickle: joblib's padding length, 0-15, is no opcode) is
    what it would run: its imports count, its failure there does not.

    An object array's own pickle a plain load reads inline, to its STOP: the same opcodes
    joblib's fresh unpickler reads (walked as such) only if the plain reading reached it in
    step, i.e. no raw array bytes before it; else all of it counts. In step, its memo is
    still the outer pickle's: a protocol 4-5 pickle's GETs (joblib 1.6 writes them) fetch
    outer values there, so every real joblib file makes ``pickle.load`` import a name
    spelled by outer strings (``NumpyArrayWrapper.dtype``) and fail. Those readings are not
    the same; what the plain one does there counts when it is dangerous (a global on the
    dangerous list, a dangerous argument: what an attacker spells from outer strings), and
    the rest is named in a note."""
    plain = walk_one(fh, start, end, joblib=False)
    skipped = joblib_read.skipped
    until = min((off for off, objects in skipped if objects), default=None)
    if until is not None and any(off < until for off, objects in skipped if not objects):
        until = None                    # out of step before the object array: nothing is the same
    same = {(e.kind, e.module, e.name, e.detail) for e in joblib_read.events}
    kept, apart = [], set()
    for ev in plain.events:
        if until is None or ev.offset < until or fs.judge(ev)[0] is Verdict.DANGEROUS:
            kept.append(ev)
        elif (ev.kind, ev.module, ev.name, ev.detail) not in same:
            apart.add(fs.judge(ev)[1])
    fs.events(kept, member)
    if apart:
        fs.note(f"pickle.load or torch.load of this file would read joblib's object-array pickle at offset {until} "
                f"with the outer pickle's memo and also import or call {', '.join(sorted(apart)[:3])} there (not "
                "counted: real joblib files do the same; nothing dangerous)")
    seen = {entry[0] for entry in joblib_read.loaded}
    _scan_loaded(fs, fh, [e for e in plain.loaded if e[0] not in seen], member, depth)
    nested = {off for off, _ in joblib_read.nested}
    for off, length in plain.nested[:MAX_NESTED]:
        if depth < MAX_DEPTH and off not in nested:
            inner = f"{member} nested@{off}" if member else f"nested@{off}"
            scan_stream(fs, fh, off, off + length, inner, required=False, depth=depth + 1)


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
        if res.skipped:
            _as_plainly_read(fs, fh, offset, end, member, depth, res)
        fs.events(res.events, member)
        _scan_loaded(fs, fh, res.loaded, member, depth)
        _scan_opened(fs, res.opened, member, depth)
        loaded = {entry[0] for entry in res.loaded}
        for off, length in res.nested[:MAX_NESTED]:
            if depth < MAX_DEPTH and off not in loaded:
                inner = f"{member} nested@{off}" if member else f"nested@{off}"
                scan_stream(fs, fh, off, off + length, inner, required=False, depth=depth + 1)
        if len(res.nested) > MAX_NESTED:
            fs.note(f"{len(res.nested) - MAX_NESTED} more embedded pickles were not followed")
        if any(ev.module in ("joblib.numpy_pickle", "joblib.numpy_pickle_compat") for ev in res.events):
            fs.set_format("joblib")
        if res.error and res.stopped:       # read to STOP, but not as every unpickler reads it
            fs.error(f"pickle #{count + 1} at offset {offset} is malformed: {res.error}" if count
                     else f"not a valid pickle: {res.error}", member)
        elif res.error:
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
    if depth == 0:
        _note_encoded(fs, fh, start, offset, member)
    return True
