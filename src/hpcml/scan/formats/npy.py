"""NumPy ``.npy``: parse the header safely and say whether a pickle follows it.

An ``.npy`` file is a magic string, a version, a header length and a Python dict literal
(``descr``, ``fortran_order``, ``shape``), then the array data (format spec: NEP 1 and
the ``numpy.lib.format`` docs). Plain arrays are raw bytes and cannot execute anything;
arrays whose dtype holds Python objects are stored as a pickle right after the header,
and ``np.load(..., allow_pickle=True)`` would run it. So the scanner needs the header
parsed without ``eval``, the object/non-object decision, and where the payload starts.
"""

from __future__ import annotations

import ast
import io
import struct
import tokenize
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, BinaryIO

from hpcml.scan.formats import ScanContent, ScanFormat

if TYPE_CHECKING:
    import numpy as np

    from hpcml.scan.context import FileScan

MAGIC = b"\x93NUMPY"
#: Header-length field format and text encoding per major version (minor is always 0).
_VERSIONS: dict[tuple[int, int], tuple[str, str]] = {
    (1, 0): ("<H", "latin1"), (2, 0): ("<I", "latin1"), (3, 0): ("<I", "utf8"),
}
#: Version 2+ lengths go to 4 GiB; the largest real headers (wide structured dtypes) are
#: a few kB, so this bounds memory and ``literal_eval`` time without refusing real files.
MAX_HEADER_BYTES = 1 << 20
_KEYS = {"descr", "fortran_order", "shape"}
_MAX_SHOWN = 120


@dataclass(frozen=True)
class NpyHeader:
    """What the header promises, and where the data (or the pickle) begins."""

    version: tuple[int, int]
    descr: Any                     # the header's descr literal: a str, or a list of fields
    fortran_order: bool
    shape: tuple[int, ...]
    header_end: int                # absolute offset of the first data (or pickle) byte
    data_bytes: int | None         # None when ``has_object``: the payload is a pickle
    has_object: bool


def looks_like(head: bytes) -> bool:
    """The magic string is mandatory, so it alone decides (``.npz`` members included)."""
    return head.startswith(MAGIC)


def read_header(fh: IO[bytes], start: int, size: int) -> NpyHeader:
    """Parse the ``.npy`` occupying ``size`` bytes of ``fh`` from ``start``.

    Raises ``ValueError`` with a one-line reason when the header is malformed or, for
    arrays without objects, when the data is not exactly as long as the header says
    (a short file is truncated; a long one carries bytes ``np.load`` would never read).
    """
    version, text, header_end = _read_text(fh, start, size)
    fields = _parse_dict(text, version)
    descr, fortran_order, shape = fields["descr"], fields["fortran_order"], fields["shape"]
    if not isinstance(shape, tuple) or not all(type(d) is int and d >= 0 for d in shape):
        raise ValueError(f"shape {_show(shape)} is not a tuple of non-negative integers")
    if not isinstance(fortran_order, bool):
        raise ValueError(f"fortran_order {_show(fortran_order)} is not a boolean")  # noqa: TRY004
    dtype = _dtype(descr)
    has_object = _names_object(descr) or dtype.hasobject
    data_bytes = None
    if not has_object:
        data_bytes = dtype.itemsize
        for dim in shape:
            data_bytes *= dim
        _check_length(header_end + data_bytes, start + size, shape, descr)
    return NpyHeader(version, descr, fortran_order, shape, header_end, data_bytes, has_object)


def _read_text(fh: IO[bytes], start: int, size: int) -> tuple[tuple[int, int], str, int]:
    """Read the preamble and the header text; return (version, text, header_end)."""
    fh.seek(start)
    preamble = fh.read(min(size, len(MAGIC) + 2))
    if len(preamble) < len(MAGIC) + 2 or not preamble.startswith(MAGIC):
        raise ValueError("not an .npy file: missing the \\x93NUMPY magic and version")
    version = (preamble[-2], preamble[-1])
    if version not in _VERSIONS:
        raise ValueError(f"unsupported .npy format version {version[0]}.{version[1]}")
    length_format, encoding = _VERSIONS[version]
    width = struct.calcsize(length_format)
    raw_length = fh.read(width) if len(preamble) + width <= size else b""
    if len(raw_length) != width:
        raise ValueError("file ends inside the header length")
    (length,) = struct.unpack(length_format, raw_length)
    header_end = start + len(preamble) + width + length
    if length > MAX_HEADER_BYTES:
        raise ValueError(f"header length {length} exceeds the {MAX_HEADER_BYTES}-byte limit")
    if header_end > start + size:
        raise ValueError(f"header length {length} runs past the end of the file ({size} bytes)")
    raw = fh.read(length)
    if len(raw) != length:
        raise ValueError(f"file ended after {len(raw)} of the {length} header bytes")
    try:
        return version, raw.decode(encoding), header_end
    except UnicodeDecodeError as exc:
        raise ValueError(f"header is not valid {encoding} (byte {exc.start})") from None


