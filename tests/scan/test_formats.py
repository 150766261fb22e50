"""Format checks of ``hpcml scan``: real files pass, each corruption names its fault,
and nothing reads more than the header."""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.numpy as st_numpy
from numpy.lib import format as npformat
from safetensors import safe_open

from hpcml.scan.formats import npy
from hpcml.scan.formats import safetensors as st
from tests import needs

# --- helpers -----------------------------------------------------------------------

def st_file(header: dict | str | bytes, data: bytes = b"") -> bytes:
    """A safetensors file from a header (dict, JSON text or raw bytes) and a data section."""
    if isinstance(header, dict):
        header = json.dumps(header)
    if isinstance(header, str):
        header = header.encode()
    return struct.pack("<Q", len(header)) + header + data


def validate(raw: bytes, prefix: bytes = b"", suffix: bytes = b"") -> tuple[list[str], list[str]]:
    """Validate ``raw`` placed between unrelated bytes, as inside a container."""
    fh = io.BytesIO(prefix + raw + suffix)
    fh.seek(len(prefix) + 3)  # the checker must not rely on the current position
    return st.validate(fh, len(prefix), len(raw))


def library_accepts(raw: bytes, tmp_path: Path) -> bool:
    path = tmp_path / "probe.safetensors"
    path.write_bytes(raw)
    try:
        with safe_open(str(path), "np") as f:
            for name in f.keys():  # noqa: SIM118 (not a dict)
                f.get_slice(name)
    except Exception:  # noqa: BLE001 (any refusal counts, whatever its type)
        return False
    return True


class CountingReader:
    """A file wrapper that records every read, to prove only headers are read."""

    def __init__(self, fh: Any) -> None:
        self._fh = fh
        self.bytes_read = 0
        self.unbounded_reads = 0

    def read(self, n: int | None = -1) -> bytes:
        if n is None or n < 0:
            self.unbounded_reads += 1
        data = self._fh.read(n)
        self.bytes_read += len(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._fh.seek(offset, whence)

    def tell(self) -> int:
        return self._fh.tell()


# A hand-built file the reference library accepts; every corruption below starts from it.
BASE_HEADER = {
    "__metadata__": {"format": "pt"},
    "w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]},
    "b": {"dtype": "I64", "shape": [2], "data_offsets": [12, 28]},
}
BASE_DATA = bytes(range(28))


def corrupt(**entries: Any) -> bytes:
    """BASE with some top-level entries replaced (None removes one)."""
    header = {k: v for k, v in {**BASE_HEADER, **entries}.items() if v is not None}
    return st_file(header, BASE_DATA)


def tensor(dtype: Any = "F32", shape: Any = (3,), offsets: Any = (0, 12), **extra: Any) -> dict:
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets), **extra}


# --- safetensors: real files ---------------------------------------------------------

def test_base_file_is_valid_for_library_and_checker(tmp_path: Path) -> None:
    raw = st_file(BASE_HEADER, BASE_DATA)
    assert library_accepts(raw, tmp_path)
    problems, notes = validate(raw)
    assert problems == []
    assert notes == ["2 tensors, 28 bytes of tensor data", "metadata keys: 'format'"]


def test_numpy_saved_file_is_clean(tmp_path: Path) -> None:
    path = tmp_path / "np.safetensors"
    tensors = {
        "f32": np.arange(6, dtype=np.float32).reshape(2, 3), "f64": np.ones(4),
        "i8": np.arange(5, dtype=np.int8), "u16": np.zeros((2, 2), np.uint16),
        "bool": np.array([True, False, True]), "empty": np.zeros((0, 7), np.int64),
        "scalar": np.array(3.5, np.float32),
    }
    st_numpy.save_file(tensors, str(path), metadata={"format": "np", "step": "10"})
    raw = path.read_bytes()
    assert st.looks_like(raw[:16], len(raw))
    problems, notes = validate(raw, prefix=b"junk" * 5, suffix=b"more junk")
    assert problems == []
    total = sum(a.nbytes for a in tensors.values())
    assert notes == [f"7 tensors, {total} bytes of tensor data", "metadata keys: 'format', 'step'"]


