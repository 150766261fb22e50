"""Walk a pickle stream opcode by opcode without executing it.

Written by hand because the stdlib's ``pickletools.genops`` decodes every argument into
Python objects (5.6 s for an 11M-opcode pickle here) and keeps no stack or memo, and the
existing scanners built on it are fooled by memo tricks. This walker mirrors CPython's
C unpickler (``Modules/_pickle.c``): the same stack with marks (a mark hides what is
below it), the same memo numbering (MEMOIZE uses the number of distinct keys, not a
counter), the same protocol-dependent name mapping. It tracks only what decides which
code a load would import or call: short strings, global references and the results of
calls; everything else is an opaque placeholder.

Memory is bounded whatever the file size: the file is read in chunks, large arguments
are skipped with ``seek``, and memo values are kept up to a fixed budget (beyond it a
value is replaced by a marker that makes any global built from it "unresolved", which
blocks). Only memo *presence* costs one byte per key.
"""

from __future__ import annotations

import codecs
import os
import struct
from typing import BinaryIO

from hpcml.scan import argchecks, shapes
from hpcml.scan.model import Verdict
from hpcml.scan.walkvalues import (  # noqa: F401 - the walk's names, kept importable from here
    _PUSHED,
    BEYOND,
    EVICTED,
    LONG_STR,
    LOST,
    MAX_TUPLE_DEPTH,
    MISSING,
    OPAQUE,
    BigInt,
    Blob,
    Call,
    Event,
    LongText,
    NeedTracking,
    Nested,
    Opaque,
    Persistent,
    PickleError,
    Ref,
    Unknown,
    WalkResult,
)

CHUNK = 1 << 18                 # bytes read at a time (and how often the memory guard looks)
WALK_MEMORY = 128 << 20         # resident memory a walk may add before it stops (fails closed)
MAX_EVENTS = 1 << 17            # distinct imports and calls one pickle may name (~300 B each)
MAX_LISTED = 1 << 12            # embedded pickles and loaded byte strings remembered
MAX_TUPLE = 1 << 16             # a longer TUPLE is opaque (no call's arguments or name is one)
MAX_TRACKED_STR = 4096          # longer strings cannot be module or attribute names we care about
#: memo keys a pickle may name beyond its own length (1 MiB of the unpickler's memo table)
MEMO_SLACK = 1 << 16
MEMO_BUDGET = 1 << 22           # weight units kept in the memo (~ bytes of tracked values)
MAX_LINE = 1 << 16              # protocol-0 argument lines longer than this are skipped
TRACKED_KEYS = 1 << 20          # memo keys whose presence and kind are kept (1 byte each)
SPARSE_KEYS = 1 << 16           # out-of-sequence keys past TRACKED_KEYS kept exactly
NESTED_MIN = 8                  # shortest bytes payload checked for an embedded pickle
NO_FRAME = 1 << 63              # the frame end outside any FRAME
DEPTH_CACHE = 1 << 16           # tuple elements the depth cache may hold alive before it starts again
FAST_FORWARD = True             # match runs of same-shaped plain items in C (``shapes``); False: every opcode here
_FACTORIES = frozenset({"copyreg._reconstructor", "copyreg.__newobj__", "copyreg.__newobj_ex__"})


#: numpy's array constructor in pickles; BUILD then sets (version, shape, dtype, fortran, data)
_RECONSTRUCT = frozenset({"numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct"})




#: element types that can make a tuple deeper than one level (see _tuple_depth)
_DEEPER = frozenset({tuple, Call, Nested, Persistent})

_COMPAT = None


def _py2_names():
    global _COMPAT
    if _COMPAT is None:
        import _compat_pickle
        _COMPAT = (_compat_pickle.NAME_MAPPING, _compat_pickle.IMPORT_MAPPING)
    return _COMPAT


def map_py2(module: str, name: str) -> tuple[str, str]:
    """The renaming ``Unpickler.find_class`` applies for protocols < 3 (fix_imports)."""
    names, imports = _py2_names()
    if (module, name) in names:
        return names[(module, name)]
    return imports.get(module, module), name


def _unquote_string(line: bytes) -> str:
    """Protocol-0 STRING argument: a quoted repr-style literal."""
    if len(line) >= 2 and line[0] == line[-1] and line[:1] in (b"'", b'"'):
        return codecs.escape_decode(line[1:-1])[0].decode("utf-8", "surrogateescape")
    raise PickleError("the STRING opcode argument must be quoted")


class _Reader:
    """Chunked reads over a file region, with seek-based skips for large arguments."""

    def __init__(self, fh: BinaryIO, start: int, end: int) -> None:
        self.fh, self.end = fh, end
        self.rss0 = _resident()
        self.base = start            # absolute offset of buf[0]
        self.buf = b""
        self.pos = 0
        fh.seek(start)

    def fill(self, need: int) -> bool:
        """Make ``need`` bytes available at ``pos``; False at the end of the region."""
        have = len(self.buf) - self.pos
        if have >= need:
            return True
        self.base += self.pos
        want = max(CHUNK, need) - have
        want = min(want, self.end - (self.base + have))
        if self.rss0 and _resident() - self.rss0 > WALK_MEMORY:
            raise PickleError(f"following the pickle's structure took more than {WALK_MEMORY >> 20} MiB "
                              "(a stack, nesting or calls built to exhaust the scanner): not scanned to the end")
        extra = self.fh.read(want) if want > 0 else b""
        self.buf = self.buf[self.pos:] + extra
        self.pos = 0
        return len(self.buf) >= need

    def skip(self, n: int) -> None:
        have = len(self.buf) - self.pos
        if n <= have:
            self.pos += n
            return
        target = self.base + self.pos + n
        if target > self.end:
            raise PickleError("truncated: an argument runs past the end of the file")
        self.fh.seek(target)
        self.base, self.buf, self.pos = target, b"", 0

    def seek_to(self, offset: int) -> None:
        """Continue at an absolute offset (after someone else read the file)."""
        self.fh.seek(offset)
        self.base, self.buf, self.pos = offset, b"", 0


