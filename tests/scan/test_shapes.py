"""The walker's fast path over runs of same-shaped items (``hpcml.scan.shapes``) decides
exactly what the opcode-by-opcode walk decides: the same error or none, the same imports
and calls, the same end, on pickles made by ``pickle.dumps`` and on mutations of them. The
fast path must also be taken (a test that never reaches it proves nothing)."""

from __future__ import annotations

import io
import pickle
import random
import struct

import pytest

from hpcml.scan import picklewalk
from hpcml.scan.picklewalk import PickleWalker
from hpcml.scan.scanner import scan_file


def _value(rng: random.Random, depth: int = 0):
    kind = rng.choice("iiiffnbsssSuUltdT" if depth < 2 else "iifnbssS")
    if kind == "i":
        return rng.choice([rng.randint(0, 255), rng.randint(256, 65535), rng.randint(-2**31, 2**31 - 1),
                           rng.randint(2**31, 2**63), -rng.randint(2**31, 2**63)])
    if kind == "f":
        return rng.random() * 1e6
    if kind == "n":
        return None
    if kind == "b":
        return rng.random() < 0.5
    if kind == "s":
        return "".join(rng.choice("abcdefxyz_") for _ in range(rng.randint(0, 12)))
    if kind == "S":
        return "x" * rng.choice([255, 256, 300])          # SHORT_BINUNICODE's limit, then BINUNICODE
    if kind == "u":
        return "é" * rng.randint(1, 5)                    # non-ASCII: not in a pattern, taken by the model
    if kind == "U":
        return rng.choice(["shared", "label-a", "label-b"])   # the same object many times: memo reads
    if kind == "l":
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if kind == "t":
        return tuple(_value(rng, depth + 1) for _ in range(rng.randint(1, 5)))
    if kind == "T":
        return (rng.randint(0, 9), (rng.randint(0, 9),))      # a tuple of a tuple (depth 2)
    return {f"k{j}": _value(rng, depth + 1) for j in range(rng.randint(0, 4))}


def _like(rng: random.Random, v):
    """A value of ``v``'s structure with fresh numbers and strings (the next row)."""
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int):
        return rng.randint(0, 1 << rng.choice([7, 15, 30, 40]))
    if isinstance(v, float):
        return rng.random()
    if isinstance(v, str):
        return v if rng.random() < 0.3 else "".join(rng.choice("abc_xyz") for _ in range(len(v) % 20))
    if isinstance(v, list):
        return [_like(rng, e) for e in v]
    if isinstance(v, tuple):
        return tuple(_like(rng, e) for e in v)
    return {k: _like(rng, e) for k, e in v.items()}


def _records(rng: random.Random, n: int):
    """Rows of one or two templates (the shape an object-heavy pickle repeats), values drawn
    again per row, sometimes an odd row between; as a list, or as a dict's values."""
    templates = [_value(rng) for _ in range(rng.randint(1, 2))]
    out = [_value(rng) if rng.random() < 0.02 else _like(rng, templates[i % len(templates)]) for i in range(n)]
    if rng.random() < 0.3:
        return {f"key{i}": v for i, v in enumerate(out)}          # a dict batch: key-value pairs
    return out


def _walk(data: bytes, fast: bool) -> tuple[picklewalk.WalkResult, int]:
    w = PickleWalker(io.BytesIO(data), 0, len(data), fast=fast)
    res = w.walk()
    return res, w.ff_items


def _same(data: bytes) -> int:
    fast, items = _walk(data, True)
    exact, _ = _walk(data, False)
    assert (fast.error is None) == (exact.error is None), (data[:200], fast.error, exact.error)
    assert [(e.kind, e.module, e.name) for e in fast.events] == [(e.kind, e.module, e.name) for e in exact.events]
    assert (fast.end, fast.stopped, fast.protocol) == (exact.end, exact.stopped, exact.protocol)
    assert fast.nested == exact.nested
    return items


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_same_decisions_as_the_walk_on_pickles_of_repeated_records(protocol: int) -> None:
    rng = random.Random(protocol)
    used = 0
    for _ in range(40):
        data = pickle.dumps(_records(rng, rng.choice([5, 50, 400, 3000])), protocol=protocol)
        pickle.loads(data)
        fast, items = _walk(data, True)
        assert fast.error is None and not fast.events, fast.error
        used += items > 0
        _same(data)
    assert used >= 20, f"the fast path ran on only {used} of 40 pickles"


def test_same_decisions_on_mutated_pickles() -> None:
    """Bytes flipped, opcodes put in, memo keys pushed out, inside and around the runs."""
    rng = random.Random(62)
    ops = b"\x93cR\x81bhjqr\x94(te0u\x95\x8c\x8aXB"
    seen_fast = 0
    for _case in range(600):
        data = bytearray(pickle.dumps(_records(rng, rng.choice([20, 200, 1500])), protocol=rng.choice([2, 4, 5])))
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(2, len(data) - 1)
            how = rng.random()
            if how < 0.4:
                data[at] = rng.choice(ops)
            elif how < 0.7:
                data[at] ^= 1 << rng.randrange(8)
            elif how < 0.85:
                data[at:at] = b"\x8c\x02os\x8c\x06system\x93"         # an import in the middle of a run
            else:
                data[at:at] = b"r" + struct.pack("<I", rng.choice([2**31, 2**20, 7]))
        seen_fast += _same(bytes(data)) > 0
    assert seen_fast > 100