def test_torch_dtypes_are_clean() -> None:
    torch = needs.module("torch")
    from safetensors.torch import save

    tensors = {
        "bf16": torch.ones(3, dtype=torch.bfloat16), "f16": torch.ones(2, 2, dtype=torch.float16),
        "c64": torch.zeros(2, dtype=torch.complex64), "empty": torch.zeros(0, dtype=torch.bfloat16),
    }
    for name, dtype in [("f8", "float8_e4m3fn"), ("e8m0", "float8_e8m0fnu"), ("f4", "float4_e2m1fn_x2")]:
        if hasattr(torch, dtype):  # F4 is packed: 3 bytes hold 6 elements
            tensors[name] = torch.zeros(3, dtype=torch.uint8).view(getattr(torch, dtype))
    total = sum(t.nbytes for t in tensors.values())
    assert validate(save(tensors)) == ([], [f"{len(tensors)} tensors, {total} bytes of tensor data"])


def test_extra_tensor_key_is_a_note_not_a_problem(tmp_path: Path) -> None:
    raw = corrupt(w=tensor(note="hi"))
    assert library_accepts(raw, tmp_path)
    problems, notes = validate(raw)
    assert problems == []
    assert "tensor 'w': extra keys 'note' (ignored by the loader)" in notes


# --- safetensors: corruptions --------------------------------------------------------

def with_length(raw: bytes, n: int) -> bytes:
    return struct.pack("<Q", n) + raw[8:]


BASE = st_file(BASE_HEADER, BASE_DATA)
BASE_TEXT = json.dumps(BASE_HEADER)

CORRUPTIONS: dict[str, tuple[bytes, str]] = {
    "header too big": (with_length(BASE, 2**40), "header length 1099511627776 exceeds the 100000000-byte limit"),
    "header past end": (with_length(BASE, len(BASE)), f"header length {len(BASE)} runs past the end of the file"),
    "truncated header": (BASE[:30], "runs past the end of the file (30 bytes)"),
    "truncated length": (BASE[:5], "file is 5 bytes, too short"),
    "truncated data": (BASE[:-4], "tensor 'b': data_offsets [12, 28] end past the data section (24 bytes)"),
    "bad json": (st_file(BASE_TEXT[:-1] + ",}", BASE_DATA), "header is not valid JSON"),
    "nan": (st_file(BASE_TEXT.replace('"pt"', "NaN"), BASE_DATA), "NaN is not allowed"),
    "not utf-8": (st_file(BASE_TEXT.encode().replace(b"pt", b"p\xff"), BASE_DATA), "not valid UTF-8"),
    "not an object": (st_file("[1, 2]", BASE_DATA), "header JSON is a list, not an object"),
    "duplicate tensor": (st_file(BASE_TEXT[:-1] + ', "w": ' + json.dumps(tensor()) + "}", BASE_DATA),
                         "header JSON has duplicate key 'w'"),
    "duplicate field": (st_file(BASE_TEXT.replace('"shape": [3]', '"shape": [3], "shape": [3]'), BASE_DATA),
                        "duplicate key 'shape'"),
    "overlap": (corrupt(b=tensor("I64", [2], [8, 24]), tail=tensor("U8", [4], [24, 28])),
                "tensor 'b': data_offsets [8, 24] overlap tensor 'w'"),
    "hole": (corrupt(b=tensor("I32", [2], [16, 24]), tail=tensor("U8", [4], [24, 28])),
             "data section bytes [12, 16) belong to no tensor (hole before tensor 'b')"),
    "trailing bytes": (st_file(BASE_HEADER, BASE_DATA + b"hidden"),
                       "data section bytes [28, 34) belong to no tensor (after the last one)"),
    "offsets past end": (corrupt(b=tensor("I64", [2], [12, 44])), "end past the data section (28 bytes)"),
    "begin after end": (corrupt(b=tensor("I64", [0], [28, 12])), "tensor 'b': data_offsets [28, 12] end before"),
    "unknown dtype": (corrupt(w=tensor("F17")), "tensor 'w': unknown dtype 'F17'"),
    "dtype not a string": (corrupt(w=tensor(["F32"])), "tensor 'w': unknown dtype ['F32']"),
    "shape mismatch": (corrupt(w=tensor(shape=[4])),
                       "tensor 'w': data_offsets [0, 12] do not match shape [4] x F32 (16 bytes)"),
    "dtype mismatch": (corrupt(w=tensor("F64")),
                       "tensor 'w': data_offsets [0, 12] do not match shape [3] x F64 (24 bytes)"),
    "packed f4 half byte": (corrupt(w=tensor("F4", [23])), "shape [23] x F4 is 92 bits, not a whole number of bytes"),
    "negative dim": (corrupt(w=tensor(shape=[-3])), "tensor 'w': shape [-3] is not a list of non-negative"),
    "float dim": (corrupt(w=tensor(shape=[3.0])), "tensor 'w': shape [3.0] is not a list"),
    "overflow": (corrupt(w=tensor(shape=[2**40, 2**40])), "overflows a 64-bit element count"),
    "offsets not a pair": (corrupt(w=tensor(offsets=[0, 6, 12])), "tensor 'w': data_offsets [0, 6, 12] is not a pair"),
    "missing key": (corrupt(w={"dtype": "F32", "shape": [3]}), "tensor 'w': missing 'data_offsets'"),
    "entry not object": (corrupt(w="F32"), "tensor 'w': entry is a string, not an object"),
    "metadata not str": (corrupt(__metadata__={"format": "pt", "epoch": 3}),
                         "__metadata__['epoch'] is a number, not a string"),
    "metadata not map": (corrupt(__metadata__=["pt"]), "__metadata__ is a list, not an object of strings"),
}
LIBRARY_ACCEPTS = {"duplicate tensor"}  # its JSON map keeps the last duplicate name


