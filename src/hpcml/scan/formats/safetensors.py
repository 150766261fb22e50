"""Safetensors: check that a file is what the format promises, without loading tensors.

A safetensors file is an 8-byte little-endian header length N, N bytes of UTF-8 JSON,
then a raw data section. Nothing in it executes, so the scanner's job is to confirm the
header is well formed and describes the data section exactly: a file that passes here is
one the reference library would also accept, and a file that fails is reported with the
tensor and key at fault. Only the header is read (at most ``MAX_HEADER_BYTES``); the
data section is checked by its size alone.
"""

from __future__ import annotations

import json
import struct
from typing import TYPE_CHECKING, Any, BinaryIO, TypeGuard

from hpcml.scan.formats import ScanContent, ScanFormat

if TYPE_CHECKING:
    from hpcml.scan.context import FileScan

#: The reference library refuses larger headers (``MAX_HEADER_SIZE`` in its tensor.rs).
MAX_HEADER_BYTES = 100_000_000
#: Sniffing is looser than validation so that an oversized header is still reported as
#: a broken safetensors file rather than as an unrecognised one.
_SNIFF_MAX_HEADER = 100 * 2**20
_METADATA_KEY = "__metadata__"
_TENSOR_KEYS = ("dtype", "shape", "data_offsets")
#: The reference library multiplies sizes in a 64-bit usize and rejects overflow.
_USIZE_LIMIT = 2**64
#: A hostile header can hold millions of bad entries; report enough to act on.
MAX_PROBLEMS = 50
_MAX_LINE = 300

#: Bits per element of every dtype safetensors 0.8 accepts (its ``Dtype`` enum).
#: F4 and F6 are packed: a tensor's bit count must be a whole number of bytes.
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8,
    "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
    "C64": 64, "F64": 64, "I64": 64, "U64": 64,
}


class _DuplicateKey(ValueError):
    pass


def looks_like(head: bytes, size: int) -> bool:
    """True if ``head`` (the first 9+ bytes) starts like a safetensors file of ``size`` bytes.

    There is no magic number, so this uses the one structural fact available: a
    plausible header length followed by the opening brace of a JSON object.
    """
    if len(head) < 9:
        return False
    (n,) = struct.unpack_from("<Q", head)
    return 2 <= n <= min(size - 8, _SNIFF_MAX_HEADER) and head[8:9] == b"{"


def validate(fh: BinaryIO, start: int, size: int) -> tuple[list[str], list[str]]:
    """Check the safetensors file occupying ``size`` bytes of ``fh`` from ``start``.

    Returns ``(problems, notes)``: problems are one-line reasons the file is malformed
    (empty when it is sound), notes are facts worth showing that change nothing.
    """
    header, header_len, problem = _read_header(fh, start, size)
    if header is None:
        return [_clip(problem)], []
    data_len = size - 8 - header_len
    problems: list[str] = []
    notes: list[str] = []
    spans: list[tuple[int, int, str]] = []
    all_spans_valid = True
    for name, entry in header.items():
        if name == _METADATA_KEY:
            problems += _check_metadata(entry, notes)
            continue
        span = _check_tensor(name, entry, data_len, problems, notes)
        if span is None:
            all_spans_valid = False
        else:
            spans.append((*span, name))
    # A tensor without usable offsets leaves a gap of unknown size: reporting it as a
    # hole as well would only repeat the problem already found.
    if all_spans_valid:
        problems += _check_layout(spans, data_len)
    plural = "" if len(spans) == 1 else "s"
    notes.insert(0, f"{len(spans)} tensor{plural}, {sum(e - b for b, e, _ in spans)} bytes of tensor data")
    return _cap([_clip(p) for p in problems]), [_clip(n) for n in notes]


def _read_header(fh: BinaryIO, start: int, size: int) -> tuple[dict[str, Any] | None, int, str]:
    """Read and parse the JSON header with two bounded reads.

    Returns ``(header, N, "")``, or ``(None, N, why)`` when it cannot be parsed.
    """
    if size < 8:
        return None, 0, f"file is {size} bytes, too short for the 8-byte header length"
    fh.seek(start)
    prefix = fh.read(8)
    if len(prefix) != 8:
        return None, 0, f"file ended after {len(prefix)} of the 8 header-length bytes"
    (n,) = struct.unpack("<Q", prefix)
    if n > MAX_HEADER_BYTES:
        return None, n, f"header length {n} exceeds the {MAX_HEADER_BYTES}-byte limit of the safetensors library"
    if 8 + n > size:
        return None, n, f"header length {n} runs past the end of the file ({size} bytes)"
    raw = fh.read(n)
    if len(raw) != n:
        return None, n, f"file ended after {len(raw)} of the {n} header bytes"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, n, f"header is not valid UTF-8 (byte {exc.start} of the header)"
    try:
        parsed = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except _DuplicateKey as exc:
        return None, n, f"header JSON has duplicate key {_q(exc.args[0])}"
    except RecursionError:
        return None, n, "header JSON nests too deeply to parse"
    except ValueError as exc:  # JSONDecodeError, or NaN/Infinity
        return None, n, f"header is not valid JSON: {exc}"
    if not isinstance(parsed, dict):
        return None, n, f"header JSON is {_kind(parsed)}, not an object"
    return parsed, n, ""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """Python's json keeps the last duplicate silently; a scanner must not guess which wins."""
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key)
        result[key] = value
    return result


