"""GGUF (llama.cpp, ggml): the metadata is read and checked, the tensor data is not.

Layout (ggml's ``docs/gguf.md``): ``GGUF``, a uint32 version, the tensor count and the
metadata key count (uint64; uint32 in version 1), the key-value pairs (a key is a string:
a uint64 length and UTF-8 bytes; a value is a uint32 type, 0 to 12, and the value; type 9
is an array: element type, uint64 count, elements), then per tensor its name, dimension
count, dimensions, ggml type and data offset; the data section is aligned to
``general.alignment`` (32 by default). Big-endian files use the same magic with values
byte-swapped.

What runs code: ``tokenizer.chat_template`` (and the named ``tokenizer.chat_template.*``)
is a Jinja2 template a chat loader renders with the conversation. Rendered outside a
sandbox it runs whatever Python it reaches (llama-cpp-python before 0.2.72,
CVE-2024-34359); a template that reaches for interpreter internals is ``dangerous``.
Counts and lengths are bounded by the file's size before anything is read, so a hostile
header cannot make the scan allocate; a file that ends early is an ``error``.
"""

from __future__ import annotations

import re
import struct
from typing import TYPE_CHECKING, BinaryIO

from hpcml.scan.formats import ScanContent, ScanFormat
from hpcml.scan.formats.bounded import ByteReader, Truncated
from hpcml.scan.model import Verdict
from hpcml.scan.templates import judge as templates_judge

if TYPE_CHECKING:
    from hpcml.scan.context import FileScan

MAGIC = b"GGUF"
#: value type -> struct code of the fixed-size types (8 is a string, 9 an array)
_FIXED = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9
MAX_KEYS = 1 << 16
MAX_DIMS = 4                       # GGML_MAX_DIMS: llama.cpp refuses more
MAX_TEMPLATE = 1 << 20
TEMPLATE_KEY = "tokenizer.chat_template"
#: what a template needs to leave a Jinja2 sandbox (or what only an escape would use)
SANDBOX_ESCAPE = re.compile(
    r"__[A-Za-z]\w*__"                          # __class__, __globals__, __subclasses__, __builtins__, ...
    r"|\bpopen\b|\bsubprocess\b|(?<![\w.])os\.|\b(?:eval|exec|compile)\s*\("
    r"|\|\s*attr\s*\("                          # attribute access by a computed name
    r"|\\x5[fF]|\\u005[fF]|\\U0000005[fF]|\\137|\\N\{LOW LINE\}")   # an underscore spelt as an escape


class GgufError(ValueError):
    pass


class _Reader:
    """Values read in order from a ``ByteReader``, in the file's byte order."""

    def __init__(self, reader: ByteReader, order: str, size_code: str) -> None:
        self.r, self.order, self.size_code, self.pos = reader, order, size_code, 0

    def fixed(self, code: str, what: str) -> int | float | bool:
        n = struct.calcsize(code)
        (value,) = struct.unpack(self.order + code, self.r.read(self.pos, n, what))
        self.pos += n
        return value

    def length(self, what: str, item_size: int = 1) -> int:
        at = self.pos
        n = int(self.fixed(self.size_code, what))
        if n * item_size > self.r.size - self.pos:
            unit = "items" if item_size > 1 else "bytes"
            raise GgufError(f"{what} at byte {at} says {n} {unit}, more than the rest of the file holds")
        return n

    def string(self, what: str, keep: int = 256) -> str:
        n = self.length(what)
        raw = self.r.read(self.pos, min(n, keep), what) if n <= keep else b""
        self.pos += n
        return raw.decode("utf-8", "replace")