@pytest.mark.parametrize("case", CORRUPTIONS)
def test_corruption_gives_specific_problem(case: str, tmp_path: Path) -> None:
    raw, expected = CORRUPTIONS[case]
    problems, _ = validate(raw, prefix=b"\0" * 9)
    assert any(expected in p for p in problems), problems
    assert all("\n" not in p for p in problems)
    # The checker is never looser than the library, and only stricter where intended.
    assert library_accepts(raw, tmp_path) == (case in LIBRARY_ACCEPTS)


def test_problems_are_capped_and_clipped() -> None:
    header = {"x" * 1000: tensor("F32", [1] * 500, [2400, 2412])}  # a name and shape too long to show
    header.update({f"t{i}": tensor("F17", offsets=[12 * i, 12 * i + 12]) for i in range(200)})
    problems, _ = validate(st_file(header, bytes(2412)))
    assert len(problems) == st.MAX_PROBLEMS + 1
    assert problems[-1] == "... and 151 more problems"
    assert problems[0].startswith("tensor 'xxx") and problems[0].endswith("...")
    assert max(map(len, problems)) == 300


def test_no_hole_reported_for_tensor_without_offsets() -> None:
    problems, _ = validate(corrupt(w={"dtype": "F32", "shape": [3]}))
    assert problems == ["tensor 'w': missing 'data_offsets'"]


@pytest.mark.parametrize("head,size,expected", [
    (BASE[:16], len(BASE), True),
    (BASE[:9], len(BASE), True),
    (BASE[:8], len(BASE), False),                             # cannot see the brace
    (with_length(BASE, 1)[:16], len(BASE), False),            # "{" alone is no header
    (with_length(BASE, len(BASE))[:16], len(BASE), False),    # longer than the file
    (with_length(BASE, 100 * 2**20 + 1)[:16], 2**30, False),  # beyond any real header
    (BASE[:8] + b" {", len(BASE), False),
    (b"\x80\x04\x95" + bytes(13), 100, False),                # a pickle
    (npy.MAGIC + bytes(10), 100, False),
])
def test_safetensors_sniffing(head: bytes, size: int, expected: bool) -> None:
    assert st.looks_like(head, size) is expected


def test_safetensors_reads_only_the_header_of_a_huge_file(tmp_path: Path) -> None:
    path = tmp_path / "huge.safetensors"
    header = st_file({"big": tensor("F32", [2**28], [0, 2**30])})
    with open(path, "wb") as f:
        f.write(header)
        f.truncate(len(header) + 2**30)  # sparse: takes no disk space
    with open(path, "rb") as f:
        reader = CountingReader(f)
        assert st.validate(reader, 0, path.stat().st_size) == ([], ["1 tensor, 1073741824 bytes of tensor data"])
    assert reader.unbounded_reads == 0
    assert reader.bytes_read == len(header)


