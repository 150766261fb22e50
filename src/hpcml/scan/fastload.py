"""A fast proof that a pickle stream is plain data: CPython's own C unpickler, refused every
global.

The opcode walker (``picklewalk``) is pure Python: one dispatch per opcode, ~12 MB/s on
small-object pickles. Most large pickles a scanner meets are plain data (lists of dicts,
tuples, strings, numbers) that import nothing. For those, ``_pickle.Unpickler`` decides the
same question ~5x faster: it parses with the reference implementation, and we make it stop
at the first opcode that would import or look up anything.

Why nothing can run (the security argument):

- Code runs at load time only through objects the stream obtains by name: GLOBAL,
  STACK_GLOBAL, INST, OBJ-after-GLOBAL and EXT1/2/4 all go through ``find_class``, and
  PERSID/BINPERSID through ``persistent_load``. Both are overridden to raise ``_Refused``
  at once, so no module is imported, no attribute is looked up and the load ends.
- Without them the stack only ever holds builtin data (str, bytes, bytearray, int, float,
  bool, None, tuple, list, dict, set, frozenset, PickleBuffer). REDUCE, NEWOBJ, NEWOBJ_EX
  and BUILD applied to those raise TypeError/AttributeError in C: builtins have no
  ``__setstate__`` that runs Python code and none of them is callable.
- What is left is resource use, handled by isolation: the load runs in a forked child
  whose address space is capped (``RLIMIT_AS``, ``HPCML_SCAN_MEMORY``, default 2 GiB over
  what the process already maps) and whose wall time is bounded. Hashing a tuple nested a
  million deep (a few bytes per level) recurses in C and can overflow the stack: a child
  that dies by a signal, runs out of memory or time just means "not proven", and the
  stream is walked by ``picklewalk`` as before. The child exits with ``os._exit`` so the
  parent never holds (or frees) the object graph: the scanner's own memory stays bounded.

Anything not proven here (a global, a persistent id, a bytes value that looks like a
nested pickle, a legacy-torch magic number, a malformed or truncated stream, trailing
bytes, a 0x95 byte that may be a protocol 4 FRAME: CPython's readers read a frame that an
opcode crosses differently, and one reading proves only itself) gets the full walk,
which reports offsets, calls and notes. So this path can only ever answer "plain data,
N pickles ending at these offsets"; it never decides a verdict that names code.
"""

from __future__ import annotations

import faulthandler
import gc
import io
import os
import pickle
import re
import resource
import struct
import time
from typing import BinaryIO

MIN_SIZE = 1 << 20               # below this the walker is as fast as a fork
MAX_SIZE = 256 << 20             # above this the object graph would not fit the memory cap
DEFAULT_MEMORY = 192 << 20       # bytes of address space the child may add
#: the objects a plain-data pickle becomes, per byte of it (1M small dicts: 14x), plus the
#: child's copy of the bytes: a stream that would not fit the budget is walked at once
GRAPH_FACTOR = 17
PREFIX = 4096                    # bytes parsed in this process to see an early global
TIMEOUT = 120.0                  # seconds before the child is killed and the walker takes over
TORCH_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
# A bytes value that starts like a protocol 2-5 pickle is followed by the walker (it may be
# loaded later); any such byte pattern past the first header sends the stream there.
_NESTED = re.compile(rb"\x80[\x02-\x05][().012FIJKLMNPQRSTVXabcdeghijlopqrstu}\]G)BC\x80-\x98]")


def _may_nest(data: bytes) -> bool:
    """Whether a bytes-like argument (the ones ``picklewalk`` checks: SHORT_BINBYTES, BINBYTES,
    BINBYTES8, BYTEARRAY8, long LONG1/LONG4) could start like a pickle. A header pattern
    counts only where the opcode and length that would introduce it precede it, so data
    that merely contains the bytes (an int whose bytes read 0x80 0x02) is not a reason to
    walk; a coincidence that still matches costs only speed."""
    n = len(data)
    for m in _NESTED.finditer(data, 3):
        p = m.start()
        if data[p - 2] == 0x43 and data[p - 1] >= 8 or data[p - 2] == 0x8A and data[p - 1] > 64:
            return True
        if p >= 5 and data[p - 5] in (0x42, 0x8B) and 8 <= int.from_bytes(data[p - 4:p], "little") <= n - p:
            return True
        if p >= 9 and data[p - 9] in (0x8E, 0x96) and 8 <= int.from_bytes(data[p - 8:p], "little") <= n - p:
            return True
    return False


class _Refused(Exception):
    """Raised by the hooks: the stream names a global or a persistent id."""


