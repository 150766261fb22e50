"""The values a pickle walk models (``picklewalk``), in a module of their own: the argument
checks (``argchecks``) and the dtype checks (``dtypes``) judge them, and the walk calls
those checks, so the types live below all three."""

from __future__ import annotations

from dataclasses import dataclass, field

from hpcml.errors import HpcmlError


class Opaque:
    """A value that cannot be a str at load time (number, container, bytes, ...)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<opaque>"


class Unknown:
    """A value we stopped tracking that might be a str at load time (evicted, long)."""

    __slots__ = ("why",)

    def __init__(self, why: str) -> None:
        self.why = why


class BigInt(Opaque):
    """An integer of more than 64 bytes written in the file: converting, hashing or taking
    the gcd of it costs time that grows faster than the file (argchecks refuses it)."""

    __slots__ = ("nbytes",)

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes


class LongText(Unknown):
    """A str longer than ``MAX_TRACKED_STR``, written in the file as UTF-8 (BINUNICODE,
    BINUNICODE8): where it is, so a call that turns it into bytes to load can be scanned."""

    __slots__ = ("offset", "length")

    def __init__(self, offset: int, length: int) -> None:
        super().__init__("a string longer than 4 KiB")
        self.offset, self.length = offset, length


class Nested(Unknown):
    """A tuple (or what may be one) ``depth`` tuples deep that the walk no longer holds (its
    memo value was dropped, or it is longer than the walk keeps): kept as its depth, so a
    tuple built of it still counts it. Hashing a tuple recurses in C once per level, with
    no limit: the real load of a dict keyed by a tuple nested ~10^5 deep dies of SIGSEGV."""

    __slots__ = ("depth",)

    def __init__(self, depth: int, why: str = "") -> None:
        super().__init__(why or f"a tuple nested {depth} deep, no longer held")
        self.depth = depth


#: a tuple nested deeper is malformed (``picklewalk``): pickle.dumps recurses once per level
#: and stops at the interpreter's recursion limit (1,000); the C stack overflows at ~10^5
MAX_TUPLE_DEPTH = 250

OPAQUE = Opaque()
LONG_STR = Unknown("a string longer than 4 KiB")
EVICTED = Unknown("a memo value dropped after the memo budget was spent (not a tuple)")
#: might be a str, or a tuple one level deep (a deeper one past the table is kept as its depth)
BEYOND = Nested(1, "a memo value past the first 1M entries, which is not kept")
LOST = Nested(MAX_TUPLE_DEPTH, "a memo entry after the memo numbering became too large to follow")
MISSING = Unknown("a memo key that was never set")
#: what a presence code reads back as: 1 opaque, 2 dropped (not a tuple), 3 kept (in the
#: memo), 3 + d: a dropped tuple of depth d (1 .. MAX_TUPLE_DEPTH)
_PUSHED = (None, OPAQUE, EVICTED, None) + tuple(Nested(d) for d in range(1, MAX_TUPLE_DEPTH + 1))


class Ref:
    """A global the load imports: ``module`` + dotted ``name``."""

    __slots__ = ("module", "name", "dotted")

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name, self.dotted = module, name, f"{module}.{name}"


class Blob:
    """Bytes written in the file (BINBYTES, SHORT_BINBYTES, BINBYTES8, BYTEARRAY8): where they
    are, so that a call that loads them (``torch.storage._load_from_bytes``) is scanned."""

    __slots__ = ("offset", "length")

    def __init__(self, offset: int, length: int) -> None:
        self.offset, self.length = offset, length


class Call:
    """The result of calling something at load time (REDUCE, NEWOBJ, INST, OBJ, ...)."""

    __slots__ = ("func", "args", "state")

    def __init__(self, func, args) -> None:
        self.func, self.args, self.state = func, args, None


class Persistent:
    """What ``persistent_load`` returns for a persistent id (torch storages)."""

    __slots__ = ("pid",)

    def __init__(self, pid) -> None:
        self.pid = pid


@dataclass
class Event:
    """Something a load would do beyond building plain data."""

    kind: str          # "global" (import), "ext" (copyreg extension), "unresolved", "call"
    module: str
    name: str
    offset: int        # absolute offset of the opcode in the file
    opcode: str
    detail: str = ""
    count: int = 1     # how many times the same event occurs in the pickle (the first is kept)


@dataclass
class WalkResult:
    start: int
    end: int = 0                    # offset just after STOP (or where the walk failed)
    protocol: int = 0
    events: list[Event] = field(default_factory=list)
    nested: list[tuple[int, int]] = field(default_factory=list)   # (offset, length) of bytes that look like pickles
    #: bytes a call loads as a torch file: (offset, length, how) with how None for bytes in
    #: the file, "utf-8" for text in the file encoded to latin-1, or the bytes themselves
    loaded: list[tuple[int, int, str | bytes | None]] = field(default_factory=list)
    opened: list[tuple[str, int]] = field(default_factory=list)   # (file name, offset) of files the load opens (joblib's NDArrayWrapper)
    #: where joblib's reading took bytes as an array's, not as this pickle's opcodes:
    #: (offset, True for an object array's own pickle, False for raw bytes); a plain
    #: unpickler reads opcodes there (``pickles`` walks that reading too)
    skipped: list[tuple[int, bool]] = field(default_factory=list)
    error: str | None = None
    stopped: bool = False           # reached STOP
    value: object = None            # the model of the top-level object (for format helpers)


class NeedTracking(Exception):
    """An object's state is not in the walk's model (dicts, lists and sets are opaque unless
    tracked): walk this pickle again with containers tracked (``pickles.walk_one``)."""


class PickleError(HpcmlError):
    """The real unpickler would fail here too: the stream is malformed or truncated (exit 7,
    as for a scanned file that cannot be parsed)."""

    exit_code = 7