# --- npy -----------------------------------------------------------------------------

def npy_bytes(array: np.ndarray, version: tuple[int, int] | None = None) -> bytes:
    buf = io.BytesIO()
    npformat.write_array(buf, array, version=version)
    return buf.getvalue()


def read(raw: bytes, prefix: bytes = b"") -> npy.NpyHeader:
    fh = io.BytesIO(prefix + raw + b"trailing container bytes")
    return npy.read_header(fh, len(prefix), len(raw))


ARRAYS: dict[str, np.ndarray] = {
    "c order": np.arange(12, dtype="<f4").reshape(3, 4),
    "fortran": np.asfortranarray(np.arange(12, dtype=">i8").reshape(3, 4)),
    "structured": np.zeros(4, dtype=[("x", "<f8"), ("y", "<i2", (3,)), ("name", "U5")]),
    "padded": np.zeros(3, dtype=np.dtype({"names": ["a"], "formats": ["<i2"], "offsets": [2], "itemsize": 8})),
    "nested": np.zeros(2, dtype=[("outer", [("inner", "<f4"), ("flag", "?")])]),
    "datetime": np.array(["2024-01-01"], dtype="M8[D]"),
    "scalar": np.array(7, dtype="<u2"),
    "empty": np.zeros((0, 5), dtype="<c16"),
    "unicode field": np.zeros(2, dtype=[("température", "<f4")]),  # needs version 3.0
    "object": np.array([1, "two", None], dtype=object),
    "object field": np.zeros(2, dtype=[("a", "<i4"), ("b", "O")]),
    "object deep": np.zeros(2, dtype=[("a", [("b", "O", (2,))])]),
}


@pytest.mark.parametrize("version", [None, (2, 0)])
@pytest.mark.parametrize("name", ARRAYS)
def test_npy_headers_match_numpy(name: str, version: tuple[int, int] | None) -> None:
    array = ARRAYS[name]
    if name == "unicode field" and version == (2, 0):
        version = (3, 0)
    raw = npy_bytes(array, version)
    header = read(raw, prefix=b"x" * 11)
    fortran = array.flags.f_contiguous and not array.flags.c_contiguous
    assert npy.looks_like(raw[:16])
    assert header.version == npformat.read_magic(io.BytesIO(raw))
    assert (header.shape, header.fortran_order) == (array.shape, fortran)
    assert npformat.descr_to_dtype(header.descr) == array.dtype
    assert header.has_object is array.dtype.hasobject
    end = header.header_end - 11
    assert end % npformat.ARRAY_ALIGN == 0  # numpy pads the header to this boundary
    if header.has_object:
        assert header.data_bytes is None
        assert raw[end:end + 1] == b"\x80"  # the pickle's PROTO opcode starts right there
    else:
        assert header.data_bytes == array.nbytes == len(raw) - end


def test_np_save_file(tmp_path: Path) -> None:
    path = tmp_path / "a.npy"
    np.save(path, np.ones((2, 3)))
    with open(path, "rb") as f:
        header = npy.read_header(f, 0, path.stat().st_size)
    assert (header.descr, header.shape, header.data_bytes, header.header_end) == ("<f8", (2, 3), 48, 128)


def npy_raw(header: str, version: tuple[int, int] = (1, 0), data: bytes = b"") -> bytes:
    """An .npy with a hand-written header text."""
    length_format, encoding = {1: ("<H", "latin1"), 2: ("<I", "latin1"), 3: ("<I", "utf8")}[version[0]]
    text = header.encode(encoding) + b"\n"
    return npy.MAGIC + bytes(version) + struct.pack(length_format, len(text)) + text + data


def header_text(descr: Any = "<i8", fortran: Any = False, shape: Any = (3,)) -> str:
    return f"{{'descr': {descr!r}, 'fortran_order': {fortran!r}, 'shape': {shape!r}, }}"


def test_python2_long_literals_are_accepted() -> None:
    raw = npy_raw("{'descr': '<i8', 'fortran_order': False, 'shape': (3L, 2L), }", data=bytes(48))
    assert read(raw).shape == (3, 2)