def _resident() -> int:
    """This process's resident memory in bytes (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def looks_like_pickle(head: bytes) -> bool:
    """A PROTO opcode for protocol 2-5 followed by a plausible opcode."""
    return len(head) >= 3 and head[0] == 0x80 and 2 <= head[1] <= 5 and head[2] in _VALID


_VALID = frozenset(b"().012FIJKLMNPQRSTVXabcdeghijlopqrstu}]G)BC" + bytes(range(0x80, 0x99)))
_OPNAMES = {
    0x28: "MARK", 0x2E: "STOP", 0x30: "POP", 0x31: "POP_MARK", 0x32: "DUP", 0x46: "FLOAT",
    0x49: "INT", 0x4A: "BININT", 0x4B: "BININT1", 0x4C: "LONG", 0x4D: "BININT2", 0x4E: "NONE",
    0x50: "PERSID", 0x51: "BINPERSID", 0x52: "REDUCE", 0x53: "STRING", 0x54: "BINSTRING",
    0x55: "SHORT_BINSTRING", 0x56: "UNICODE", 0x58: "BINUNICODE", 0x61: "APPEND", 0x62: "BUILD",
    0x63: "GLOBAL", 0x64: "DICT", 0x7D: "EMPTY_DICT", 0x65: "APPENDS", 0x67: "GET", 0x68: "BINGET",
    0x69: "INST", 0x6A: "LONG_BINGET", 0x6C: "LIST", 0x5D: "EMPTY_LIST", 0x6F: "OBJ", 0x70: "PUT",
    0x71: "BINPUT", 0x72: "LONG_BINPUT", 0x73: "SETITEM", 0x74: "TUPLE", 0x29: "EMPTY_TUPLE",
    0x75: "SETITEMS", 0x47: "BINFLOAT", 0x80: "PROTO", 0x81: "NEWOBJ", 0x82: "EXT1", 0x83: "EXT2",
    0x84: "EXT4", 0x85: "TUPLE1", 0x86: "TUPLE2", 0x87: "TUPLE3", 0x88: "NEWTRUE", 0x89: "NEWFALSE",
    0x8A: "LONG1", 0x8B: "LONG4", 0x42: "BINBYTES", 0x43: "SHORT_BINBYTES", 0x8C: "SHORT_BINUNICODE",
    0x8D: "BINUNICODE8", 0x8E: "BINBYTES8", 0x8F: "EMPTY_SET", 0x90: "ADDITEMS", 0x91: "FROZENSET",
    0x92: "NEWOBJ_EX", 0x93: "STACK_GLOBAL", 0x94: "MEMOIZE", 0x95: "FRAME", 0x96: "BYTEARRAY8",
    0x97: "NEXT_BUFFER", 0x98: "READONLY_BUFFER",
}
_U4 = struct.Struct("<I").unpack_from
_I4 = struct.Struct("<i").unpack_from
_U8 = struct.Struct("<Q").unpack_from
_U2 = struct.Struct("<H").unpack_from


def _c_int(line: bytes) -> int:
    """Protocol-0 INT as the C unpickler reads it: ``strtol(s, &end, 0)`` (0x10, 010 octal),
    then ``PyLong_FromString(s, NULL, 0)`` for what overflows a long."""
    text = line.strip()
    try:
        return int(text, 0)
    except ValueError:
        digits = text.lstrip(b"+-")
        if len(digits) > 1 and digits[:1] == b"0" and digits.isdigit():      # strtol's octal
            return int(text[:len(text) - len(digits)] + b"0o" + digits[1:], 0)
        raise


def opname(op: int) -> str:
    return _OPNAMES.get(op, f"0x{op:02x}")


class PickleWalker:
    """One walk over one pickle (up to its STOP), starting at an absolute offset.

    ``track_containers`` makes dicts, lists and sets real (bounded) Python containers so
    that a format helper can read object states (joblib's array wrappers need it); by
    default they are opaque, which keeps the walk fast and small.
    """

    def __init__(self, fh: BinaryIO, start: int, end: int, *, track_containers: bool = False,
                 on_build=None, build_hooks: frozenset[str] = frozenset(), fast: bool = True) -> None:
        self.r = _Reader(fh, start, end)
        self.track = track_containers
        # runs of same-shaped plain items matched in C (``shapes``); off where values are kept
        self.fast = fast and FAST_FORWARD and not track_containers
        self.ff_wait = 0                # MARKs to let pass before trying again
        self.ff_fails = 0
        self.ff_spent = 0               # pattern bytes compiled for shapes
        self.ff_items = 0               # items applied by ``shapes``
        self.ff_shape = None            # the last shape ``shapes`` matched
        self.ff_held: tuple = (None, 0)  # (the stack level, bytes its items would hold in this walk)
        self.tracked_keys = TRACKED_KEYS
        self.on_build = on_build        # on_build(walker, obj, state) after BUILD of an object
        self.build_hooks = build_hooks  # whose class is one of these dotted names
        self.hooked: dict[str, dict] = {}  # what on_build keeps across one walk (joblibwalk's wrappers)
        self.result = WalkResult(start=start)
        self._events: dict[tuple[str, str, str, str], Event] = {}
        self.memo: dict[int, object] = {}
        self.present = bytearray()      # 1 byte per memo key below TRACKED_KEYS
        self.sparse: dict[int, int] = {}
        self.small: list[object] = [MISSING] * 256    # what BINGET pushes for keys 0-255 (MISSING: unset)
        self.seq = True                 # keys are exactly 0 .. memo_len-1
        self.seq_upto = 0               # when seq ended: keys below this were present
        self.lost = False
        self.memo_len = 0               # distinct keys, as CPython counts them
        self.budget = MEMO_BUDGET
        self.proto = 0
        self.soft_error = ""            # the load reads on, but not as every unpickler does
        self.checking = False           # a name whose arguments are checked was imported
        #: tracked lists' real lengths (they keep their first 64 items): id -> (list, length)
        self.lengths: dict[int, tuple[list, int]] = {}
        #: tuples and calls of depth >= 2 seen lately: id -> (the object, kept alive; depth)
        self._depths: dict[int, tuple[object, int]] = {}
        self._depth_items = 0

    # -- memo -------------------------------------------------------------------------
    # ``present[key]`` says what the memo holds for the first TRACKED_KEYS keys: 0 nothing,
    # 1 an opaque value, 2 a value we stopped tracking (budget spent), 3 a value kept in
    # ``self.memo``. Pickles from ``pickle.dumps`` number their memo 0, 1, 2, ... (MEMOIZE,
    # or sequential PUTs); while that holds (``self.seq``) every key below ``memo_len`` is
    # present, and keys past TRACKED_KEYS cost nothing: their value is whatever
    # ``self.memo`` kept, else BEYOND (might be a str, so a global named by it blocks).
    def _memo_put(self, key: int, value) -> None:
        if key > self.r.end - self.result.start + MEMO_SLACK:
            # CPython's unpickler sizes its memo to twice the largest key (16 bytes a key,
            # zeroed): a 14-byte pickle naming key 2**32 makes it allocate 64 GiB. A pickler
            # numbers its memo from 0, one key per object it wrote: a key past the bytes
            # of the pickle was never written by one. (A plain-data stream that fastload
            # proves never reaches here: its child's address space is capped instead.)
            raise PickleError(f"memo key {key:,} in a pickle of {self.r.end - self.result.start:,} bytes: "
                              f"no pickler writes it, and the unpickler would allocate {16 * key:,} bytes for it")
        kind = self._memo_kind(value, key)
        if key < 256:
            self.small[key] = value if kind == 3 else _PUSHED[kind]
        present = self.present
        if self.seq and key <= self.memo_len:
            if key == self.memo_len:
                self.memo_len += 1
                if key < TRACKED_KEYS:
                    present.append(kind)
            elif key < TRACKED_KEYS:
                present[key] = kind
            return
        if self.seq:                                # a PUT out of sequence: track exactly
            self.seq = False
            self.seq_upto = self.memo_len
        if key < TRACKED_KEYS:
            if key >= len(present):
                present.extend(bytes(key + 1 - len(present)))
            if not present[key]:
                self.memo_len += 1
            present[key] = kind
        elif key in self.sparse or key < self.seq_upto:
            self.sparse[key] = kind
        elif len(self.sparse) >= SPARSE_KEYS:
            self.lost = True                        # numbering no longer exact: see _memo_get
        else:
            self.sparse[key] = kind
            self.memo_len += 1

    def _memo_kind(self, value, key: int) -> int:
        """Keep ``value`` in the memo if the budget allows; return its presence code."""
        memo = self.memo
        if value is OPAQUE:
            memo.pop(key, None)
            return 1
        t = type(value)
        if t is Ref or t is Persistent:
            memo[key] = value           # few, and needed to follow calls
            return 3
        cost = 64 + len(value) if t is str else 256
        if self.budget < cost:
            # a dropped tuple keeps its depth (presence code 3 + depth): see _tuple_depth
            depth = self._depth_of(value) if t is tuple or t is Call or t is Nested else 0
            if depth > 1 and key >= TRACKED_KEYS:
                memo[key] = _PUSHED[3 + depth]      # past the presence table (BEYOND counts 1)
            else:
                memo.pop(key, None)
            return 3 + depth if depth else 2
        self.budget -= cost
        memo[key] = value
        return 3

    def _memo_get(self, key: int, offset: int):
        if key < len(self.present):
            kind = self.present[key]
        elif key in self.sparse:
            kind = self.sparse[key]
        elif key < (self.memo_len if self.seq else self.seq_upto):
            return self.memo.get(key, BEYOND)
        elif self.lost:
            return LOST
        else:
            kind = 0
        if kind == 1:
            return OPAQUE
        if kind == 3:
            return self.memo[key]
        if kind == 2:
            return EVICTED
        if kind > 3:
            return _PUSHED[kind]
        raise PickleError(f"memo key {key} read before it was set (offset {offset})")

    # -- tuple depth ------------------------------------------------------------------
    def _tuple_depth(self, root) -> int:
        """How many tuples deep ``root`` (a tuple, a call's result, a dropped tuple) may be
        at load time; a PickleError past MAX_TUPLE_DEPTH.

        The real load hashes every dict key and set member, and CPython hashes a tuple by
        recursing in C once per level with no limit: a few bytes a level (TUPLE1 after
        TUPLE1, or each level a GET of the last) make a dict key whose load dies of SIGSEGV.
        No pickler writes one (pickle.dumps recurses per level too). A call's result counts
        one level over its arguments (a namedtuple holds them); a value the walk does not
        hold counts as its presence code says. Iterative, each object visited once, depths
        of 2 and more cached while the objects are alive."""
        t = type(root)
        if t is Nested:
            return root.depth
        if t is not tuple and t is not Call:
            return 0
        cache = self._depths
        done: dict[int, int] = {}
        work = [(root, 1)]
        while work:
            v, level = work[-1]
            if level > MAX_TUPLE_DEPTH:
                self._too_deep()
            if id(v) in done:
                work.pop()
                continue
            best, pending = 1, False
            for e in ((v.args,) if type(v) is Call else v):
                te = type(e)
                if te is tuple or te is Call:
                    d = done.get(id(e))
                    if d is None:
                        hit = cache.get(id(e))
                        if hit is None or hit[0] is not e:
                            work.append((e, level + 1))
                            pending = True
                            continue
                        d = hit[1]
                elif te is Nested:
                    d = e.depth
                elif te is Persistent:
                    d = 1                   # whatever persistent_load returns: one level
                else:
                    continue
                if d >= best:
                    best = d + 1
            if pending:
                continue
            work.pop()
            if best > MAX_TUPLE_DEPTH:
                self._too_deep()
            done[id(v)] = best
            if best > 1:
                if self._depth_items > DEPTH_CACHE:
                    cache.clear()
                    self._depth_items = 0
                cache[id(v)] = (v, best)
                self._depth_items += len(v) if type(v) is tuple else 1
        return done[id(root)]

    def _depth_of(self, v) -> int:
        """``_tuple_depth``, without its walk for a tuple of no nestable item (depth 1)."""
        if type(v) is tuple and not any(type(e) in _DEEPER for e in v):
            return 1
        return self._tuple_depth(v)

    def _too_deep(self) -> None:
        raise PickleError(f"a tuple nested more than {MAX_TUPLE_DEPTH} deep (or built of a memo value the walk "
                          "lost): no pickler writes one, and hashing it as a dict key or set member "
                          "overflows the C stack of the real load (SIGSEGV)")

    # -- events -----------------------------------------------------------------------
    def _event(self, kind: str, module: str, name: str, offset: int, op: str, detail: str = "") -> None:
        """One event, or one more of an event already seen (its first offset is kept)."""
        key = (kind, module, name, detail)
        ev = self._events.get(key)
        if ev is not None:
            ev.count += 1
            return
        if len(self._events) >= MAX_EVENTS:
            raise PickleError(f"more than {MAX_EVENTS:,} distinct imports and calls in one pickle "
                              "(built to exhaust the scanner): not scanned to the end")
        ev = self._events[key] = Event(kind, module, name, offset, op, detail)
        self.result.events.append(ev)

    def _global(self, module: str, name: str, offset: int, op: str) -> Ref:
        if self.proto < 3:
            module, name = map_py2(module, name)
        self._event("global", module, name, offset, op)
        ref = Ref(module, name)
        if ref.dotted in argchecks.CHECKS:
            self.checking = True
        return ref

    def _numpy_state(self, obj: Call, state, offset: int) -> None:
        """BUILD of ``numpy.dtype(...)`` or of an array ``_reconstruct`` made: its state is
        what numpy will believe (``dtypes``)."""
        from hpcml.scan import dtypes
        args = obj.args
        if type(obj.func) is Ref and obj.func.dotted in _RECONSTRUCT:
            problem = dtypes.array_problem(state, self)
        else:
            problem = dtypes.state_problem(args[0] if type(args) is tuple and args else None, state, self.track)
        if problem is not None:
            verdict, why = problem
            self._event("argument-dangerous" if verdict is Verdict.DANGEROUS else "argument", "numpy", "dtype",
                        offset, "BUILD", why)

    def _check_call(self, func, args, offset: int, op: str, kwargs: object = None) -> None:
        """A call of a named global once a checked name is in the stream (``argchecks``)."""
        if type(func) is not Ref:
            return
        for verdict, why in argchecks.judge(func.dotted, args, kwargs=kwargs):
            kind = "argument-dangerous" if verdict is Verdict.DANGEROUS else "argument"
            self._event(kind, func.module, func.name, offset, op, why)
        if func.dotted == "torch.storage._load_from_bytes" and type(args) is tuple and len(args) == 1 \
                and len(self.result.loaded) < MAX_LISTED:
            data = args[0]
            if type(data) is Blob:
                self.result.loaded.append((data.offset, data.length, None))
            elif type(data) is Call and type(data.args) is tuple and data.args:    # _codecs.encode(text, 'latin1')
                text = data.args[0]
                if type(text) is LongText:
                    self.result.loaded.append((text.offset, text.length, "utf-8"))
                elif type(text) is str:
                    self.result.loaded.append((offset, len(text), text.encode("latin-1", "replace")))

    def _call(self, func, offset: int, op: str) -> None:
        """A call of something that is not a global we resolved: block it."""
        if type(func) is Ref:
            return
        what = "the result of a call" if type(func) is Call else "a value built at load time"
        if type(func) is Persistent:
            what = "a persistent-load result"
        self._event("call", "", "", offset, op,
                                        f"calls {what}, not a named global")

    def _mutate(self, target, offset: int, op: str) -> None:
        """BUILD, SETITEM(S), APPEND(S) or ADDITEMS applied to a global changes that global."""
        if type(target) is Ref:
            self._event("mutate", target.module, target.name, offset, op,
                                            "changes attributes or items of an imported global")
        elif type(target) is Persistent:
            self._event("call", "", "", offset, op,
                                            "changes a persistent-load result")

    def _nested_check(self, offset: int, length: int) -> None:
        """Remember bytes arguments that start like a pickle: someone may load them."""
        r = self.r
        if length >= NESTED_MIN and len(self.result.nested) < MAX_LISTED and r.fill(3) \
                and looks_like_pickle(r.buf[r.pos:r.pos + 3]):
            self.result.nested.append((offset, length))

    # -- the walk ---------------------------------------------------------------------
    def walk(self) -> WalkResult:
        res = self.result
        try:
            self._run()
        except PickleError as exc:
            res.error = str(exc)
        except (IndexError, ValueError, struct.error, UnicodeDecodeError, OverflowError,
                RecursionError, MemoryError, TypeError) as exc:
            res.error = f"malformed at offset {self.r.base + self.r.pos}: {exc}"
        if self.soft_error:
            res.error = self.soft_error + (f"; then {res.error}" if res.error else "")
        res.protocol = self.proto
        if self.ff_items and (res.error or res.events or res.nested or res.loaded or res.opened):
            # not plain data: every finding and error comes from a walk that read every value
            return PickleWalker(self.r.fh, res.start, self.r.end, track_containers=self.track,
                                on_build=self.on_build, build_hooks=self.build_hooks, fast=False).walk()
        return res

    @staticmethod
    def _built_class(obj: Call) -> str:
        """The class an object was built of: the called global, or the class handed to
        ``copyreg._reconstructor``/``__newobj__`` (protocols 0-2 build instances that way)."""
        func, args = obj.func, obj.args
        if type(func) is Ref and func.dotted in _FACTORIES and type(args) is tuple and args \
                and type(args[0]) is Ref:
            return args[0].dotted
        return func.dotted if type(func) is Ref else ""

    def _straddle(self, fend: int) -> None:
        """An opcode crossed a frame's end: ``pickle.loads`` reads on linearly (as this walk
        does, so what it imports is still reported), but the verdict can no longer be safe."""
        self.soft_error = self.soft_error or (
            f"an opcode straddles the end of a FRAME at offset {fend}: pickle.py refuses it, and the C "
            "unpickler reading a file drops the rest of the frame and reads other bytes than pickle.loads")

    def _underflow(self, op: int):
        raise PickleError(f"stack underflow at {opname(op)} (offset {self.r.base + self.r.pos - 1})")

    def _readline(self, op: int) -> bytes:
        """A newline-terminated protocol-0 argument (without the newline)."""
        r = self.r
        while True:
            nl = r.buf.find(b"\n", r.pos)
            if nl >= 0:
                line = r.buf[r.pos:nl]
                r.pos = nl + 1
                return line
            if len(r.buf) - r.pos > MAX_LINE:
                raise PickleError(f"{opname(op)} argument line longer than {MAX_LINE} bytes")
            if not r.fill(len(r.buf) - r.pos + 4096) and r.buf.find(b"\n", r.pos) < 0:
                raise PickleError(f"truncated in the {opname(op)} argument")

    def _run(self) -> None:  # noqa: C901 - one dispatch loop, kept flat for speed
        """The hot loop: ``buf``/``pos`` live in locals and sync to the reader on refills."""
        r = self.r
        stack: list = []
        metastack: list[list] = []
        memo = self.memo
        present = self.present
        track = self.track
        OP = OPAQUE
        I4 = _I4
        buf, pos = r.buf, r.pos
        # ``fend``: the absolute end of the current FRAME (NO_FRAME outside one). ``limit``
        # stops the fast path before the end of the buffer and before ``fend``, so every
        # opcode starting at or after the frame's end passes the boundary check below.
        fend = NO_FRAME
        limit = len(buf) - 9
        memo_len = self.memo_len
        # True while keys are exactly 0..memo_len-1 (see _memo_put): MEMOIZE appends.
        seq = self.seq
        tracked = TRACKED_KEYS
        small = self.small
        U4 = _U4
        fast = self.fast
        ffn = 0                         # MARKs until the next try of ``shapes.fast_forward``
        while True:
            if pos > limit:
                r.pos = pos
                if r.base + pos >= fend:
                    if r.base + pos > fend:
                        self._straddle(fend)
                    fend = NO_FRAME
                if not r.fill(9) and not r.fill(1):
                    raise PickleError("truncated: the stream ended before STOP")
                buf, pos = r.buf, r.pos
                limit = min(len(buf) - 9, fend - r.base - 1)
            op = buf[pos]
            pos += 1
            # The frequent opcodes first, in the order an object-heavy pickle uses them.
            if op == 0x68:                                  # BINGET
                v = small[buf[pos]]
                pos += 1
                if v is MISSING:
                    v = self._memo_get(buf[pos - 1], r.base + pos - 2)
                stack.append(v)
                continue
            if op == 0x65 or op == 0x75:                    # APPENDS, SETITEMS
                items = stack
                try:
                    stack = metastack.pop()
                    target = stack[-1]
                except IndexError:
                    r.pos = pos
                    self._underflow(op)
                if target is not OP:
                    r.pos = pos
                    self._fill_container(op, target, items)
                elif op == 0x75 and len(items) % 2:
                    raise PickleError(f"odd number of items for SETITEMS at offset {r.base + pos - 1}")
                continue
            if op == 0x7D or op == 0x5D:                    # EMPTY_DICT, EMPTY_LIST
                v = ({} if op == 0x7D else []) if track else OP
                stack.append(v)
                # pickle.dumps always follows these with MEMOIZE and often with MARK:
                # do those here and save two trips round the loop (same effect).
                if seq and pos <= limit and buf[pos] == 0x94:
                    kind = 1 if v is OP else self._memo_kind(v, memo_len)
                    if memo_len < tracked:
                        present.append(kind)
                        if memo_len < 256:
                            small[memo_len] = v if kind == 3 else _PUSHED[kind]
                    memo_len += 1
                    pos += 1
                    if pos <= limit and buf[pos] == 0x28:
                        metastack.append(stack)
                        stack = []
                        pos += 1
                        if fast and seq:
                            ffn -= 1
                            if ffn <= 0:
                                fend, ffn, memo_len, buf, pos, limit = self._fast_forward(stack, fend, pos, memo_len)
                continue
            if op == 0x8C or op == 0x58:                    # SHORT_BINUNICODE, BINUNICODE
                if op == 0x8C:
                    n = buf[pos]
                    pos += 1
                else:
                    n = U4(buf, pos)[0]
                    if n > MAX_TRACKED_STR:                 # skipped, not read: see _rare
                        r.pos = pos
                        self.memo_len = memo_len
                        stack = self._rare(op, stack, metastack)
                        buf, pos = r.buf, r.pos
                        limit = min(len(buf) - 9, fend - r.base - 1)
                        continue
                    pos += 4
                if pos + n > len(buf):          # past the end of the buffer
                    r.pos = pos
                    if not r.fill(n):
                        raise PickleError("truncated in a SHORT_BINUNICODE argument")
                    buf, pos = r.buf, r.pos
                    limit = min(len(buf) - 9, fend - r.base - 1)
                v = buf[pos:pos + n].decode("utf-8", "surrogatepass")
                stack.append(v)
                pos += n
                if seq and pos <= limit and buf[pos] == 0x94:        # fused MEMOIZE
                    cost = 64 + n                   # as _memo_kind charges a str
                    if self.budget >= cost:
                        self.budget -= cost
                        memo[memo_len] = v
                        kind = 3
                    else:
                        kind = 2
                    if memo_len < tracked:
                        present.append(kind)
                        if memo_len < 256:
                            small[memo_len] = v if kind == 3 else EVICTED
                    memo_len += 1
                    pos += 1
                continue
            if op == 0x4A:                                  # BININT
                stack.append(I4(buf, pos)[0])                   # shapes and dtype states need it
                pos += 4
                continue
            if op == 0x88 or op == 0x89:                    # NEWTRUE, NEWFALSE
                stack.append(op == 0x88)
                continue
            if op == 0x4E:                                  # NONE
                stack.append(None)
                continue
            if op == 0x94 or op == 0x71 or op == 0x72:      # MEMOIZE, BINPUT, LONG_BINPUT
                if op == 0x94:
                    key = memo_len
                elif op == 0x71:
                    key = buf[pos]
                    pos += 1
                else:
                    key = U4(buf, pos)[0]
                    pos += 4
                try:
                    v = stack[-1]
                except IndexError:
                    r.pos = pos
                    self._underflow(op)
                if seq and key == memo_len:                 # the numbering pickle.dumps uses
                    kind = 1 if v is OP else self._memo_kind(v, memo_len)
                    if memo_len < tracked:
                        present.append(kind)
                        if memo_len < 256:
                            small[memo_len] = v if kind == 3 else _PUSHED[kind]
                    memo_len += 1
                else:
                    self.memo_len = memo_len
                    self._memo_put(key, v)
                    memo_len = self.memo_len
                    seq = self.seq
                continue
            if op == 0x28:                                  # MARK
                metastack.append(stack)
                stack = []
                if fast and seq:
                    ffn -= 1
                    if ffn <= 0:
                        fend, ffn, memo_len, buf, pos, limit = self._fast_forward(stack, fend, pos, memo_len)
                continue
            if op == 0x47:                                  # BINFLOAT
                stack.append(OP)
                pos += 8
                continue
            if op == 0x4B:                                  # BININT1
                stack.append(buf[pos])
                pos += 1
                continue
            if op == 0x4D:                                  # BININT2
                stack.append(buf[pos] | buf[pos + 1] << 8)
                pos += 2
                continue
            if op == 0x85 or op == 0x86 or op == 0x87:      # TUPLE1..3
                k = op - 0x84
                if len(stack) < k:
                    r.pos = pos
                    self._underflow(op)
                t = tuple(stack[-k:])
                del stack[-k:]
                for e in t:
                    if type(e) in _DEEPER:
                        self._tuple_depth(t)        # a PickleError past MAX_TUPLE_DEPTH
                        break
                stack.append(t)
                continue
            if op == 0x95:                                  # FRAME
                if fend != NO_FRAME:
                    self.soft_error = self.soft_error or (
                        f"a FRAME at offset {r.base + pos - 1} inside the frame that ends at offset {fend}: "
                        "pickle.py refuses it, and the C unpickler reading a file reads other bytes than pickle.loads")
                size = _U8(buf, pos)[0]
                pos += 8
                fend = r.base + pos + size
                if fend > r.end:
                    # The C unpickler refuses this; pickle.py reads the short frame and goes on:
                    # walk on as it does, so what it would import is still reported.
                    self.soft_error = self.soft_error or (
                        f"truncated: a FRAME of {size} bytes at offset {r.base + pos - 9} runs past the end")
                    fend = NO_FRAME
                limit = min(len(buf) - 9, fend - r.base - 1)
                continue
            if op == 0x6A:                                  # LONG_BINGET
                key = U4(buf, pos)[0]
                pos += 4
                if key < 256:
                    v = small[key]
                    if v is MISSING:
                        v = self._memo_get(key, r.base + pos - 5)
                else:
                    self.memo_len = memo_len
                    v = self._memo_get(key, r.base + pos - 5)
                stack.append(v)
                continue
            if op == 0x29:                                  # EMPTY_TUPLE
                stack.append(())
                continue
            if op == 0x52 or op == 0x81:                    # REDUCE, NEWOBJ
                try:
                    args = stack.pop()
                    func = stack.pop()
                except IndexError:
                    r.pos = pos
                    self._underflow(op)
                if type(func) is not Ref:
                    self._call(func, r.base + pos - 1, opname(op))
                elif self.checking:
                    self._check_call(func, args, r.base + pos - 1, opname(op))
                stack.append(Call(func, args))
                continue
            if op == 0x62:                                  # BUILD
                try:
                    state = stack.pop()
                    obj = stack[-1]
                except IndexError:
                    r.pos = pos
                    self._underflow(op)
                if type(obj) is Call:
                    obj.state = state
                    func = obj.func
                    if type(func) is Ref and (func.dotted == "numpy.dtype" or func.dotted in _RECONSTRUCT):
                        self._numpy_state(obj, state, r.base + pos - 1)
                    if type(func) is Ref and (func.dotted in self.build_hooks or func.dotted in _FACTORIES
                                              and self.build_hooks and self._built_class(obj) in self.build_hooks):
                        r.pos = pos
                        if fend != NO_FRAME:
                            # joblib commits the frame after the wrapper and reads the array
                            # bytes from the file itself: a frame not ended here reads elsewhere
                            if r.base + pos != fend:
                                self._straddle(fend)
                            fend = NO_FRAME
                        self.on_build(self, obj, state)
                        buf, pos = r.buf, r.pos
                        limit = min(len(buf) - 9, fend - r.base - 1)
                else:
                    self._mutate(obj, r.base + pos - 1, "BUILD")
                continue
            r.pos = pos
            self.memo_len = memo_len
            stack = self._rare(op, stack, metastack)
            if stack is None:
                return
            memo_len = self.memo_len
            seq = self.seq
            buf, pos = r.buf, r.pos
            limit = min(len(buf) - 9, fend - r.base - 1)

    def _fast_forward(self, stack: list, fend: int, pos: int, memo_len: int):
        """``shapes.fast_forward`` from just after a MARK, with the hot loop's locals synced
        both ways: (frame end, MARKs to skip, memo_len, buf, pos, limit) to go on with."""
        r = self.r
        r.pos = pos
        self.memo_len = memo_len
        fend = shapes.fast_forward(self, stack, fend)
        buf = r.buf
        return fend, self.ff_wait, self.memo_len, buf, r.pos, min(len(buf) - 9, fend - r.base - 1)

    def _make_list(self, items: list):
        if not self.track:
            return OPAQUE
        lst = list(items[:64])
        if len(items) > 64:
            self.lengths[id(lst)] = (lst, len(items))
        return lst

    def _fill_container(self, op: int, target, items: list) -> None:
        """APPENDS/SETITEMS on something we track: a global (blocked) or a bounded container."""
        if op == 0x75 and len(items) % 2:
            raise PickleError(f"odd number of items for SETITEMS at offset {self.r.base + self.r.pos - 1}")
        t = type(target)
        if t is dict and len(target) < 64:
            self._setitems(target, items)
        elif t is list:
            self._count(target, len(items))
            if len(target) < 64:
                target.extend(items[:64 - len(target)])
        else:
            self._mutate(target, self.r.base + self.r.pos - 1, opname(op))

    def _count(self, lst: list, added: int) -> None:
        """A tracked list grew by ``added`` items (kept or not). Only lists past the 64 kept
        are recorded: their items are not all there to count."""
        n = self.length(lst) + added
        if n > 64:
            self.lengths[id(lst)] = (lst, n)

    def length(self, lst: list) -> int:
        """How many items a tracked list holds at load time."""
        got = self.lengths.get(id(lst))
        return got[1] if got is not None and got[0] is lst else len(lst)

    # -- everything else: correctness over speed -------------------------------------
    def _rare(self, op: int, stack: list, metastack: list[list]):  # noqa: C901
        r = self.r
        here = r.base + r.pos - 1
        name = opname(op)

        def pop():
            if not stack:
                self._underflow(op)
            return stack.pop()

        def pop_mark():
            nonlocal stack
            if not metastack:
                self._underflow(op)
            items = stack
            stack = metastack.pop()
            return items

        def arg(n: int) -> bytes:
            if not r.fill(n):
                raise PickleError(f"truncated in the {name} argument")
            data = r.buf[r.pos:r.pos + n]
            r.pos += n
            return data

        def payload(n: int, *, text: bool) -> object:
            """A length-prefixed argument: small ones are read, large ones skipped."""
            if n < 0:
                raise PickleError(f"{name} has a negative length at offset {here}")
            start = r.base + r.pos
            if start + n > r.end:
                raise PickleError(f"truncated: the {name} argument of {n} bytes runs past the end")
            if text and n <= MAX_TRACKED_STR:
                return arg(n).decode("utf-8", "surrogatepass")
            if not text:
                self._nested_check(start, n)
            r.skip(n)
            if text:
                return LongText(start, n) if op in (0x58, 0x8D) else LONG_STR
            return OPAQUE

        if op == 0x2E:                                      # STOP
            self.result.value = pop()
            self.result.stopped = True
            self.result.end = r.base + r.pos
            return None
        if op == 0x80:                                      # PROTO
            proto = arg(1)[0]
            if proto > 5:
                raise PickleError(f"unsupported pickle protocol: {proto}")
            self.proto = proto
        elif op == 0x30:                                    # POP
            if stack:
                stack.pop()
            else:
                pop_mark()
        elif op == 0x31:                                    # POP_MARK
            pop_mark()
        elif op == 0x32:                                    # DUP
            v = pop()
            stack += (v, v)
        elif op == 0x4D:                                    # BININT2
            stack.append(_U2(arg(2))[0])
        elif op == 0x8A or op == 0x8B:                      # LONG1, LONG4
            n = arg(1)[0] if op == 0x8A else _I4(arg(4))[0]
            if n < 0:
                raise PickleError(f"LONG pickle has negative byte count at offset {here}")
            if n <= 64:
                stack.append(int.from_bytes(arg(n), "little", signed=True))
            else:
                payload(n, text=False)
                stack.append(BigInt(n))
                self.checking = True        # what it is handed to is checked (argchecks)
        elif op == 0x49:                                    # INT
            line = self._readline(op)
            stack.append(True if line == b"01" else False if line == b"00" else _c_int(line))
        elif op == 0x4C:                                    # LONG: PyLong_FromString(s, NULL, 0)
            line = self._readline(op)
            stack.append(int(line[:-1] if line.endswith(b"L") else line, 0))
        elif op == 0x46:                                    # FLOAT
            float(self._readline(op))
            stack.append(OPAQUE)
        elif op == 0x53:                                    # STRING
            stack.append(_unquote_string(self._readline(op)))
        elif op == 0x56:                                    # UNICODE
            stack.append(self._readline(op).decode("raw-unicode-escape"))
        elif op == 0x58:                                    # BINUNICODE
            stack.append(payload(_U4(arg(4))[0], text=True))
        elif op == 0x8D:                                    # BINUNICODE8
            stack.append(payload(_U8(arg(8))[0], text=True))
        elif op == 0x55:                                    # SHORT_BINSTRING (str by default)
            stack.append(payload(arg(1)[0], text=True))
        elif op == 0x54:                                    # BINSTRING
            stack.append(payload(_I4(arg(4))[0], text=True))
        elif op in (0x43, 0x42, 0x8E, 0x96):                # SHORT_BINBYTES, BINBYTES, BINBYTES8, BYTEARRAY8
            n = {0x43: lambda: arg(1)[0], 0x42: lambda: _U4(arg(4))[0]}.get(op, lambda: _U8(arg(8))[0])()
            at = r.base + r.pos
            payload(n, text=False)
            stack.append(Blob(at, n))
        elif op == 0x97:                                    # NEXT_BUFFER: out-of-band, empty without buffers
            raise PickleError("NEXT_BUFFER without out-of-band buffers (pickle.load would fail)")
        elif op == 0x98:                                    # READONLY_BUFFER
            pop()
            stack.append(OPAQUE)
        elif op == 0x74:                                    # TUPLE
            stack = self._replace_mark(stack, metastack, op, self._make_tuple)
        elif op == 0x6C:                                    # LIST
            stack = self._replace_mark(stack, metastack, op, self._make_list)
        elif op == 0x64:                                    # DICT
            stack = self._replace_mark(stack, metastack, op, self._make_dict)
        elif op == 0x8F:                                    # EMPTY_SET
            stack.append(OPAQUE)
        elif op == 0x91:                                    # FROZENSET
            stack = self._replace_mark(stack, metastack, op, lambda items: OPAQUE)
        elif op == 0x90:                                    # ADDITEMS
            pop_mark()
            if not stack:
                self._underflow(op)
            self._mutate(stack[-1], here, name)
        elif op == 0x61:                                    # APPEND
            v = pop()
            if not stack:
                self._underflow(op)
            lst = stack[-1]
            if self.track and type(lst) is list:
                self._count(lst, 1)
                if len(lst) < 64:
                    lst.append(v)
            self._mutate(lst, here, name)
        elif op == 0x73:                                    # SETITEM
            v = pop()
            k = pop()
            if not stack:
                self._underflow(op)
            d = stack[-1]
            if self.track and type(d) is dict and len(d) < 64:
                self._setitems(d, [k, v])
            self._mutate(d, here, name)
        elif op == 0x67:                                    # GET
            stack.append(self._memo_get(int(self._readline(op)), here))
        elif op == 0x70:                                    # PUT
            key = int(self._readline(op))
            if key < 0:
                raise PickleError(f"negative PUT argument at offset {here}")
            if not stack:
                self._underflow(op)
            self._memo_put(key, stack[-1])
        elif op == 0x63:                                    # GLOBAL
            module = self._readline(op).decode("utf-8")
            gname = self._readline(op).decode("utf-8")
            stack.append(self._global(module, gname, here, name))
        elif op == 0x93:                                    # STACK_GLOBAL
            gname = pop()
            module = pop()
            stack.append(self._stack_global(module, gname, here))
        elif op == 0x69:                                    # INST
            module = self._readline(op).decode("ascii")
            gname = self._readline(op).decode("ascii")
            ref = self._global(module, gname, here, name)
            args = tuple(pop_mark())
            if self.checking:
                self._check_call(ref, args, here, name)
            stack.append(Call(ref, args))
        elif op == 0x6F:                                    # OBJ
            items = pop_mark()
            if not items:
                self._underflow(op)
            self._call(items[0], here, name)
            if self.checking:
                self._check_call(items[0], tuple(items[1:]), here, name)
            stack.append(Call(items[0], tuple(items[1:])))
        elif op in (0x82, 0x83, 0x84):                      # EXT1, EXT2, EXT4
            code = {0x82: lambda: arg(1)[0], 0x83: lambda: _U2(arg(2))[0]}.get(op, lambda: _U4(arg(4))[0])()
            if code <= 0:
                raise PickleError(f"{name} has a non-positive extension code at offset {here}")
            self._event("ext", "copyreg", f"extension {code}", here, name,
                                            "imports whatever the loading process registered")
            stack.append(Call(OPAQUE, ()))
        elif op == 0x92:                                    # NEWOBJ_EX
            kwargs = pop()
            args = pop()
            func = pop()
            self._call(func, here, name)
            if self.checking:
                self._check_call(func, args, here, name, kwargs)
            stack.append(Call(func, args))
        elif op == 0x50:                                    # PERSID
            stack.append(Persistent(self._readline(op).decode("ascii")))
        elif op == 0x51:                                    # BINPERSID
            stack.append(Persistent(pop()))
        else:
            raise PickleError(f"invalid opcode 0x{op:02x} at offset {here}")
        return stack

    def _replace_mark(self, stack, metastack, op, build):
        if not metastack:
            self._underflow(op)
        items = stack
        stack = metastack.pop()
        stack.append(build(items))
        return stack

    def _make_tuple(self, items: list):
        """TUPLE: a tuple of depth checked; one longer than MAX_TUPLE is opaque, or kept as
        its depth if it holds tuples."""
        t = tuple(items)
        depth = self._depth_of(t)
        if len(t) <= MAX_TUPLE:
            return t
        return _PUSHED[3 + depth] if depth > 1 else OPAQUE

    def _make_dict(self, items: list):
        if len(items) % 2:
            raise PickleError("odd number of items for DICT")
        if not self.track:
            return OPAQUE
        d: dict = {}
        self._setitems(d, items[:128])
        return d

    @staticmethod
    def _setitems(d: dict, items: list) -> None:
        for i in range(0, len(items), 2):
            k = items[i]
            try:
                d[k] = items[i + 1]
            except TypeError:       # unhashable key (a tracked list or dict): the real load fails too
                raise PickleError("unhashable dictionary key") from None

    def _stack_global(self, module, gname, here: int):
        """STACK_GLOBAL: both names must be str at load time; anything unsure blocks."""
        if type(module) is str and type(gname) is str:
            return self._global(module, gname, here, "STACK_GLOBAL")
        for v in (module, gname):
            if type(v) in (Unknown, LongText, Nested, Call, Persistent):
                why = v.why if isinstance(v, Unknown) else "the result of a call"
                self._event("unresolved", "", "", here, "STACK_GLOBAL",
                                                f"global name comes from {why}")
                return Call(OPAQUE, ())
        raise PickleError(f"STACK_GLOBAL requires str (offset {here})")
