"""An allowlisted callable is safe for every argument, or its arguments are checked.

Pickles are written byte by byte (protocol 0/2 text, as an attacker writes them) or by
``pickle``/``torch.save``/``joblib`` as users do. What a load would really do is shown with
CPython where it is cheap to show (a bounded exponent); the unbounded ones are never run.
"""

from __future__ import annotations

import collections
import fractions
import io
import os
import pickle
import struct

import pytest

from hpcml.scan.loader import UnsafeFileError, safe_load
from hpcml.scan.model import Verdict
from hpcml.scan.scanner import scan_file
from tests import needs


def _scan(tmp_path, data: bytes, name: str = "x.pkl"):
    path = tmp_path / name
    path.write_bytes(data)
    return path, scan_file(path)


def _bad(result) -> dict[str, tuple[Verdict, str]]:
    return {f.name: (f.verdict, f.why) for f in result.findings if f.verdict is not Verdict.SAFE}


FRACTION_BOMB = b"cfractions\nFraction\n(S'1e30000000'\ntR."


def test_fraction_with_an_exponent_it_would_expand_is_dangerous(tmp_path):
    small = FRACTION_BOMB.replace(b"1e30000000", b"1e3")
    assert pickle.loads(small) == 1000          # the same construct, bounded: CPython expands it
    path, result = _scan(tmp_path, FRACTION_BOMB)
    assert result.verdict is Verdict.DANGEROUS
    verdict, why = _bad(result)["fractions.Fraction"]
    assert verdict is Verdict.DANGEROUS and "10**30000000" in why
    with pytest.raises(UnsafeFileError):
        safe_load(path)


@pytest.mark.parametrize("via", [
    # copyreg._reconstructor(cls, base, state) calls base.__new__(cls, state)
    b"ccopyreg\n_reconstructor\n(cfractions\nFraction\ncfractions\nFraction\nS'1e30000000'\ntR.",
    # numpy's RandomState constructor calls its second argument with its first
    b"\x80\x02cnumpy.random._pickle\n__randomstate_ctor\nX\x0a\x00\x00\x001e30000000cfractions\nFraction\n\x86R.",
    # copyreg.__newobj__(cls, *args) calls cls.__new__(cls, *args)
    b"ccopyreg\n__newobj__\n(cfractions\nFraction\nS'1e30000000'\ntR.",
    # NEWOBJ: cls.__new__(cls, *args)
    b"\x80\x02cfractions\nFraction\nX\x0a\x00\x00\x001e30000000\x85\x81.",
])
def test_a_checked_callable_called_by_another_allowlisted_one_is_checked_too(via, tmp_path):
    _, result = _scan(tmp_path, via)
    assert result.verdict is Verdict.DANGEROUS, result.findings
    assert any("10**30000000" in why for _, why in _bad(result).values())


def test_a_checked_callable_handed_to_code_that_may_call_it_is_not_safe(tmp_path):
    # torch's _rebuild_parameter stores its third argument; the walk cannot know what a
    # callee does with a checked callable it did not list as calling it
    data = (b"ctorch._utils\n_rebuild_parameter\n(I0\nI00\ncfractions\nFraction\ntR.")
    _, result = _scan(tmp_path, data)
    assert result.verdict is not Verdict.SAFE
    assert "fractions.Fraction, whose arguments hpcml checks" in " ".join(w for _, w in _bad(result).values())


@pytest.mark.parametrize("data, what", [
    (b"c__builtin__\nlist\n(c__builtin__\nrange\n(I0\nI1000000000000\ntRtR.", "list()"),
    (b"c__builtin__\nset\n(c__builtin__\nrange\n(I0\nI1000000000000\ntRtR.", "set()"),
    (b"ccollections\ndeque\n(c__builtin__\nrange\n(I0\nI1000000000000\ntRtR.", "deque()"),
    (b"c__builtin__\nint\n(cdecimal\nDecimal\n(S'1e999999999'\ntRtR.", "int()"),
    (b"\x80\x02c__builtin__\nbytes\nJ\xff\xff\xff\x7f\x85R.", "bytes/bytearray"),
    (b"\x80\x02c__builtin__\nbytearray\nJ\xff\xff\xff\x7f\x85R.", "bytes/bytearray"),
])
def test_allowlisted_constructors_given_an_amplifier_are_not_safe(data, what, tmp_path):
    _, result = _scan(tmp_path, data)
    assert result.verdict is Verdict.UNKNOWN, result.findings
    assert any(what in why for _, why in _bad(result).values()), _bad(result)


