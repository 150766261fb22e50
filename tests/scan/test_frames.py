"""Protocol 4+ frames: a scan reads a stream as every CPython unpickler does, or says error.

``pickle.loads`` ignores frames, ``pickle.py`` refuses an opcode that crosses a frame's end,
and the C unpickler reading a file without ``peek`` (``io.BytesIO``) drops what is left of a
frame when an opcode crosses its end, so it reads other bytes. A stream where these
readings can differ is never ``safe``. Files are built byte by byte, as fickling's
frame-boundary tests build theirs; the divergence is proven by CPython itself below.
"""

from __future__ import annotations

import io
import pickle
import struct

import pytest

from hpcml.scan import fastload
from hpcml.scan.model import Verdict
from hpcml.scan.scanner import scan_file


def _frame(body: bytes, size: int | None = None) -> bytes:
    return b"\x95" + struct.pack("<Q", len(body) if size is None else size) + body


def _proto(*parts: bytes) -> bytes:
    return b"\x80\x04" + b"".join(parts)


#: a frame that ends inside an opcode, for each way an opcode reads its argument
STRADDLES = {
    "fixed argument": _proto(_frame(b"J\x07"), b"\x00\x00\x00."),
    "length prefix": _proto(_frame(b"B\x14\x00"), b"\x00\x00" + b"A" * 20 + b"."),
    "payload after its length": _proto(_frame(b"B\x14\x00\x00\x00"), b"A" * 20 + b"."),
    "short string payload": _proto(_frame(b"\x8c\x05ab"), b"cde."),
    "text line": _proto(_frame(b"Vhell"), b"o world\n."),
    "global's lines": _proto(_frame(b"cos\nsys"), b"tem\n."),
    "frame inside a frame": _proto(_frame(b"N" + _frame(b"N")[:5], 6), b"\x00\x00\x00\x00N."),
}


def _write(tmp_path, data: bytes, name: str = "f.pkl"):
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("name", sorted(STRADDLES))
def test_an_opcode_across_a_frame_end_is_never_safe(name, tmp_path):
    data = STRADDLES[name]
    if name == "payload after its length":
        # pickle.py reads on from the file here, but no pickler writes an opcode split by a
        # frame (PEP 3154): fickling calls it malformed, and so does hpcml
        pickle._Unpickler(io.BytesIO(data)).load()
    else:
        with pytest.raises(pickle.UnpicklingError):
            pickle._Unpickler(io.BytesIO(data)).load()
    result = scan_file(_write(tmp_path, data))
    assert result.verdict is not Verdict.SAFE, result
    assert any("FRAME" in e for e in result.errors), result.errors


def test_a_global_after_a_straddle_is_still_named(tmp_path):
    data = _proto(_frame(b"J\x07"), b"\x00\x00\x000cos\nsystem\n(S'echo x'\ntR.")
    result = scan_file(_write(tmp_path, data))
    assert result.verdict is Verdict.DANGEROUS
    assert "os.system" in {f.name for f in result.findings}


def test_a_truncated_frame_reports_what_pickle_py_would_import(tmp_path):
    """pickle.py reads a frame shorter than announced and goes on; the C unpickler refuses."""
    data = _proto(_frame(b"\x8c\x02nt\x94\x8c\x06system\x94\x93\x94.", 40))
    with pytest.raises(pickle.UnpicklingError):
        pickle.loads(data)
    result = scan_file(_write(tmp_path, data))
    assert result.verdict is Verdict.DANGEROUS
    assert "nt.system" in {f.name for f in result.findings}
    assert any("FRAME" in e for e in result.errors)


@pytest.mark.parametrize("protocol", [4, 5])
@pytest.mark.parametrize("shape", ["small", "many frames", "large bytes outside frames"])
def test_frames_the_pickler_writes_are_safe(protocol, shape, tmp_path):
    obj = {"small": {"a": [1, 2.5, "x"]},
           "many frames": [{"k": str(i), "v": i} for i in range(40_000)],
           "large bytes outside frames": [b"x" * 200_000, "tail", bytearray(b"y" * 70_000)]}[shape]
    data = pickle.dumps(obj, protocol=protocol)
    assert b"\x95" in data
    result = scan_file(_write(tmp_path, data))
    assert result.verdict is Verdict.SAFE, (result.errors, result.findings)


def _divergent() -> bytes:
    """Over 1 MiB (the C fast path's size): read from a file without ``peek``, the frame's
    last byte is dropped and the rest is a string; read as ``pickle.loads`` reads it, the
    same bytes call ``os.system``."""
    pad = b"B" + struct.pack("<I", 1 << 20) + b"a" * (1 << 20) + b"0"
    exploit = b"cos\nsystem\n(S'echo hi'\ntR"
    tail = b"X" + struct.pack("<I", len(exploit))
    return b"\x80\x04" + pad + _frame(b"B\x06") + b"\x00\x00\x00\x00" + tail + exploit + b"."


class _Named(pickle.Unpickler):
    def find_class(self, module, name):
        raise LookupError(f"{module}.{name}")


def test_the_fast_path_never_decides_a_stream_with_frames(tmp_path):
    data = _divergent()
    assert pickle.Unpickler(io.BytesIO(data)).load() is not None        # one reading: plain data
    with pytest.raises(LookupError, match="os.system"):                 # the other: a global
        _Named(io.BufferedReader(io.BytesIO(data), buffer_size=len(data) + 1)).load()
    path = _write(tmp_path, data)
    with open(path, "rb") as fh:
        assert fastload.plain_data_ends(fh, 0, len(data)) is None
    result = scan_file(path)
    assert result.verdict is Verdict.DANGEROUS, result
    assert "os.system" in {f.name for f in result.findings}