def read(fh: BinaryIO, size: int) -> tuple[int, int, list[tuple[str, str | None]]]:
    """(version, tensor count, chat templates: key and text, None when too long to read; a
    key given twice is there twice) of a GGUF file; raises
    ``GgufError`` or ``Truncated`` for one llama.cpp would refuse."""
    reader = ByteReader(fh, size)
    head = reader.read(0, 8, "the header")
    if head[:4] != MAGIC:
        raise GgufError("no GGUF magic")
    order = "<"
    version = struct.unpack("<I", head[4:8])[0]
    if version & 0xFFFF == 0:
        order, version = ">", struct.unpack(">I", head[4:8])[0]
    if version not in (1, 2, 3):
        raise GgufError(f"GGUF version {version} (known: 1 to 3)")
    r = _Reader(reader, order, "I" if version == 1 else "Q")
    r.pos = 8
    n_tensors = r.length("the tensor count", 8 + 4 + 4 + 8)
    n_keys = r.length("the metadata key count", 8 + 4)
    if n_keys > MAX_KEYS:
        raise GgufError(f"{n_keys} metadata keys (hpcml reads at most {MAX_KEYS})")
    templates: list[tuple[str, str | None]] = []
    alignment = 32
    for _ in range(n_keys):
        key = r.string("a metadata key", keep=1024)
        kind = int(r.fixed("I", f"the type of {key!r}"))
        if key == TEMPLATE_KEY or key.startswith(TEMPLATE_KEY + "."):
            if kind != STRING:
                raise GgufError(f"{key!r} is of type {kind}, not a string")
            n = r.length(key)
            templates.append((key, r.r.read(r.pos, n, key).decode("utf-8", "replace") if n <= MAX_TEMPLATE else None))
            r.pos += n
        elif key == "general.alignment" and kind == 4:
            alignment = int(r.fixed("I", key))
            if alignment == 0 or alignment & (alignment - 1):
                raise GgufError(f"general.alignment {alignment} is not a power of two")
        else:
            _skip(r, kind, key, 0)
    last, last_name = -1, ""
    for i in range(n_tensors):
        name = r.string(f"the name of tensor {i}")
        dims = int(r.fixed("I", f"the dimension count of tensor {name!r}"))
        if dims > MAX_DIMS:
            raise GgufError(f"tensor {name!r} has {dims} dimensions (ggml allows {MAX_DIMS})")
        r.pos += 8 * dims + 4                      # the dimensions and the ggml type
        offset = int(r.fixed("Q", f"the data offset of tensor {name!r}"))
        if offset > last:
            last, last_name = offset, name
    data = -(-r.pos // alignment) * alignment
    if n_tensors and data + last > size:
        raise GgufError(f"tensor {last_name!r}'s data starts at byte {data + last}, past the end of the file "
                        f"({size} bytes)")
    return version, n_tensors, templates


def _skip(r: _Reader, kind: int, key: str, depth: int) -> None:
    if kind in _FIXED:
        r.pos += struct.calcsize(_FIXED[kind])
    elif kind == STRING:
        n = r.length(f"the value of {key!r}")          # reads the length: pos moves first
        r.pos += n
    elif kind == ARRAY and depth == 0:
        item = int(r.fixed("I", f"the element type of {key!r}"))
        if item in _FIXED:
            width = struct.calcsize(_FIXED[item])
            n = r.length(f"the array {key!r}", width)
            r.pos += n * width
        else:
            for _ in range(r.length(f"the array {key!r}", 8)):
                _skip(r, item, key, depth + 1)
    else:
        raise GgufError(f"{key!r} has value type {kind}, which GGUF does not define here")
    if r.pos > r.r.size:
        raise Truncated(f"the value of {key!r} runs past the end of the file ({r.r.size} bytes)")


def _scan(fs: FileScan, fh: BinaryIO, size: int, member: str, name: str, depth: int,
          scan_content: ScanContent) -> None:
    fs.set_format("gguf")
    try:
        version, n_tensors, templates = read(fh, size)
    except (GgufError, Truncated) as exc:
        fs.error(f"GGUF: {exc}", member)
        return
    fs.note(f"{member + ': ' if member else ''}GGUF v{version}, {n_tensors} tensors")
    for key, text in templates:
        if text is None:
            fs.not_scanned(f"GGUF {key}", "a Jinja2 template a chat loader renders on load: code when rendered "
                           f"outside a sandbox (llama-cpp-python before 0.2.72, CVE-2024-34359); longer than the "
                           f"{MAX_TEMPLATE >> 20} MiB hpcml reads", member)
            continue
        problem = templates_judge(text)
        if problem is None:
            fs.note(f"{member + ': ' if member else ''}GGUF {key}: a chat template that uses only the "
                    "conversation, loops, tests and filters (parsed with Jinja2's parser)")
        elif problem[0] is Verdict.DANGEROUS:
            fs.add(Verdict.DANGEROUS, f"GGUF {key}", f"a Jinja2 chat template that {problem[1]}: a sandbox "
                   "escape, code when a chat loader renders it outside a sandbox (llama-cpp-python before 0.2.72, "
                   "CVE-2024-34359)", member, None, "chat template")
        else:
            fs.error(f"GGUF {key}: {problem[1]}", member)
    fs.not_scanned("GGUF tensor data", "hpcml read the metadata and the tensor table, not the tensor data",
                   member)


FORMAT = ScanFormat(lambda head, size, name: head.startswith(MAGIC), _scan)
