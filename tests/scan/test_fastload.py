"""The C-unpickler fast path: it proves only plain data, and everything else still reaches
the walker with the walker's own findings."""

from __future__ import annotations

import io
import os
import pickle
import random
import subprocess
import sys

import pytest

from hpcml.scan import fastload, pickles
from hpcml.scan.model import Verdict
from hpcml.scan.picklewalk import PickleWalker
from hpcml.scan.scanner import scan_file
from tests.scan.programs import random_program

ROWS = [{"a": i, "b": str(i), "c": [i, i + 1], "f": i / 3} for i in range(60_000)]   # > 1 MiB pickled


def _plain(rows, protocol: int = 2) -> bytes:
    """Plain data the fast path may prove: no memo (pickle's fast mode) and no 0x95 byte
    anywhere (one could be a FRAME, which only the walker reads as every CPython reader does)."""
    rows = [r for r in rows if b"\x95" not in pickle.dumps(r, protocol=protocol)]
    buf = io.BytesIO()
    pickler = pickle.Pickler(buf, protocol=protocol)
    pickler.fast = True
    pickler.dump(rows)
    data = buf.getvalue()
    assert b"\x95" not in data
    return data


def _walks(monkeypatch) -> list[int]:
    """Count the walker's runs (the fast path must leave plain data to itself)."""
    calls: list[int] = []
    real = pickles.walk_one

    def counted(fh, start, end):
        calls.append(start)
        return real(fh, start, end)
    monkeypatch.setattr(pickles, "walk_one", counted)
    return calls


def test_random_programs_proven_only_when_the_walker_sees_no_code():
    """The same 12,000 random programs as the walker's differential test: whenever the fast
    path calls a stream plain data, the walker finds no import, call or error in it; and it
    does prove the plain ones (so the fast path is really taken)."""
    rng = random.Random(20261123)
    proven = 0
    for _ in range(12000):
        data = random_program(rng)
        ends = fastload._load_all(data)
        if ends is None:
            continue
        proven += 1
        res = PickleWalker(io.BytesIO(data), 0, len(data)).walk()
        assert not res.events and res.error is None, data
        assert ends == [res.end]
    assert proven > 1000


def test_plain_data_is_proven_without_the_walker(tmp_path, monkeypatch):
    path = tmp_path / "rows.pkl"
    path.write_bytes(_plain(ROWS, 3) + _plain(ROWS[:10] * 2000, 2))
    walked = _walks(monkeypatch)
    res = scan_file(path)
    assert res.verdict is Verdict.SAFE and walked == []
    assert res.notes == ["2 pickles in one stream; every one was scanned"]


def test_a_stream_with_frames_is_walked_not_proven(tmp_path, monkeypatch):
    """CPython's readers read a frame an opcode crosses differently (tests/scan/test_frames.py):
    one C reading proves only itself, so protocol 4+ streams take the walker."""
    path = tmp_path / "rows.pkl"
    path.write_bytes(pickle.dumps(ROWS, protocol=4))
    walked = _walks(monkeypatch)
    assert scan_file(path).verdict is Verdict.SAFE and walked == [0]


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_a_global_after_a_megabyte_of_data_is_found_with_its_offset(tmp_path, monkeypatch, protocol):
    import os
    path = tmp_path / "late.pkl"
    path.write_bytes(pickle.dumps([ROWS, os.system], protocol=protocol))
    walked = _walks(monkeypatch)
    res = scan_file(path)
    assert res.verdict is Verdict.DANGEROUS and walked == [0]
    assert res.findings[0].name in ("os.system", "posix.system")


def test_a_pickle_hidden_in_bytes_inside_plain_data_is_followed(tmp_path):
    inner = b"\x80\x04\x8c\x02os\x8c\x06system\x93\x8c\x04true\x85R."
    path = tmp_path / "blob.pkl"
    path.write_bytes(pickle.dumps({"rows": ROWS, "blob": inner}, protocol=4))
    res = scan_file(path)
    assert res.verdict is Verdict.DANGEROUS and "nested@" in res.findings[0].location.member


def test_bytes_that_only_look_like_a_header_do_not_leave_the_fast_path():
    """0x80 0x02 inside an int or a string is not a bytes argument: no walk for that."""
    data = pickle.dumps([0x02_80_00 + i for i in range(0, 1 << 20, 256)] + ["\x80\x02e" * 5], protocol=4)
    assert fastload._NESTED.search(data, 3) and not fastload._may_nest(data)
    assert fastload._may_nest(pickle.dumps([b"\x80\x02e" + b"x" * 20], protocol=4))


def test_a_child_that_crashes_or_runs_out_of_memory_falls_back_to_the_walker(tmp_path, monkeypatch):
    """A 2M-deep tuple used as a dict key makes the C unpickler's hash recurse past the
    stack: not proven, walked, and malformed (the real load dies the same way:
    tests/scan/test_tuple_depth.py). A tiny memory cap makes it fail on allocation: not
    proven, walked, safe."""
    deep = tmp_path / "deep.pkl"
    deep.write_bytes(b"\x80\x04}N" + b"\x85" * 2_000_000 + b"Ns.")
    with open(deep, "rb") as fh:
        assert fastload.plain_data_ends(fh, 0, deep.stat().st_size) is None
    assert scan_file(deep).verdict is Verdict.ERROR
    rows = tmp_path / "rows.pkl"
    rows.write_bytes(_plain(ROWS))
    # The cap counts address space the child adds; heap this long test process has freed
    # but still maps is reusable under it, so the capped load runs in a fresh interpreter.
    probe = (
        "import sys; from hpcml.scan import fastload\n"
        "with open(sys.argv[1], 'rb') as fh:\n"
        "    print(fastload.plain_data_ends(fh, 0, fh.seek(0, 2)))\n"
    )
    env = {**os.environ, "HPCML_SCAN_MEMORY": "1MiB"}
    capped = subprocess.run([sys.executable, "-c", probe, str(rows)], env=env,
                            capture_output=True, text=True, check=True)
    assert capped.stdout.strip() == "None", capped.stdout + capped.stderr
    env["HPCML_SCAN_MEMORY"] = "1GiB"
    roomy = subprocess.run([sys.executable, "-c", probe, str(rows)], env=env,
                           capture_output=True, text=True, check=True)
    assert roomy.stdout.strip() == f"[{rows.stat().st_size}]", roomy.stdout + roomy.stderr
    monkeypatch.setenv("HPCML_SCAN_MEMORY", "1MiB")
    monkeypatch.setattr(fastload, "plain_data_ends", lambda fh, start, end: None)
    walked = _walks(monkeypatch)
    assert scan_file(rows).verdict is Verdict.SAFE and walked == [0]


def test_a_truncated_stream_gets_the_walkers_message(tmp_path):
    path = tmp_path / "cut.pkl"
    path.write_bytes(pickle.dumps(ROWS, protocol=4)[:-1000])
    res = scan_file(path)
    assert res.verdict is Verdict.ERROR and "not a valid pickle" in res.errors[0]


def test_an_early_global_skips_the_child(tmp_path, monkeypatch):
    """A model file names its first class in the first bytes: no whole-file read, no fork."""
    import collections
    path = tmp_path / "od.pkl"
    path.write_bytes(pickle.dumps(collections.OrderedDict(a=ROWS), protocol=4))

    def no_fork():
        raise AssertionError("forked")
    monkeypatch.setattr(fastload.os, "fork", no_fork)
    with open(path, "rb") as fh:
        assert fastload.plain_data_ends(fh, 0, path.stat().st_size) is None
    assert scan_file(path).verdict is Verdict.SAFE
