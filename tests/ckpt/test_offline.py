"""A checkpoint of a 2-rank Slurm job, read afterwards in one process outside Slurm: any
rank's shard (``hpcml.ckpt.load``, ``Checkpointer.load``), a replicated one without naming a
rank, ``hpcml ckpt export`` to safetensors read back by the reference library, and
``hpcml scan`` of the whole directory, all checked like the job's own resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcml.ckpt import Checkpointer, CheckpointError, load
from hpcml.errors import UsageError
from tests import needs
from tests.slurmjobs import run_job

torch = needs.module("torch")
safetensors_torch = needs.module("safetensors.torch")
ROOT = Path(__file__).resolve().parents[2]

#: each rank saves its own model shard (FSDP-like) and every rank the same model (DDP, replicated)
WRITER = """
import os, sys, torch
from hpcml.ckpt import Checkpointer
r = int(os.environ["SLURM_PROCID"])
model = {"w": torch.full((4, 3), float(r + 1), dtype=torch.bfloat16), "b": torch.arange(3) + 10 * r}
state = {"model": model, "optim": {"state": {0: {"exp_avg": torch.ones(2) * r}}}, "step": 20, "rank": r}
with Checkpointer(sys.argv[1]) as ck:
    ck.save(state, 20)
with Checkpointer(sys.argv[2], replicated=True) as ck:
    ck.save({"model": {"w": torch.ones(2)}, "step": 20}, 20)
print("saved", r, flush=True)
"""


def _hpcml(*args) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HPCML_CKPT"))}
    return subprocess.run([sys.executable, "-m", "hpcml", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=120)


@pytest.fixture
def written(slurm_env, tmp_path):
    env = {**slurm_env, "PYTHONPATH": str(ROOT), "PATH": f"{Path(sys.executable).parent}:{slurm_env['PATH']}"}
    (tmp_path / "writer.py").write_text(WRITER)
    out = run_job(f"#!/bin/bash\nsrun {sys.executable} writer.py {tmp_path / 'sharded'} {tmp_path / 'replicated'}\n",
                  tmp_path, env, timeout=180)
    assert out.count("saved") == 2, out
    return tmp_path


def test_a_2_rank_checkpoint_loads_by_rank_and_exports_in_one_process(written, monkeypatch):
    for key in [k for k in os.environ if k.startswith(("SLURM_", "HPCML_CKPT", "RANK", "WORLD_SIZE"))]:
        monkeypatch.delenv(key)
    ck = written / "sharded"
    state, step = load(ck, rank=1)
    assert step == 20 and state["rank"] == 1 and state["model"]["w"].dtype == torch.bfloat16
    assert torch.equal(state["model"]["w"], torch.full((4, 3), 2.0, dtype=torch.bfloat16))
    assert torch.equal(state["optim"]["state"][0]["exp_avg"], torch.ones(2))
    state, _ = Checkpointer(ck, read_only=True).load(20, rank=0)
    assert state["rank"] == 0
    state, _ = Checkpointer(ck, rank=1, world_size=2, read_only=True).load_latest()   # no HPCML_CKPT_TOKEN
    assert state["rank"] == 1
    with pytest.raises(UsageError, match="world size 2; name the shard to load, rank 0 to 1"):
        load(ck)
    state, _ = load(written / "replicated")                      # DDP: one state, no rank to name
    assert torch.equal(state["model"]["w"], torch.ones(2))

    out = _hpcml("ckpt", "export", ck, "20", "--rank", "1", "--key", "model", "--to", written / "model.safetensors",
                 "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["left_out"] == []
    exported = safetensors_torch.load_file(written / "model.safetensors")
    assert exported.keys() == {"w", "b"} and torch.equal(exported["w"], load(ck, rank=1)[0]["model"]["w"])
    assert torch.equal(exported["b"], torch.arange(3) + 10)
    out = _hpcml("ckpt", "export", ck, "--to", written / "all.safetensors")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "--rank" in out.stderr, out.stderr

    out = _hpcml("scan", written)
    assert out.returncode == 0, out.stdout

    shard = ck / "step-00000020" / "rank-00001.bin"
    raw = bytearray(shard.read_bytes())
    raw[0] ^= 0xFF
    shard.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="rank-00001.bin: checksum mismatch"):
        load(ck, rank=1)
    out = _hpcml("ckpt", "export", ck, "--rank", "1", "--to", written / "bad.safetensors")
    assert out.returncode == 1 and "checksum mismatch" in out.stderr and not (written / "bad.safetensors").exists()


def _forge_leaf(step_dir: Path, pickled: bytes) -> None:
    """Replace the shard's one pickled leaf by ``pickled`` (the same length), and put the
    shard's new checksum in the manifest: a checkpoint whose sizes and checksums are right."""
    import json

    from hpcml.ckpt import layout
    idx = json.loads((step_dir / "rank-00000.json").read_text())
    e = next(x for x in idx["entries"] if x["kind"] == "pickle")
    assert e["nbytes"] == len(pickled), (e["nbytes"], len(pickled))
    shard = step_dir / "rank-00000.bin"
    data = bytearray(shard.read_bytes())
    data[e["offset"]:e["offset"] + e["nbytes"]] = pickled
    shard.write_bytes(bytes(data))
    man = json.loads((step_dir / "manifest.json").read_text())
    man["ranks"]["0"]["crc32"] = layout.file_crc(shard)
    (step_dir / "manifest.json").write_text(json.dumps(man))


#: Fraction("1e30000000000000"): an allowlisted constructor that never returns (issue 62)
NEVER_RETURNS = b"\x80\x04\x8c\x09fractions\x8c\x08Fraction\x93\x8c\x101e30000000000000\x85R."


def test_a_refused_pickled_leaf_is_not_loaded_verify_says_so_and_the_step_before_loads(tmp_path, capsys):
    """The load-time lock enforces the scan's argument checks, not only names: the newest
    checkpoint's leaf is refused in one line naming checkpoint, shard and leaf, the one
    before it loads, and ``verify`` calls the newest bad."""
    from fractions import Fraction

    import numpy as np

    from hpcml.ckpt import Checkpointer, layout
    ck = tmp_path / "ck"
    with Checkpointer(ck) as c:
        c.save({"w": np.ones(3), "hp": {"lr": Fraction(1, 3)}}, 1)
        c.save({"w": np.ones(3) * 2, "hp": {"lr": Fraction(1, 3)}}, 2)
    _forge_leaf(ck / "step-00000002", NEVER_RETURNS)
    c = Checkpointer(ck, read_only=True)
    state, step = c.load_latest()
    assert step == 1 and state["hp"]["lr"] == Fraction(1, 3) and float(state["w"][0]) == 1.0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "step-00000002" in err[0] and "rank-00000.bin" in err[0] and "hp.lr" in err[0], err
    assert "Fraction" in err[0] and "trying the checkpoint before it" in err[0]
    found = {f.step: f for f in layout.scan(ck)}
    problems = layout.verify(found[2])
    assert len(problems) == 1 and "hp.lr" in problems[0] and "refused" in problems[0], problems
    assert layout.verify(found[1]) == []