def test_memo_keys_out_of_sequence_in_a_run_are_refused_as_by_the_walk() -> None:
    """A run whose LONG_BINPUT keys jump far ahead: the C unpickler would size its memo by
    the largest key; the walk calls it malformed, and so must the fast path."""
    rows = [(i, float(i)) for i in range(2000)]
    data = bytearray(pickle.dumps(rows, protocol=2))
    at = data.index(b"r" + struct.pack("<I", 1500))
    data[at + 1:at + 5] = struct.pack("<I", 1 << 30)
    fast, items = _walk(bytes(data), True)
    exact, _ = _walk(bytes(data), False)
    assert exact.error and "memo key" in exact.error
    assert fast.error == exact.error


def test_a_global_after_a_run_is_named() -> None:
    """Strings a run skipped cannot hide a global: the walk after the run names it."""
    body = pickle.dumps([{"a": i, "b": str(i)} for i in range(500)], protocol=3)
    evil = body[:-2] + b"\x8c\x02os\x8c\x06system\x93\x8c\x02id\x85R" + b"e."
    assert _walk(body, True)[1] >= 490
    fast, items = _walk(evil, True)
    assert [(e.module, e.name) for e in fast.events if e.kind == "global"] == [("os", "system")]


@pytest.mark.parametrize("rows", [
    [{"a": i, "b": str(i), "c": [i, i + 1]} for i in range(40_000)],      # protocol 4 frames cut items
    [(i, float(i), "x" * 8) for i in range(40_000)],
])
def test_object_heavy_files_are_matched_and_safe(tmp_path, rows) -> None:
    for protocol in (2, 4):
        path = tmp_path / f"rows{protocol}.pkl"
        path.write_bytes(pickle.dumps(rows, protocol=protocol))
        _, items = _walk(path.read_bytes(), True)
        assert items >= len(rows) * 0.99
        assert scan_file(path).verdict.value == "safe"


# -- regressions from an adversarial pass (files made by hand, as an attacker writes them) --

def _fast_only(data: bytes) -> str | None:
    """The fast walk's own verdict, without the walk again that an error triggers."""
    w = PickleWalker(io.BytesIO(data), 0, len(data), fast=True)
    try:
        w._run()
    except picklewalk.PickleError as exc:
        return str(exc)
    return None


def test_a_memo_key_overwritten_between_batches_is_read_again_not_from_the_learned_shape() -> None:
    """Each batch's items wrap memo key 0 in 90 TUPLE1s; a BINPUT 0 after the batch puts the
    batch's tuple there: the next batch's items are 91 levels deeper. A shape learned on the
    first batch must not be reused with its old depth (the real load hashes a tuple ~900
    deep as a dict key: SIGSEGV)."""
    item = b"h\x00" + b"\x85" * 90
    data = b"\x80\x02K\x01q\x00" + (b"(" + item * 5 + b"tq\x000") * 10 + b"}h\x00Ns."
    assert _fast_only(data) is not None and "tuple nested more than" in _fast_only(data)
    fast, items = _walk(data, True)
    assert fast.error and "tuple nested more than" in fast.error


def test_a_shape_from_an_earlier_file_brings_only_its_pattern() -> None:
    """The same item shape in two pickles, whose memo key 0 holds an int in one and a tuple
    100 deep in the other: the second is judged on its own values (cached patterns only)."""
    item = b"h\x00\x85\x94"
    benign = b"\x80\x02K\x01\x94(" + item * 6 + b"t0N."
    deep = (b"\x80\x02K\x01" + b"\x85" * 100 + b"\x94(" + item * 6 + b"t0" + b"}j" + struct.pack("<I", 6)
            + b"\x85" * 200 + b"Ns.")
    assert _walk(benign, True)[0].error is None
    assert _fast_only(deep) is not None
    assert _walk(deep, True)[0].error == _walk(deep, False)[0].error is not None


@pytest.mark.parametrize("tail", [b"", b"\x85\x94r\x00\x00\x00\x00"])
def test_binput_keys_of_items_that_memoize_too_are_checked(tail: bytes) -> None:
    """Items with a MEMOIZE and a LONG_BINPUT each: one key far out (the unpickler would
    allocate 64 GiB), or (``tail``) every later item writing key 0 again."""
    keys = [1, 3, 5, 7, 0xFFFFFFF0, 11]
    data = b"\x80\x04](" + b"".join(b"K\x01\x94r" + struct.pack("<I", k) for k in keys) + b"e."
    assert _fast_only(data) is not None and "memo key" in _fast_only(data)
    if tail:
        items = b"h\x00\x85\x94r" + struct.pack("<I", 2) + b"h\x00\x85\x94r" + struct.pack("<I", 4)
        data = b"\x80\x04K\x01\x94(" + items + (b"h\x00" + tail) * 3000 + b"t}h\x00Ns."
        assert _fast_only(data) is not None
    assert _walk(data, True)[0].error == _walk(data, False)[0].error is not None


def test_a_batch_the_walk_could_not_hold_is_left_to_the_walk() -> None:
    """One batch of 40,000 tuple chains 94 deep (3.8 MB): the walk holds every tuple of a
    batch and stops at its memory bound; the fast path holds one placeholder per item, so it
    hands such a batch back to the walk (whose bound then decides) instead of calling it clean."""
    data = b"\x80\x04]\x94(" + (b"K\x05" + b"\x85" * 94) * 40_000 + b"e."
    got = _fast_only(data)
    assert got is not None and "would hold about" in got
    small = b"\x80\x04]\x94(" + (b"K\x05" + b"\x85" * 94) * 500 + b"e."
    assert _fast_only(small) is None and _walk(small, True)[1] >= 490
