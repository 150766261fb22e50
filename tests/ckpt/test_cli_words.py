"""What ``hpcml ckpt ls`` and ``verify`` say in words: a verdict line a researcher reads
(not the state column), and a file given for a directory named as such."""

from __future__ import annotations

import subprocess
import sys

import torch

from hpcml.ckpt import Checkpointer


def _ckpt(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcml", "ckpt", *args], capture_output=True, text=True, timeout=120)


def test_verify_ends_with_a_verdict_and_ls_of_a_file_says_not_a_directory(tmp_path):
    ck = Checkpointer(tmp_path / "ck")
    for step in (1, 2, 3):
        ck.save({"w": torch.full((100,), float(step))}, step)
        ck.wait()
    out = _ckpt("verify", str(tmp_path / "ck"))
    assert out.returncode == 0 and out.stdout.splitlines()[-1] == "all 3 checkpoints verify", out.stdout
    one = _ckpt("verify", str(tmp_path / "ck"), "2")
    assert one.stdout.splitlines()[-1] == "1 checkpoint verifies", one.stdout
    victim = tmp_path / "ck" / "step-00000002" / "rank-00000.bin"
    data = bytearray(victim.read_bytes())
    data[50] ^= 0xFF
    victim.write_bytes(bytes(data))
    bad = _ckpt("verify", str(tmp_path / "ck"))
    assert bad.returncode == 1 and bad.stdout.splitlines()[-1] == "1 of 3 checkpoints corrupt (step 2)", bad.stdout
    notes = tmp_path / "notes.txt"
    notes.write_text("x")
    ls = _ckpt("ls", str(notes))
    assert ls.returncode == 2 and ls.stderr == f"hpcml ckpt ls: error: {notes}: not a directory\n", ls.stderr
