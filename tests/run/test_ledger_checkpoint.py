"""Checkpoint blocking in the time ledger: an unchanged torch training loop that saves with
``torch.save`` (as HF Trainer and Lightning do), and one that saves with hpcml's
Checkpointer, each under ``hpcml run``. The script times its own saves and steps into a
file it appends to (O_APPEND); the ledger's ``checkpoint`` part is checked against those
times, and its productive time against the span of the script's steps less its saves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

LOOP = """\
import os, sys, time
import torch
fd = os.open(os.environ["LEDGER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
big = torch.randn(6_000_000)                       # 24 MB: a save that takes a while
ckpt = None
if os.environ["HOW"] == "hpcml":
    from hpcml.ckpt import Checkpointer
    ckpt = Checkpointer(os.environ["CKPT"])
for step in range(1, 31):
    loss = model(torch.randn(32, 64)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    os.write(fd, f"step {step} {time.time()}\\n".encode())
    time.sleep(0.02)
    if step % 10 == 0:
        t0 = time.time()
        if ckpt is None:
            torch.save({"model": model.state_dict(), "big": big}, os.environ["OUT"] + f".{step}")
        else:
            ckpt.save({"model": model.state_dict(), "big": big}, step)
        os.write(fd, f"save {step} {t0} {time.time()}\\n".encode())
if ckpt is not None:
    ckpt.close()
"""


@pytest.mark.torch
@pytest.mark.parametrize("how", ["torch.save", "hpcml"])
def test_saves_that_held_the_loop_are_their_own_part_of_the_ledger(tmp_path, how):
    (tmp_path / "loop.py").write_text(LOOP)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LEDGER": str(tmp_path / "ledger"), "HOW": how,
           "CKPT": str(tmp_path / "ckpt"), "OUT": str(tmp_path / "model.pt")}
    p = subprocess.run([sys.executable, "-m", "hpcml", "run", "--ntasks", "1", "--dir", "job", "--", sys.executable,
                        "loop.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    rows = [line.split() for line in (tmp_path / "ledger").read_text().splitlines()]
    steps = {int(r[1]): float(r[2]) for r in rows if r[0] == "step"}
    saves = [(float(r[2]), float(r[3])) for r in rows if r[0] == "save"]
    assert len(saves) == 3
    led = json.loads((tmp_path / "job" / "run.json").read_text())["ledger"]
    part = [x for x in led["parts"] if x["part"] == "checkpoint"]
    assert len(part) == 1, led["parts"]
    # every save: the training span runs from the first step's end to the last sign of
    # progress, the end of the last save (a section's end is progress too)
    held = sum(b - a for a, b in saves)
    assert held > 0.01
    assert part[0]["seconds"] == pytest.approx(held, abs=0.02 + 0.2 * held)
    productive = sum(x["seconds"] for x in led["parts"] if x["part"] == "productive")
    span = max(steps[30], saves[-1][1]) - steps[1]
    assert productive == pytest.approx(span - held, abs=0.3)
    assert sum(x["seconds"] for x in led["parts"] if x["seconds"] is not None) == pytest.approx(led["total_s"], abs=0.01)