def _parse_dict(text: str, version: tuple[int, int]) -> dict[str, Any]:
    """Evaluate the header literal safely and check it has exactly the three keys."""
    try:
        value = _literal(text)
    except SyntaxError:
        if version > (2, 0):
            raise ValueError(f"header is not a Python literal: {_show(text.strip())}") from None
        try:  # files written by Python 2 have long literals such as ``(3L,)``
            value = _literal(_drop_long_suffix(text))
        except (SyntaxError, tokenize.TokenError):
            raise ValueError(f"header is not a Python literal: {_show(text.strip())}") from None
    if not isinstance(value, dict):
        raise ValueError(f"header is {type(value).__name__}, not a dict")  # noqa: TRY004
    if value.keys() != _KEYS:
        raise ValueError(f"header keys {_show(sorted(map(str, value)))} are not {sorted(_KEYS)}")
    return value


def _literal(text: str) -> Any:
    """``ast.literal_eval`` with its other failure modes folded into ``SyntaxError``."""
    try:
        return ast.literal_eval(text)
    except (ValueError, TypeError, MemoryError, RecursionError) as exc:
        raise SyntaxError(str(exc)) from None


def _drop_long_suffix(text: str) -> str:
    """Remove Python 2 ``L`` suffixes the way ``numpy.lib.format`` does: by token."""
    tokens, after_number = [], False
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if not (after_number and token.type == tokenize.NAME and token.string == "L"):
            tokens.append(token)
        after_number = token.type == tokenize.NUMBER
    return tokenize.untokenize(tokens)


def _names_object(descr: Any) -> bool:
    """True if any type string in ``descr`` has the object code 'O'.

    Walks the literal rather than trusting one dtype attribute, so an object field
    nested in a structured or sub-array dtype is found; field names are not looked at.
    """
    if isinstance(descr, str):
        return "O" in descr
    if isinstance(descr, tuple):  # (base, subarray shape)
        return bool(descr) and _names_object(descr[0])
    if isinstance(descr, list):  # fields: (name, descr) or (name, descr, shape)
        return any(isinstance(f, tuple) and len(f) >= 2 and _names_object(f[1]) for f in descr)
    return False


def _dtype(descr: Any) -> np.dtype:
    """Build the dtype numpy would build; only literals reach it, so nothing runs."""
    if not isinstance(descr, (str, tuple, list)):
        raise ValueError(f"descr {_show(descr)} is not a dtype description")  # noqa: TRY004
    from numpy.lib.format import descr_to_dtype  # numpy is imported only for .npy files
    try:
        return descr_to_dtype(descr)  # type: ignore[arg-type]  # the stub omits str and tuple forms
    # numpy parses comma-separated type strings with a parser that raises SyntaxError
    except (TypeError, ValueError, SyntaxError, KeyError, IndexError, OverflowError, RecursionError):
        raise ValueError(f"descr {_show(descr)} is not a valid dtype") from None


def _check_length(data_end: int, file_end: int, shape: tuple[int, ...], descr: Any) -> None:
    if data_end == file_end:
        return
    gap = abs(file_end - data_end)
    if data_end > file_end:
        what = f"file is truncated: {gap} bytes missing"
    else:
        what = f"{gap} bytes follow the array data"
    raise ValueError(f"{what} for shape {_show(shape)} of {_show(descr)}")


def _show(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= _MAX_SHOWN else shown[: _MAX_SHOWN - 3] + "..."


def _scan(fs: FileScan, fh: BinaryIO, size: int, member: str, name: str, depth: int,
          scan_content: ScanContent) -> None:
    from hpcml.scan import pickles
    fs.set_format("numpy-npy")
    try:
        header = read_header(fh, 0, size)
    except (ValueError, OSError) as exc:
        fs.error(f"bad .npy header: {exc}", member)
        return
    if header.has_object:
        fs.note(f"{member or 'the array'} has an object dtype: its data is a pickle")
        pickles.scan_stream(fs, fh, header.header_end, size, member)


FORMAT = ScanFormat(lambda head, size, name: looks_like(head), _scan)