def _no_constant(token: str) -> Any:
    """NaN and Infinity are not JSON; the library's parser refuses them, so do we."""
    raise ValueError(f"{token} is not allowed")


def _check_metadata(value: Any, notes: list[str]) -> list[str]:
    """``__metadata__`` is free-form but must be a string-to-string map."""
    if value is None:  # the library reads null as "no metadata"
        return []
    if not isinstance(value, dict):
        return [f"{_METADATA_KEY} is {_kind(value)}, not an object of strings"]
    bad = [k for k, v in value.items() if not isinstance(v, str)]
    if value:
        notes.append(f"metadata keys: {', '.join(map(_q, sorted(value)))}")  # writers use hash order
    return [f"{_METADATA_KEY}[{_q(k)}] is {_kind(value[k])}, not a string" for k in bad]


def _check_tensor(
    name: str, entry: Any, data_len: int, problems: list[str], notes: list[str]
) -> tuple[int, int] | None:
    """Check one tensor entry; return its byte span when its offsets are usable."""
    label = f"tensor {_q(name)}"
    if not isinstance(entry, dict):
        problems.append(f"{label}: entry is {_kind(entry)}, not an object")
        return None
    missing = [k for k in _TENSOR_KEYS if k not in entry]
    if missing:
        problems.append(f"{label}: missing {', '.join(map(_q, missing))}")
    extra = [k for k in entry if k not in _TENSOR_KEYS]
    if extra:
        notes.append(f"{label}: extra keys {', '.join(map(_q, extra))} (ignored by the loader)")

    dtype, shape, offsets = (entry.get(k) for k in _TENSOR_KEYS)
    if "dtype" in entry and not _known_dtype(dtype):
        problems.append(f"{label}: unknown dtype {_q(dtype)}")
    if "shape" in entry and not _is_uint_list(shape):
        problems.append(f"{label}: shape {_short(shape)} is not a list of non-negative integers")
        shape = None
    if "data_offsets" in entry and not (_is_uint_list(offsets) and len(offsets) == 2):
        problems.append(f"{label}: data_offsets {_short(offsets)} is not a pair of non-negative integers")
        return None
    if offsets is None:
        return None
    begin, end = offsets
    if begin > end:
        problems.append(f"{label}: data_offsets {offsets} end before they begin")
        return None
    if end > data_len:
        problems.append(f"{label}: data_offsets {offsets} end past the data section ({data_len} bytes)")
    if _known_dtype(dtype) and shape is not None:
        problems += _check_size(label, dtype, shape, offsets)
    return begin, end


def _check_size(label: str, dtype: str, shape: list[int], offsets: list[int]) -> list[str]:
    """The byte range must hold exactly prod(shape) elements of ``dtype``, packed."""
    count = 1
    for dim in shape:
        count *= dim
        if count >= _USIZE_LIMIT:
            return [f"{label}: shape {shape} overflows a 64-bit element count"]
    bits = count * DTYPE_BITS[dtype]
    if bits % 8:
        return [f"{label}: shape {shape} x {dtype} is {bits} bits, not a whole number of bytes"]
    if offsets[1] - offsets[0] != bits // 8:
        return [f"{label}: data_offsets {offsets} do not match shape {shape} x {dtype} ({bits // 8} bytes)"]
    return []


def _check_layout(spans: list[tuple[int, int, str]], data_len: int) -> list[str]:
    """Tensors must tile the data section: no overlap (aliasing) and no hidden bytes."""
    problems = []
    cursor, owner = 0, ""
    for begin, end, name in sorted(spans):
        if begin < cursor:
            problems.append(f"tensor {_q(name)}: data_offsets [{begin}, {end}] overlap tensor {_q(owner)}")
        elif begin > cursor:
            problems.append(f"data section bytes [{cursor}, {begin}) belong to no tensor "
                            f"(hole before tensor {_q(name)})")
        if end >= cursor:
            cursor, owner = end, name
    if cursor < data_len:
        problems.append(f"data section bytes [{cursor}, {data_len}) belong to no tensor (after the last one)")
    return problems


def _known_dtype(value: Any) -> TypeGuard[str]:
    return isinstance(value, str) and value in DTYPE_BITS


def _is_uint_list(value: Any) -> TypeGuard[list[int]]:
    return isinstance(value, list) and all(type(x) is int and x >= 0 for x in value)


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(value), "a number")


def _q(text: Any) -> str:
    """Quote a name from the file for a one-line message: escaped and not too long."""
    shown = repr(text)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def _short(value: Any) -> str:
    return _clip(json.dumps(value), 80)


def _clip(line: str, limit: int = _MAX_LINE) -> str:
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _cap(problems: list[str]) -> list[str]:
    if len(problems) <= MAX_PROBLEMS:
        return problems
    return problems[:MAX_PROBLEMS] + [f"... and {len(problems) - MAX_PROBLEMS} more problems"]


def _scan(fs: FileScan, fh: BinaryIO, size: int, member: str, name: str, depth: int,
          scan_content: ScanContent) -> None:
    fs.set_format("safetensors")
    problems, notes = validate(fh, 0, size)
    for p in problems:
        fs.error(p, member)
    fs.result.notes.extend(notes)


FORMAT = ScanFormat(lambda head, size, name: looks_like(head, size) or name.lower().endswith(".safetensors"),
                    _scan)
