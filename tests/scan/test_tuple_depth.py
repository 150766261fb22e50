"""A tuple nested deeper than any pickler writes is malformed (issue 62, the class of the
memo bomb): CPython hashes a tuple by recursing in C once per level with no limit, so a dict
keyed (or a set filled) by a tuple ~10^5 levels deep kills the real load with SIGSEGV. The
scan called such a file safe and ``safe_load`` crashed on it. The files here are built the
two ways a stream can nest without a pickler's recursion (TUPLE1 after TUPLE1, and each
level a memo GET of the last), also after the memo budget is spent, when the walk no longer
holds the values; benign nesting is made by ``pickle.dumps``."""

from __future__ import annotations

import io
import pickle
import subprocess
import sys

import pytest

from hpcml.scan import picklewalk
from hpcml.scan.loader import UnsafeFileError, safe_load
from hpcml.scan.model import Verdict
from hpcml.scan.scanner import scan_file
from hpcml.scan.walkvalues import MAX_TUPLE_DEPTH

LEVELS = 300_000            # past the C stack of the real load (it dies at ~1-2 * 10^5 here)


def _inline(levels: int) -> bytes:
    """``{((((),),),...): 0}``: EMPTY_TUPLE, then TUPLE1 ``levels`` times, as a dict key."""
    return b"\x80\x04}(" + b")" + b"\x85" * levels + b"K\x00u."


def _through_memo(levels: int, filler: int = 0) -> bytes:
    """Each level a GET of the last one, memoized (LONG_BINGET/LONG_BINPUT, as pickle.dumps
    numbers them), optionally after ``filler`` memoized strings that spend the memo budget;
    then the last level as a set member (EMPTY_SET, ADDITEMS)."""
    out = [b"\x80\x02]q\x00("]
    key = 1
    for i in range(filler):
        s = f"filler{i:07d}".encode()
        out.append(b"X" + len(s).to_bytes(4, "little") + s + b"r" + key.to_bytes(4, "little"))
        key += 1
    out.append(b")r" + key.to_bytes(4, "little"))
    for _ in range(levels):
        out.append(b"j" + key.to_bytes(4, "little") + b"\x85r" + (key + 1).to_bytes(4, "little"))
        key += 1
    out.append(b"\x8f(j" + key.to_bytes(4, "little") + b"\x90e.")
    return b"".join(out)


def _real_load_dies(data: bytes, tmp_path) -> bool:
    """The real loader in a child: True when it is killed by a signal (the C stack)."""
    p = tmp_path / "real.pkl"
    p.write_bytes(data)
    child = subprocess.run([sys.executable, "-c", f"import pickle; pickle.load(open({str(p)!r}, 'rb'))"],
                           capture_output=True, timeout=120)
    return child.returncode < 0


def _refused(data: bytes, tmp_path) -> None:
    p = tmp_path / "deep.pkl"
    p.write_bytes(data)
    res = scan_file(p)
    assert res.verdict is Verdict.ERROR, (res.verdict, res.errors, [f.why for f in res.findings])
    assert f"nested more than {MAX_TUPLE_DEPTH} deep" in " ".join(res.errors)
    with pytest.raises(UnsafeFileError):
        safe_load(p)


def test_an_inline_tuple_too_deep_to_hash_is_malformed_and_never_loaded(tmp_path):
    data = _inline(LEVELS)
    assert _real_load_dies(data, tmp_path)          # the class is real: the loader's crash
    _refused(data, tmp_path)


def test_a_tuple_nested_through_the_memo_is_malformed(tmp_path):
    data = _through_memo(LEVELS)
    assert _real_load_dies(data, tmp_path)
    _refused(data, tmp_path)


def test_the_depth_survives_the_memo_budget(monkeypatch, tmp_path):
    """Once the memo budget is spent the walk drops values; a dropped tuple keeps its
    depth (what a GET of it reads back), so a chain built after the budget is still seen."""
    monkeypatch.setattr(picklewalk, "MEMO_BUDGET", 2_000)
    _refused(_through_memo(MAX_TUPLE_DEPTH + 5, filler=200), tmp_path)


def test_the_depth_survives_past_the_walks_presence_table(monkeypatch, tmp_path):
    """Keys past TRACKED_KEYS keep no presence byte: a dropped tuple there keeps its depth
    in the memo instead."""
    monkeypatch.setattr(picklewalk, "MEMO_BUDGET", 2_000)
    monkeypatch.setattr(picklewalk, "TRACKED_KEYS", 256)
    _refused(_through_memo(MAX_TUPLE_DEPTH + 5, filler=300), tmp_path)


def test_a_long_tuple_keeps_its_depth(monkeypatch, tmp_path):
    """A TUPLE longer than the walk keeps is opaque, unless it holds tuples: then it is kept
    as its depth."""
    monkeypatch.setattr(picklewalk, "MAX_TUPLE", 2)
    body = b")"
    for _ in range(MAX_TUPLE_DEPTH + 5):
        body = b"(NNN" + body + b"t"             # (None, None, None, previous): 4 items > MAX_TUPLE
    _refused(b"\x80\x04}(" + body + b"K\x00u.", tmp_path)


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_what_pickle_writes_nested_is_safe_and_loads(protocol, tmp_path):
    """Nesting as pickle.dumps writes it: 200 levels (within its recursion limit), tuples as
    keys, many memoized nested tuples past the memo budget."""
    deep: tuple = ()
    for _ in range(200):
        deep = (deep, 1)
    obj = {"deep": deep, "keys": {((i, i + 1), (i, "x")): i for i in range(20_000)},
           "shared": [deep] * 3, "set": {((1, 2), 3), ((4,), (5,))}}
    p = tmp_path / f"ok{protocol}.pkl"
    p.write_bytes(pickle.dumps(obj, protocol=protocol))
    res = scan_file(p)
    assert res.verdict is Verdict.SAFE, (res.errors, [f.why for f in res.findings])
    assert safe_load(p) == obj


def test_every_loader_refuses_it_as_the_scan_does():
    """The checkpoint's leaves, ckpt verify and Flight Recorder dumps unpickle through
    RestrictedUnpickler, which walks the bytes first with the same walker: refused, not run."""
    from hpcml.scan.loader import RestrictedUnpickler
    for data in (_inline(LEVELS), _through_memo(LEVELS)):
        with pytest.raises(pickle.UnpicklingError, match=f"nested more than {MAX_TUPLE_DEPTH} deep"):
            RestrictedUnpickler(io.BytesIO(data)).load()