@pytest.mark.parametrize("obj", [
    fractions.Fraction(3, 7), fractions.Fraction(-10**30, 3), [b"abc", bytearray(b"xy"), b""],
    collections.defaultdict(list, a=[1]), collections.deque([1, 2], maxlen=5),
    collections.Counter("hello"), collections.OrderedDict(a=1), {1, 2}, frozenset({3}),
], ids=lambda o: type(o).__name__)
@pytest.mark.parametrize("protocol", [0, 2, 3, 5])
def test_what_pickle_writes_for_these_types_passes_the_checks(obj, protocol, tmp_path):
    path, result = _scan(tmp_path, pickle.dumps(obj, protocol=protocol))
    assert result.verdict is Verdict.SAFE, result.findings
    assert safe_load(path) == obj


def _torch_bytes(obj, legacy: bool) -> bytes:
    import torch
    buf = io.BytesIO()
    torch.save(obj, buf, _use_new_zipfile_serialization=not legacy)
    return buf.getvalue()


def _load_from_bytes(inner: bytes) -> bytes:
    return b"\x80\x02ctorch.storage\n_load_from_bytes\nB" + struct.pack("<I", len(inner)) + inner + b"\x85R."


class _Evil:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.torch
@pytest.mark.parametrize("legacy", [True, False], ids=["legacy", "zip"])
def test_bytes_loaded_as_a_torch_file_are_scanned_as_one(legacy, tmp_path):
    needs.module("torch")
    import torch
    marker = tmp_path / "ran"
    bad, result = _scan(tmp_path, _load_from_bytes(_torch_bytes(_Evil(str(marker)), legacy)), "bad.pkl")
    assert result.verdict is Verdict.DANGEROUS
    assert any(f.name == "posix.system" and "torch.load@" in f.location.member for f in result.findings)
    with pytest.raises(UnsafeFileError):
        safe_load(bad)
    good, result = _scan(tmp_path, _load_from_bytes(_torch_bytes(torch.arange(4), legacy)), "good.pkl")
    assert result.verdict is Verdict.SAFE, result.findings
    assert result.format == "pickle"                     # the outer file stays a pickle
    assert torch.equal(safe_load(good), torch.arange(4))
    assert not marker.exists()


@pytest.mark.torch
def test_the_inner_torch_load_is_restricted_at_load_time_too(tmp_path):
    """The second lock: a file swapped after the scan still cannot run code through the
    inner torch.load (torch's own _load_from_bytes uses the unrestricted pickle module)."""
    needs.module("torch")
    from hpcml.scan.loader import RestrictedUnpickler
    marker = tmp_path / "ran"
    data = _load_from_bytes(_torch_bytes(_Evil(str(marker)), legacy=True))
    with pytest.raises(pickle.UnpicklingError, match="posix.system"):
        RestrictedUnpickler(io.BytesIO(data)).load()
    assert not marker.exists()


def test_load_from_bytes_of_anything_but_bytes_in_the_file_is_dangerous(tmp_path):
    for data in (b"\x80\x02ctorch.storage\n_load_from_bytes\n)R.",
                 b"ctorch.storage\n_load_from_bytes\n(V not bytes\ntR."):
        _, result = _scan(tmp_path, data)
        assert result.verdict is Verdict.DANGEROUS, result.findings


@pytest.mark.parametrize("data", [
    # pandas opens a time zone 'dateutil/PATH' as a tz file
    b"\x80\x02cpandas\nDatetimeTZDtype\nX\x02\x00\x00\x00nsX\x14\x00\x00\x00dateutil//etc/passwd\x86R.",
    b"\x80\x02cpandas._libs.tslibs.timestamps\n_unpickle_timestamp\n(J\x00\x00\x00\x00NX\x14\x00\x00\x00"
    b"dateutil//etc/passwdK\ntR.",
])
def test_a_pandas_time_zone_that_names_a_path_is_dangerous(data, tmp_path):
    _, result = _scan(tmp_path, data)
    assert result.verdict is Verdict.DANGEROUS, result.findings
    assert any("dateutil" in why for _, why in _bad(result).values())


