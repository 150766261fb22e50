"""The pickle walker against CPython's own unpickler, and its memory bounds."""

from __future__ import annotations

import io
import pickle
import random
import struct
import subprocess
import sys
import textwrap

import pytest

from hpcml.scan import picklewalk
from hpcml.scan.model import Verdict
from hpcml.scan.picklewalk import PickleWalker
from hpcml.scan.scanner import scan_file
from tests.scan.programs import random_program as _random_program


class _Recorder(pickle.Unpickler):
    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.seen: list[tuple[str, str]] = []

    def find_class(self, module, name):
        self.seen.append((module, name))
        return object()


def test_walker_resolves_globals_exactly_like_the_c_unpickler():
    """Random programs over the stack, marks and memo (MEMOIZE mixed with BINPUT, the
    desync trick): the globals the walker reports, and whether the stream fails, must
    match what the real unpickler asks ``find_class`` for, program by program."""
    rng = random.Random(20261123)
    with_globals = 0
    for _ in range(12000):
        data = _random_program(rng)
        real = _Recorder(data)
        try:
            real.load()
            real_failed = False
        except Exception:  # noqa: BLE001 - any failure of the real unpickler counts
            real_failed = True
        res = PickleWalker(io.BytesIO(data), 0, len(data)).walk()
        ours = [(e.module, e.name) for e in res.events if e.kind == "global"]
        assert ours == real.seen, data
        assert (res.error is not None) == real_failed, (data, res.error)
        with_globals += bool(real.seen)
    assert with_globals > 400     # the generator really exercises STACK_GLOBAL


def test_small_chunks_give_the_same_result(monkeypatch, tmp_path):
    """Every refill path: the same scan with 16-byte chunks as with 1 MiB chunks."""
    data = pickle.dumps([{"k": i, "s": "x" * (i % 300), "b": b"y" * i} for i in range(300)], protocol=4)
    data += pickle.dumps(("os", "text " * 100), protocol=0)
    path = tmp_path / "p.pkl"
    path.write_bytes(data)
    big = scan_file(path)
    monkeypatch.setattr(picklewalk, "CHUNK", 16)
    small = scan_file(path)
    assert big.verdict is small.verdict is Verdict.SAFE
    assert big.notes == small.notes and "2 pickles" in big.notes[0]


def test_evicted_memo_strings_cannot_hide_a_global(monkeypatch, tmp_path):
    """Past the memo budget a string is dropped; a global named by it must block."""
    monkeypatch.setattr(picklewalk, "MEMO_BUDGET", 200)
    filler = b"".join(b"\x8c\x05" + f"f{i:04d}".encode() + b"\x94" for i in range(10))
    body = filler + b"\x8c\x02os\x94\x8c\x06system\x94" + b"h\x0ah\x0b\x93N."
    # keys 0-9 are filler, 10 = "os", 11 = "system"; budget runs out before them
    data = b"\x80\x04" + body
    res = PickleWalker(io.BytesIO(data), 0, len(data)).walk()
    assert [e.kind for e in res.events] == ["unresolved"]
    path = tmp_path / "evicted.pkl"
    path.write_bytes(data)
    assert scan_file(path).verdict is Verdict.UNKNOWN


def test_pickle_inside_bytes_is_scanned(tmp_path):
    inner = b"\x80\x04\x8c\x02os\x8c\x06system\x93\x8c\x04true\x85R."
    outer = pickle.dumps({"blob": inner, "n": 1}, protocol=4)
    path = tmp_path / "outer.pkl"
    path.write_bytes(outer)
    res = scan_file(path)
    assert res.verdict is Verdict.DANGEROUS
    assert res.findings[0].name == "os.system" and "nested@" in res.findings[0].location.member


def test_memory_stays_bounded_on_a_huge_argument(tmp_path):
    """A 4 GiB bytes argument (sparse file) is skipped with seek, not read."""
    path = tmp_path / "huge.pkl"
    size = 4 << 30
    with open(path, "wb") as fh:
        fh.write(b"\x80\x05\x8e" + struct.pack("<Q", size))
        fh.seek(11 + size)
        fh.write(b"\x94.")
    # VmHWM, not ru_maxrss: Linux carries the forking parent's peak into ru_maxrss across exec.
    code = textwrap.dedent(f"""
        from hpcml.scan.scanner import scan_file
        r = scan_file({str(path)!r})
        hwm = [l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM")][0]
        print(r.verdict.value, hwm)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    verdict, rss_kib = out.stdout.split()
    assert verdict == "safe"
    assert int(rss_kib) < 200 * 1024, out.stdout


@pytest.mark.parametrize("data, reason", [
    (b"\x80\x04K\x01", "before STOP"),
    (b"\x80\x06N.", "unsupported pickle protocol"),
    (b"\x80\x04h\x03.", "memo key 3"),
    (b"\x80\x04K\x01K\x02\x93.", "requires str"),
    (b"\x80\x04\xff", "invalid opcode"),
    (b"\x80\x04(u.", "stack underflow"),
])
def test_malformed_streams_name_the_reason(data, reason):
    res = PickleWalker(io.BytesIO(data), 0, len(data)).walk()
    assert res.error and reason in res.error


def test_untracked_memo_keys_never_hide_a_global(monkeypatch):
    """Past TRACKED_KEYS the walker keeps no per-key record (memory stays flat); it may
    then be stricter than the real unpickler, never laxer: every global the real load
    asks for is reported, or the walk reports a global it cannot resolve."""
    monkeypatch.setattr(picklewalk, "TRACKED_KEYS", 3)
    monkeypatch.setattr(picklewalk, "SPARSE_KEYS", 2)
    rng = random.Random(7)
    for _ in range(4000):
        data = _random_program(rng)
        real = _Recorder(data)
        try:
            real.load()
        except Exception:  # noqa: BLE001
            pass
        res = PickleWalker(io.BytesIO(data), 0, len(data)).walk()
        ours = [(e.module, e.name) for e in res.events if e.kind == "global"]
        blocked = any(e.kind in ("unresolved", "call") for e in res.events)
        assert ours[:len(real.seen)] == real.seen or blocked, data
