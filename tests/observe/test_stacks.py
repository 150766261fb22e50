"""A process's Python stack read from outside with py-spy (``hpcml.observe.stacks``)."""

from __future__ import annotations

import subprocess
import sys
import time

from hpcml.observe.stacks import dump, main_thread, py_spy

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
            assert "error" not in got, got
            frames = main_thread(got)
            if frames[:1] and frames[0]["name"] == "stuck" or time.monotonic() > deadline:
                break
        assert [(f["name"], f["line"]) for f in frames] == [("stuck", 6), ("<module>", 9)]
        assert len(got["threads"]) == 2
    finally:
        p.kill()
        p.wait()


def test_a_process_that_is_gone_is_an_error_not_an_exception():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    got = dump(p.pid)
    assert got["error"].startswith("py-spy") and main_thread(got) == []


def test_a_stack_file_of_the_wrong_shape_gives_no_frames():
    for bad in [None, [], {"threads": "x"}, {"threads": [1, "a"]}, {"threads": [{"frames": "x"}]},
                {"threads": [{"main": True, "frames": [3, {"name": "f", "file": "a.py", "line": 1}]}]}]:
        frames = main_thread(bad)
        assert all(isinstance(f, dict) for f in frames)
    assert main_thread({"threads": [{"main": True, "frames": [3, {"name": "f"}]}]}) == [{"name": "f"}]
