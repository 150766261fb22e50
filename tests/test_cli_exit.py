"""How the ``hpcml`` program ends once a command is done (``hpcml.cli._exit``).

With pyarrow loaded, CPython's teardown can end a finished command with SIGABRT from an
Arrow pool thread (CI saw ``observe report --json`` print its whole report, then
``terminate called without an active exception``, status -6). The program leaves with
``os._exit`` instead; these tests hold it to what normal shutdown promises: the status,
every byte written, the ``atexit`` handlers and the non-daemon threads.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


def end(body: str, code: str) -> subprocess.CompletedProcess:
    script = textwrap.dedent("""\
        import atexit, sys, threading, time
        import pyarrow
        from hpcml.cli import _exit
        atexit.register(lambda: print("atexit ran", file=sys.stderr))
        def late():
            time.sleep(0.3)
            sys.stdout.write("thread done\\n")
        threading.Thread(target=late).start()
        """) + textwrap.dedent(body) + f"\n_exit({code})\n"
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("code, status", [("0", 0), ("None", 0), ("2", 2), ("130", 130)])
def test_status_output_atexit_and_threads_survive_the_fast_exit(code, status):
    p = end("sys.stdout.write('x' * 200_000)\n", code)
    assert p.returncode == status, p.stderr
    assert p.stdout.count("x") == 200_000 and p.stdout.endswith("thread done\n")
    assert "atexit ran" in p.stderr


def test_a_message_given_to_sys_exit_is_printed_with_status_1():
    p = end("", "'hpcml: gone'")
    assert p.returncode == 1 and "hpcml: gone" in p.stderr and "atexit ran" in p.stderr


def test_a_pyarrow_command_ends_with_its_own_status(tmp_path):
    """The whole program: a command that loads pyarrow keeps its exit code and its JSON."""
    import json
    import os

    def hpcml(*args: str) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HPCML_"))}
        return subprocess.run([sys.executable, "-m", "hpcml", *args], capture_output=True, text=True,
                              timeout=120, cwd=tmp_path, env=env)
    bad = hpcml("observe", "report", "nope", "--json")
    assert bad.returncode == 2 and "not a job directory" in bad.stderr
    rec = hpcml("observe", "record", "--dir", "obs", "--", sys.executable, "-c", "import time; time.sleep(0.5)")
    assert rec.returncode == 0, rec.stderr
    ok = hpcml("observe", "report", "obs", "--json")
    assert ok.returncode == 0, ok.stderr
    assert "ranks_with_data" in json.loads(ok.stdout)
