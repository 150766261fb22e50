"""A process's Python stack read from outside with py-spy (``hpcml.observe.stacks``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcml.observe import stacks
from hpcml.observe.snapshot import SCHEMA, RankStack, read_stacks, stack_path
from hpcml.observe.stacks import MAX_FRAMES, MAX_TEXT, MAX_THREADS, Frame, Stack, dump, py_spy

FIXTURES = Path(__file__).parents[1] / "fixtures" / "pyspy"

PROGRAM = """
import threading, time
def beside():
    time.sleep(60)
def stuck():
    time.sleep(60)
threading.Thread(target=beside, daemon=True).start()
print("ready", flush=True)
stuck()
"""


def real(name: str) -> tuple[list, int]:
    """A real ``py-spy dump --json`` (tests/fixtures/pyspy) and the pid it read."""
    raw = json.loads((FIXTURES / f"pyspy-0.4.3-{name}.json").read_text())
    return raw, raw[0]["pid"]


def legacy(raw: list, target: int) -> dict:
    """What ``dump`` wrote before the stack was a model: its output must not change."""
    return {"pid": target, "threads": [
        {"name": t.get("thread_name"), "main": t.get("os_thread_id") == target, "active": t.get("active"),
         "owns_gil": t.get("owns_gil"),
         "frames": [{"name": f.get("name"), "file": f.get("filename"), "line": f.get("line")}
                    for f in t.get("frames") or []]}
        for t in raw if isinstance(t, dict)]}


def test_the_main_threads_stack_of_a_stuck_program():
    assert py_spy() is not None                  # a dependency of hpcml: installed with it
    p = subprocess.Popen([sys.executable, "-c", PROGRAM], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "ready\n"
        # "ready" comes just before stuck() is called: read again until the main thread is in it
        # (a bound, not a guessed delay); a dump that never shows stuck() fails below
        deadline = time.monotonic() + 30
        while True:
            got = dump(p.pid)
            assert got.error is None, got
            frames = got.main_thread()
            if frames[:1] and frames[0].name == "stuck" or time.monotonic() > deadline:
                break
        assert [(f.name, f.line) for f in frames] == [("stuck", 6), ("<module>", 9)]
        assert len(got.threads) == 2 and got.pid == p.pid
    finally:
        p.kill()
        p.wait()


def test_a_process_that_is_gone_is_an_error_not_an_exception():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    got = dump(p.pid)
    assert got.error.startswith("py-spy") and got.main_thread() == ()
    assert got.to_json() == {"pid": got.pid, "error": got.error}


@pytest.mark.parametrize("name, main", [("waiting", [("all_reduce", 5), ("main", 22), ("<module>", 25)]),
                                        ("loading", [("Shards.__getitem__", 8), ("DataLoader.__next__", 11),
                                                     ("main", 20), ("<module>", 25)])])
def test_a_real_py_spy_dump_is_parsed_once_and_written_as_before(name, main):
    raw, pid = real(name)
    stack = Stack.of_py_spy(raw, pid)
    assert stack.error is None and [t.name for t in stack.threads] == ["heartbeat", "MainThread"]
    assert [t.main for t in stack.threads] == [False, True]          # py-spy lists the main thread second
    assert [(f.name, f.line) for f in stack.main_thread()] == main
    assert all(f.file and f.file.startswith("/") for t in stack.threads for f in t.frames)
    # the stack file's bytes are what they were, and reading one back gives the same stack
    assert json.dumps(stack.to_json()) == json.dumps(legacy(raw, pid))
    assert Stack.of(json.loads(json.dumps(stack.to_json()))) == stack


def test_garbage_from_py_spy_is_an_error_or_bounded_never_an_exception():
    assert Stack.of_py_spy({"threads": []}, 7) == Stack(pid=7, error="py-spy: output is not a list of threads")
    assert Stack.of_py_spy(3, 7).error and Stack.of_py_spy(None, 7).main_thread() == ()
    odd = Stack.of_py_spy([1, "x", {"thread_name": 5, "os_thread_id": "7", "active": "yes", "frames": "abc"},
                           {"os_thread_id": 7, "frames": [3, {"name": ["f"], "filename": b"x", "line": True},
                                                          {"name": "g", "filename": "a.py", "line": 4}]}], 7)
    assert [(t.name, t.main, t.active, t.frames) for t in odd.threads] == [
        (None, False, None, ()), (None, True, None, (Frame(None, None, None), Frame("g", "a.py", 4)))]
    # a rank's memory may hold anything: a huge stack is cut, innermost frames and the main thread kept
    frame = {"name": "f" * (MAX_TEXT + 10), "filename": "/u/deep.py", "line": 1}
    deep = [{"os_thread_id": 100 + i, "frames": [frame]} for i in range(MAX_THREADS + 5)]
    deep.append({"os_thread_id": 7, "frames": [{**frame, "line": n} for n in range(MAX_FRAMES + 50)]})
    cut = Stack.of_py_spy(deep, 7)
    assert len(cut.threads) == MAX_THREADS and cut.threads[-1].main
    assert [f.line for f in cut.main_thread()] == list(range(MAX_FRAMES))
    assert {len(f.name or "") for f in cut.main_thread()} == {MAX_TEXT}


def fake_py_spy(tmp_path: Path, monkeypatch, output: str) -> None:
    exe = tmp_path / "py-spy"
    (tmp_path / "out").write_text(output)
    exe.write_text(f"#!/bin/sh\ncat {tmp_path / 'out'}\n")
    exe.chmod(0o755)
    monkeypatch.setattr(stacks, "py_spy", lambda: str(exe))


@pytest.mark.parametrize("output, error", [("[{", "py-spy: output is not JSON"),
                                           ("[" * 100_000, "py-spy: output is not JSON"),
                                           ('{"a": 1}', "py-spy: output is not a list of threads"),
                                           ("[]" + " " * (1 << 20), "py-spy: output over 1 MiB")])
def test_dump_says_what_was_wrong_with_py_spys_output(tmp_path, monkeypatch, output, error):
    monkeypatch.setattr(stacks, "MAX_OUTPUT", 1 << 20)
    fake_py_spy(tmp_path, monkeypatch, output)
    assert dump(os.getpid()) == Stack(pid=os.getpid(), error=error)


def test_a_stack_file_of_the_wrong_shape_gives_no_frames():
    for bad in [None, [], {"threads": "x"}, {"threads": [1, "a"]}, {"threads": [{"frames": "x"}]},
                {"threads": [{"main": True, "frames": [3, {"name": "f", "file": "a.py", "line": 1}]}]}]:
        frames = Stack.of(bad).main_thread()
        assert all(isinstance(f, Frame) for f in frames)
    assert Stack.of({"threads": [{"main": True, "frames": [3, {"name": "f"}]}]}).main_thread() == (Frame("f", None, None),)
    assert Stack.of({"pid": 3, "error": 5}) == Stack(pid=3, error="not a stack")


def test_stack_files_are_read_into_models_and_a_hostile_one_is_left_out(tmp_path):
    raw, pid = real("waiting")
    stack = Stack.of_py_spy(raw, pid)
    stack_path(tmp_path, 0).parent.mkdir(parents=True)
    stack_path(tmp_path, 0).write_text(json.dumps({"schema": SCHEMA, "rank": 0, "snapshot": 9, "at": 5.5,
                                                   **stack.to_json()}))
    stack_path(tmp_path, 1).write_text(json.dumps({"schema": SCHEMA, "rank": True, "threads": []}))
    stack_path(tmp_path, 2).write_text(json.dumps({"schema": SCHEMA, "rank": 2, "snapshot": "9", "threads": 7}))
    stack_path(tmp_path, 3).write_text("[" * 100_000)
    got = read_stacks(tmp_path)
    assert got == {0: RankStack(rank=0, snapshot=9, at=5.5, stack=stack),
                   2: RankStack(rank=2, snapshot=None, at=None, stack=Stack(pid=None))}