def test_pandas_rebuilds_only_its_own_index_classes(tmp_path):
    data = b"\x80\x02cpandas.core.indexes.base\n_new_Index\ncfractions\nFraction\n}\x86R."
    _, result = _scan(tmp_path, data)
    assert result.verdict is not Verdict.SAFE, result.findings


def test_an_arrow_array_with_offsets_past_its_data_is_refused_at_load(tmp_path):
    """pyarrow's _restore_array trusts its offsets; safe_load validates every array in full."""
    needs.module("pyarrow")
    import pyarrow as pa
    good = pa.array(["ab", "c"], type=pa.large_string())
    assert good.__reduce__()[0].__name__ == "_restore_array"
    data = pickle.dumps(good, protocol=5)
    offsets = struct.pack("<3q", 0, 2, 3)
    assert data.count(offsets) == 1
    path = tmp_path / "arrow.pkl"                               # the last string ends 2**40 bytes in
    path.write_bytes(data.replace(offsets, struct.pack("<3q", 0, 2, 1 << 40)))
    assert scan_file(path).verdict is Verdict.SAFE       # the scan sees literal parts only ...
    with pytest.raises(pickle.UnpicklingError, match="invalid pyarrow array"):
        safe_load(path)                                  # ... the load checks the offsets
    path.write_bytes(pickle.dumps(good, protocol=5))
    assert safe_load(path).equals(good)


# -- from an adversarial pass: each was called safe before -----------------------------------


@pytest.mark.torch
@pytest.mark.parametrize("via", ["rebuild_from_type", "generator_ctor"])
def test_load_from_bytes_reached_through_a_caller_is_dangerous(via, tmp_path):
    needs.module("torch")
    inner = _torch_bytes({"w": _Evil(str(tmp_path / "ran"))}, legacy=False)      # a zip: not pickle-like
    blob = b"B" + struct.pack("<I", len(inner)) + inner
    lfb = b"ctorch.storage\n_load_from_bytes\n"
    data = {"rebuild_from_type": b"\x80\x02ctorch._tensor\n_rebuild_from_type\n(" + lfb
            + b"ctorch._tensor\nTensor\n" + blob + b"\x85}tR.",
            "generator_ctor": b"\x80\x02cnumpy.random._pickle\n__generator_ctor\n(" + blob + lfb + b"tR."}[via]
    _, result = _scan(tmp_path, data)
    assert result.verdict is Verdict.DANGEROUS, result.findings


@pytest.mark.parametrize("data, what", [
    # Fraction.__new__(Fraction, numerator='1e300000000') through NEWOBJ_EX's keyword arguments
    (b"\x80\x04cfractions\nFraction\n)}\x8c\tnumerator\x8c\x0b1e300000000s\x92.", "keyword arguments"),
    # integers of 50 kB: SeedSequence/Decimal/Fraction convert them in quadratic time
    (b"\x80\x02cdecimal\nDecimal\n\x8b" + struct.pack("<i", 50_000) + b"\x07" * 50_000 + b"\x85R.", "integer of"),
    # punycode is quadratic: pickle only ever writes latin1
    (b"\x80\x02c_codecs\nencode\nX\x03\x00\x00\x00abcX\x08\x00\x00\x00punycode\x86R.", "latin1"),
    (b"\x80\x02ctorch\nSize\nc__builtin__\nrange\nK\x00J\xff\xff\xff\x7f\x86R\x85R.", "torch.Size"),
    (b"\x80\x02ctorch\nFloatStorage\nJ\xff\xff\xff\x7f\x85R.", "persistent ids"),
])
def test_amplifiers_through_other_doors_are_not_safe(data, what, tmp_path):
    _, result = _scan(tmp_path, data)
    assert result.verdict is not Verdict.SAFE, result.findings
    assert any(what in why for _, why in _bad(result).values()), _bad(result)


def test_protocol0_int_is_read_in_base_0_as_cpython_reads_it(tmp_path):
    data = b"I0x10\n0cos\nsystem\n(S'true'\ntR."
    assert pickle.loads(data.replace(b"cos\nsystem\n(S'true'\ntR", b"N")) is None   # CPython reads 0x10
    path, result = _scan(tmp_path, data, "notes.txt")
    assert result.scanned and result.verdict is Verdict.DANGEROUS
