"""Progress of long work (``hpcml.progress``): a bar on a terminal's stderr, for the real
commands (``data index``, ``data doctor``, ``scan``, ``observe report``), and nothing in a
log (stderr a pipe), under ``--json``, or ever in stdout. The terminal is a real
pseudo-terminal (``os.openpty``) as the command's stderr; what Rich drew there is read back
raw (a transient bar is drawn, then erased with control codes: its text stays in the stream)."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from pathlib import Path

import pytest

from hpcml import progress
from tests.data.gen import make_shards

ROOT = Path(__file__).resolve().parents[1]


def _run(args: list[str], cwd: Path, tty: bool) -> tuple[str, str, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(PYTHONPATH=str(ROOT / "src"), TERM="xterm-256color", COLUMNS="120")
    if not tty:
        p = subprocess.run([sys.executable, "-m", "hpcml", *args], cwd=cwd, env=env, capture_output=True,
                           text=True, timeout=300)
        return p.stdout, p.stderr, p.returncode
    master, slave = os.openpty()
    p = subprocess.Popen([sys.executable, "-m", "hpcml", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                         stderr=slave, stdin=subprocess.DEVNULL)
    os.close(slave)
    seen = bytearray()
    while True:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:                      # EIO: the command closed its end
                chunk = b""
            if not chunk and p.poll() is not None:
                break
            seen += chunk
        elif p.poll() is not None:
            break
    out = p.stdout.read().decode() if p.stdout else ""
    p.wait(timeout=60)
    os.close(master)
    return out, seen.decode("utf-8", "replace"), p.returncode


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    _, out = make_shards(tmp_path_factory.mktemp("idx"), samples=400, target=20_000)
    (out / "manifest.json").unlink()                 # someone else's shards, to index
    return out


@pytest.mark.parametrize("tty, as_json, bar", [(True, False, True), (True, True, False), (False, False, False)])
def test_indexing_shards_shows_a_bar_only_on_a_terminal_and_never_under_json(shards, tmp_path, tty, as_json, bar):
    out, err, code = _run(["data", "index", str(shards), "--out", str(tmp_path / "idx"),
                           *(["--json"] if as_json else [])], tmp_path, tty)
    assert code == 0, err
    assert ("indexing shards" in err) == bar, err[-2000:]
    assert "indexing shards" not in out                     # the result stays clean
    if as_json:
        assert out.lstrip().startswith("{")


def test_scanning_and_the_doctor_and_a_report_show_their_bars_on_a_terminal(shards, tmp_path):
    out, err, code = _run(["scan", str(shards)], tmp_path, tty=True)
    assert code in (0, 5, 8) and "scanning files" in err and "scanning files" not in out, err[-2000:]
    out, err, code = _run(["data", "doctor", str(shards)], tmp_path, tty=True)
    assert code == 0 and "scanning" in err and "files" in err, err[-2000:]
    rec = subprocess.run([sys.executable, "-m", "hpcml", "observe", "record", "--dir", str(tmp_path / "job"), "--",
                          sys.executable, "-c", "from hpcml import observe; observe.log(step=1, loss=1.0)"],
                         env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, capture_output=True, text=True,
                         timeout=120)
    assert rec.returncode == 0, rec.stderr
    out, err, code = _run(["observe", "report", str(tmp_path / "job")], tmp_path, tty=True)
    assert code == 0 and "reading ranks" in err and "reading ranks" not in out, err[-2000:]


def test_advance_without_a_terminal_is_a_no_op_and_a_failing_bar_never_stops_the_work():
    progress.advance("anything", 1, 2)                      # no reporter: nothing
    calls = []
    with progress.on_terminal(True):                         # the test's stderr is no terminal: none installed
        progress.advance("x", 1, 1)
    assert progress._reporter is None

    def broken(what, done, total):
        calls.append(what)
        raise RuntimeError("a bar that fails")
    progress._reporter = broken
    try:
        progress.Counter("work", 2).step()
    finally:
        progress._reporter = None
    assert calls == ["work"]