@pytest.mark.parametrize("descr,has_object", [
    ([("Obj", "<f4"), ("ONE", "<i4")], False),       # an 'O' in a field name is not an object
    ([("a", [("b", [("c", "|O")])])], True),
    ([("a", "<f4", (2,)), ("b", "O8")], True),
    ("object", True),                                 # numpy's spelled-out name
])
def test_object_detection(descr: Any, has_object: bool) -> None:
    data = b"" if has_object else bytes(np.dtype(npformat.descr_to_dtype(descr)).itemsize * 3)
    header = read(npy_raw(header_text(descr), data=data))
    assert header.has_object is has_object
    assert (header.data_bytes is None) is has_object


GOOD = header_text()
MALFORMED: dict[str, tuple[bytes, str]] = {
    "no magic": (b"\x93NUMPX\x01\x00" + bytes(20), "missing the \\x93NUMPY magic"),
    "too short": (npy.MAGIC + b"\x01", "missing the \\x93NUMPY magic and version"),
    "version 1.1": (npy.MAGIC + b"\x01\x01" + npy_raw(GOOD)[8:], "unsupported .npy format version 1.1"),
    "version 4.0": (npy.MAGIC + b"\x04\x00" + npy_raw(GOOD)[8:], "unsupported .npy format version 4.0"),
    "no length": (npy.MAGIC + b"\x02\x00\x10", "file ends inside the header length"),
    "header past end": (npy_raw(GOOD)[:40], "runs past the end of the file (40 bytes)"),
    "huge header": (npy.MAGIC + b"\x02\x00" + struct.pack("<I", 2**31), "exceeds the 1048576-byte limit"),
    "code": (npy_raw(header_text().replace("'<i8'", "__import__('os').system('false')")),
             "header is not a Python literal"),
    "not a dict": (npy_raw("['<i8', False, (3,)]"), "header is list, not a dict"),
    "missing key": (npy_raw("{'descr': '<i8', 'shape': (3,)}"),
                    "header keys ['descr', 'shape'] are not ['descr', 'fortran_order', 'shape']"),
    "extra key": (npy_raw(GOOD[:-1] + "'x': 1}", data=bytes(24)), "header keys ['descr', 'fortran_order'"),
    "negative dim": (npy_raw(header_text(shape=(-3,))), "shape (-3,) is not a tuple of non-negative"),
    "shape list": (npy_raw(header_text(shape=[3]), data=bytes(24)), "shape [3] is not a tuple"),
    "fortran int": (npy_raw(header_text(fortran=0), data=bytes(24)), "fortran_order 0 is not a boolean"),
    "bad descr": (npy_raw(header_text(descr="<i9")), "descr '<i9' is not a valid dtype"),
    "descr syntax": (npy_raw(header_text(descr=[("a", "<,i4")])), "is not a valid dtype"),  # numpy: SyntaxError
    "descr dict": (npy_raw(header_text(descr={"names": ["a"]})), "is not a dtype description"),
    "v3 not utf-8": (npy_raw(GOOD, version=(3, 0)).replace(b"<i8", b"<\xff8"), "header is not valid utf8"),
    "truncated data": (npy_raw(GOOD, data=bytes(20)), "file is truncated: 4 bytes missing for shape (3,) of '<i8'"),
    "trailing data": (npy_raw(GOOD, data=bytes(30)), "6 bytes follow the array data"),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_npy_raises_one_line(case: str) -> None:
    raw, expected = MALFORMED[case]
    with pytest.raises(ValueError) as excinfo:
        read(raw, prefix=b"\x93NUMPY")
    assert expected in str(excinfo.value)
    assert "\n" not in str(excinfo.value)


def test_npy_reads_only_the_header_of_a_huge_file(tmp_path: Path) -> None:
    path = tmp_path / "huge.npy"
    with open(path, "wb") as f:
        npformat.write_array_header_2_0(f, {"descr": "<f4", "fortran_order": False, "shape": (2**28,)})
        header_len = f.tell()
        f.truncate(header_len + 2**30)
    with open(path, "rb") as f:
        reader = CountingReader(f)
        header = npy.read_header(reader, 0, path.stat().st_size)
    assert (header.version, header.data_bytes, header.header_end) == ((2, 0), 2**30, header_len)
    assert reader.unbounded_reads == 0
    assert reader.bytes_read == header_len
