"""A pickled numpy dtype is judged by the state numpy will believe (issue 62): the scan and
the loader must not disagree about what the bytes are. Benign files are made the way numpy,
pickle and joblib make them; hostile ones change only the dtype's state (its flags) or the
memo numbering, as the issue's files did. Nothing here is loaded unless the scan says safe."""

from __future__ import annotations

import io
import os
import pickle

import joblib
import numpy as np
import pytest

from hpcml.scan.loader import UnsafeFileError, safe_load
from hpcml.scan.model import Verdict
from hpcml.scan.scanner import scan_file

BENIGN_DTYPES = ["f8", ">f8", "i1", "b1", "c16", "U10", "S5", "O", "M8[ns]", "m8[s]", "V8",
                 [("a", "<f4"), ("b", "O")], [("a", "f4")], ("f4", (2, 3)), ("O", (2,)),
                 [("a", [("b", "O")])],
                 # a unicode field gives the structured type NEEDS_INIT (flags 24): called
                 # dangerous until the flags were taken from the fields, as numpy takes them
                 [("s", "U5"), ("i", "i4")], [("n", [("u", "U2"), ("x", "f4")])], [("v", "U1", (2,))],
                 np.dtype([("a", "u1"), ("s", "U3")], align=True)]


def _verdict(tmp_path, data: bytes, name="x.pkl"):
    p = tmp_path / name
    p.write_bytes(data)
    return scan_file(p), p


def _array(dt):
    dt = np.dtype(dt)
    a = np.zeros(3, dtype=dt)
    return a


@pytest.mark.parametrize("dt", BENIGN_DTYPES, ids=str)
@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_what_numpy_writes_is_safe_and_loads(dt, protocol, tmp_path):
    a = _array(dt)
    res, p = _verdict(tmp_path, pickle.dumps((a, a.dtype, a[:1].copy()), protocol=protocol))
    assert res.verdict is Verdict.SAFE, [f.why for f in res.findings]
    back = safe_load(p)
    assert back[1] == a.dtype and back[0].shape == a.shape


@pytest.mark.parametrize("dt", BENIGN_DTYPES, ids=str)
def test_what_joblib_writes_is_safe_and_loads(dt, tmp_path):
    a = _array(dt)
    buf = io.BytesIO()
    joblib.dump({"a": a}, buf)
    res, p = _verdict(tmp_path, buf.getvalue(), "x.joblib")
    assert res.verdict is Verdict.SAFE, [f.why for f in res.findings]
    back = safe_load(p)["a"]
    assert back.dtype.str[1:] == a.dtype.str[1:] and back.shape == a.shape     # joblib loads in native byte order


class _Dtype:
    """``numpy.dtype(descr, False, True)`` with a state of the test's choosing, pickled as
    numpy pickles a dtype (REDUCE, then BUILD with the state)."""

    def __init__(self, descr, state):
        self.descr, self.state = descr, state

    def __reduce__(self):
        return (np.dtype, (self.descr, False, True), self.state)


class _Scalar:
    def __init__(self, dtype, raw: bytes):
        self.dtype, self.raw = dtype, raw

    def __reduce__(self):
        return (np._core.multiarray.scalar, (self.dtype, self.raw))