class _DataOnly(pickle.Unpickler):
    """``_pickle.Unpickler`` (the C one) that refuses every name."""

    def find_class(self, module: str, name: str):
        raise _Refused

    def persistent_load(self, pid):
        raise _Refused


def _names_early(head: bytes) -> bool:
    """Whether the stream's first bytes already name a global (a model file's first array):
    then reading the whole file for the child would only cost time. The prefix is small
    enough (nesting at most ``PREFIX`` deep) to parse in this process."""
    if head[:1] == b"\x80" and head[2:3] == b"\x95":     # PROTO, FRAME: a frame is up to 64 KiB,
        head = head[:2] + head[11:]                      # longer than the prefix: read unframed
    try:
        _DataOnly(io.BytesIO(head)).load()
    except _Refused:
        return True
    except Exception:  # noqa: BLE001 - truncated prefix: decided by the child
        pass
    return False


def memory_budget() -> int:
    """Bytes the child may add to its address space (``HPCML_SCAN_MEMORY``, in bytes or with a
    unit such as ``4GiB``)."""
    raw = os.environ.get("HPCML_SCAN_MEMORY", "").strip()
    if not raw:
        return DEFAULT_MEMORY
    from hpcml.units import parse_bytes
    try:
        return int(parse_bytes(raw))
    except ValueError:
        return DEFAULT_MEMORY


def _ends(stream, size: int) -> list[int] | None:
    ends: list[int] = []
    while stream.tell() < size:
        try:
            value = _DataOnly(stream).load()
        except Exception:  # noqa: BLE001 - refused, malformed or truncated: not proven
            return None
        if not ends and type(value) is int and value == TORCH_LEGACY_MAGIC:
            return None
        ends.append(stream.tell())
        del value
    return ends


def _load_all(data: bytes) -> list[int] | None:
    """The end offset of every pickle in ``data`` if all are plain data and end exactly at
    its end; None otherwise. Runs in the child."""
    return _ends(io.BytesIO(data), len(data))


def _child(source: BinaryIO | bytes, start: int, size: int, budget: int, wfd: int) -> None:
    ok, out = False, b""
    try:
        gc.disable()                # no cycle can need collecting before os._exit
        faulthandler.disable()      # a crash here means "not proven", not a dump on stderr
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        with open("/proc/self/statm") as fh:
            mapped = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        limit = mapped + budget
        if hard == resource.RLIM_INFINITY or limit < hard:
            resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
        # the child reads the bytes (pread: the parent's file position does not move), so the
        # scanning process never holds them
        data = source if isinstance(source, bytes) else os.pread(source.fileno(), size, start)
        if len(data) == size and not _may_nest(data) and b"\x95" not in data:
            ends = _load_all(data)
            ok, out = ends is not None, b"" if ends is None else struct.pack(f"<{len(ends)}Q", *ends)
        os.write(wfd, struct.pack("<bI", ok, len(out)) + out)
    finally:
        os._exit(0)


def plain_data_ends(fh: BinaryIO, start: int, end: int) -> list[int] | None:
    """Absolute end offsets of the pickles in ``fh[start:end]`` when the stream is proven to
    be plain data only; None when it must be walked (or this path does not apply)."""
    size = end - start
    budget = memory_budget()
    if not (MIN_SIZE <= size <= MAX_SIZE) or size * GRAPH_FACTOR > budget or not hasattr(os, "fork"):
        return None
    fh.seek(start)
    head = fh.read(PREFIX)
    if b"\x95" in head or _names_early(head):     # a FRAME (see above) or a global: walked
        return None
    source: BinaryIO | bytes = fh
    if type(fh) is not io.BufferedReader:     # a member of an archive, a decompressed stream:
        fh.seek(start)                        # its offsets are not the file's, read here
        source = fh.read(size)
    rfd, wfd = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(rfd)
        os.close(wfd)
        return None
    if pid == 0:                                    # pragma: no cover - the child
        os.close(rfd)
        _child(source, start, size, budget, wfd)
    os.close(wfd)
    del source
    try:
        reply = _read_reply(rfd, pid)
    finally:
        os.close(rfd)
    if reply is None:
        return None
    return [start + e for e in reply]


def _read_reply(rfd: int, pid: int) -> list[int] | None:
    deadline = time.monotonic() + TIMEOUT
    chunks: list[bytes] = []
    import select
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([rfd], [], [], left)[0]:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            return None
        chunk = os.read(rfd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    raw = b"".join(chunks)
    if status != 0 or len(raw) < 5:
        return None
    ok, n = struct.unpack_from("<bI", raw)
    if not ok or len(raw) != 5 + n:
        return None
    return list(struct.unpack_from(f"<{n // 8}Q", raw, 5))