HOSTILE = {
    "plain type said to hold objects": ("f8", (3, "<", None, None, None, -1, -1, 63)),
    "object type said to hold none": ("O8", (3, "|", None, None, None, -1, -1, 0)),
    "a state version numpy never wrote": ("f8", (5, "<", None, None, None, -1, -1, 0)),
    "a size numpy never writes": ("f8", (3, "<", None, None, None, 4096, 1, 0)),
    "text said to be wider": ("U10", (3, "<", None, None, None, 4000, 4, 8)),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_state_numpy_never_writes_is_dangerous_and_never_loaded(case, tmp_path):
    descr, state = HOSTILE[case]
    data = pickle.dumps(_Scalar(_Dtype(descr, state), b"\x41" * 8), protocol=2)
    res, p = _verdict(tmp_path, data)
    assert res.verdict is Verdict.DANGEROUS, (case, res.verdict, [f.why for f in res.findings])
    assert any("numpy.dtype" in f.why for f in res.findings)
    with pytest.raises(UnsafeFileError):
        safe_load(p)


def test_a_structured_or_subarray_state_with_other_flags_is_dangerous(tmp_path):
    base = _Dtype("f4", (3, "<", None, None, None, -1, -1, 0))
    struct = _Dtype("V4", (3, "|", None, ("a",), {"a": (base, 0)}, 4, 1, 27))        # "holds objects"
    sub = _Dtype("V8", (3, "|", (base, (2,)), None, None, 8, 4, 63))
    for obj in (struct, sub):
        res, _ = _verdict(tmp_path, pickle.dumps(_Scalar(obj, b"\0" * 8), protocol=4))
        assert res.verdict is Verdict.DANGEROUS, [f.why for f in res.findings]


def test_a_structured_or_subarray_item_smaller_than_its_fields_is_dangerous(tmp_path):
    """Found by the differential harness (tests/scan/differential.py): the structured dtype
    [('a', '<f4'), ('b', 'O')] with its item size cut from 12 to 4 bytes was safe and its
    load died of SIGSEGV. Fields past the item, object fields overlapping others, and a
    subarray whose size is not its items' are dangerous."""
    f4 = _Dtype("f4", (3, "<", None, None, None, -1, -1, 0))
    obj = _Dtype("O8", (3, "|", None, None, None, -1, -1, 63))
    cases = {
        "cut": _Dtype("V12", (3, "|", None, ("a", "b"), {"a": (f4, 0), "b": (obj, 4)}, 4, 1, 27)),
        "overlap": _Dtype("V12", (3, "|", None, ("a", "b"), {"a": (f4, 4), "b": (obj, 4)}, 12, 1, 27)),
        "subarray": _Dtype("V24", (3, "|", (f4, (2, 3)), None, None, 96, 4, 0)),
    }
    good = _Dtype("V12", (3, "|", None, ("a", "b"), {"a": (f4, 0), "b": (obj, 4)}, 12, 1, 27))
    res, _ = _verdict(tmp_path, pickle.dumps(_Scalar(good, b"\0" * 12), protocol=4))
    assert res.verdict is Verdict.SAFE, [f.why for f in res.findings]
    for case, dt in cases.items():
        res, p = _verdict(tmp_path, pickle.dumps(_Scalar(dt, b"\0" * 12), protocol=4))
        assert res.verdict is Verdict.DANGEROUS, (case, [f.why for f in res.findings])
        with pytest.raises(UnsafeFileError):
            safe_load(p)


def test_a_joblib_object_array_whose_dtype_says_no_objects_is_dangerous(tmp_path):
    """joblib computes "holds objects" from the dtype numpy built: with the flags cleared,
    an older scan skipped the nested pickle as raw bytes and said safe."""
    class Payload:
        def __reduce__(self):
            return (os.system, ("true",))                 # pickled, never run
    buf = io.BytesIO()
    joblib.dump(np.array([Payload(), 1], dtype=object), buf)
    data = buf.getvalue()
    flags = b"J\xff\xff\xff\xffJ\xff\xff\xff\xffK?"        # elsize -1, alignment -1, flags 63
    assert data.find(flags) < data.find(b"system")    # the wrapper's dtype comes before the nested pickle
    res, p = _verdict(tmp_path, data.replace(flags, b"J\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00", 1), "x.joblib")
    assert res.verdict is Verdict.DANGEROUS
    assert any("numpy.dtype" in f.why for f in res.findings), [f.why for f in res.findings]
    with pytest.raises(UnsafeFileError):
        safe_load(p)


@pytest.mark.parametrize("key", [1 << 20, 0x7FFFFFFF, 0xFFFFFFFF])
def test_a_memo_key_beyond_the_file_is_malformed_and_never_unpickled(key, tmp_path):
    """CPython's unpickler zeroes 16 bytes per key up to the largest one: 14 bytes asked it
    for 64 GiB. hpcml's scan calls it malformed; safe_load never hands it to the unpickler."""
    data = b"\x80\x04N" + b"r" + key.to_bytes(4, "little") + b"."
    res, p = _verdict(tmp_path, data)
    assert res.verdict is Verdict.ERROR and "memo key" in " ".join(res.errors), (res.verdict, res.errors)
    with pytest.raises(UnsafeFileError):
        safe_load(p)
    text = b"(dp0\nS'a'\np" + str(key).encode() + b"\n."            # protocol 0: PUT with text
    assert _verdict(tmp_path, text)[0].verdict is Verdict.ERROR


def test_a_memo_numbered_as_picklers_number_it_is_safe(tmp_path):
    obj = [{"k": i, "v": [str(i)] * 3} for i in range(3000)]      # thousands of memo keys
    for protocol in range(6):
        res, _ = _verdict(tmp_path, pickle.dumps(obj, protocol=protocol))
        assert res.verdict is Verdict.SAFE


@pytest.mark.parametrize("n", [2, 64, 65, 1000])
def test_an_object_array_is_safe_as_numpy_writes_it_and_dangerous_with_a_longer_shape(n, tmp_path):
    """Found by the differential harness: numpy copies an object array's items from its
    pickled list as many times as the shape says; a shape edited from (2,) to (6,) made the
    load die of SIGSEGV. The list is counted past the 64 items the walk keeps."""
    a = np.array([f"s{i}" for i in range(n)], dtype=object)
    data = pickle.dumps(a, protocol=2)
    res, p = _verdict(tmp_path, data)
    assert res.verdict is Verdict.SAFE, [f.why for f in res.findings]
    assert list(safe_load(p)) == list(a)
    shape = b"K" + bytes([n]) + b"\x85" if n < 256 else b"M" + n.to_bytes(2, "little") + b"\x85"
    assert data.count(shape) == 1
    bigger = b"K\xff\x85" if n < 256 else b"M" + (n + 7).to_bytes(2, "little") + b"\x85"
    res, p = _verdict(tmp_path, data.replace(shape, bigger))
    assert res.verdict is Verdict.DANGEROUS and any("object array" in f.why for f in res.findings), res.findings
    with pytest.raises(UnsafeFileError):
        safe_load(p)
