"""Hang analysis on real Flight Recorder dumps (gloo, CPU) and on hand-made ones."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hpcml.observe.hang import analyse


def _entry(seq: int, name: str = "nccl:all_reduce", sizes=((4,),), pg=("0", "default_pg")) -> dict:
    return {"record_id": seq, "pg_id": 0, "process_group": pg, "collective_seq_id": seq,
            "p2p_seq_id": 0, "op_id": seq, "profiling_name": name, "input_sizes": [list(s) for s in sizes],
            "state": "completed", "retired": True, "is_p2p": False, "frames": []}


def _dump(path: Path, entries: list[dict], world: int) -> None:
    path.write_bytes(pickle.dumps({"version": "2.10", "entries": entries,
                                   "pg_config": {"0": {"name": "0", "desc": "default_pg",
                                                       "ranks": str(list(range(world)))}}}))


def test_mismatch_and_missing_dump(tmp_path):
    for rank in range(3):                   # rank 3 left no dump
        entries = [_entry(s) for s in range(5, 12)]        # a ring buffer: seq 5 onwards
        if rank == 2:
            entries[3] = _entry(8, sizes=((8,),))          # rank 2 reduces a different tensor
        _dump(tmp_path / f"nccl_trace_rank_{rank}", entries, world=4)
    rep = analyse(tmp_path)
    assert rep.missing == [3]
    assert [(f.kind, f.seq, f.culprits) for f in rep.findings] == [("mismatch", 8, [2])]


def test_rank_that_never_entered(tmp_path):
    for rank in range(4):
        last = 20 if rank != 1 else 17
        _dump(tmp_path / f"rank{rank}", [_entry(s) for s in range(10, last + 1)], world=4)
    f = analyse(tmp_path).findings[0]
    assert (f.kind, f.seq, f.culprits, f.entered) == ("never-entered", 18, [1], [0, 2, 3])


def test_dump_that_imports_is_refused_and_never_run(tmp_path):
    marker = tmp_path / "marker"
    _dump(tmp_path / "trace_0", [_entry(1)], world=2)
    evil = (b"\x80\x04\x8c\x02os\x8c\x06system\x93\x8c" + bytes([len(f"touch {marker}")])
            + f"touch {marker}".encode() + b"\x85R.")
    (tmp_path / "trace_1").write_bytes(evil)
    rep = analyse(tmp_path)
    assert "trace_1" in rep.refused and "os.system" in rep.refused["trace_1"]
    assert rep.missing == [1]
    assert not marker.exists()


def test_cli_bad_input_and_json(tmp_path):
    out = subprocess.run([sys.executable, "-m", "hpcml", "observe", "hang", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "no Flight Recorder dumps" in out.stderr
    for rank in range(2):
        _dump(tmp_path / f"r{rank}", [_entry(s) for s in range(3 + rank)], world=2)
    out = subprocess.run([sys.executable, "-m", "hpcml", "observe", "hang", "--json", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    assert json.loads(out.stdout)["findings"][0]["culprits"] == [0]


@pytest.mark.torch
def test_real_gloo_flight_recorder_dumps(tmp_path):
    """Two real ranks on gloo; rank 1 starts an all_reduce that rank 0 never joins."""
    pytest.importorskip("torch")
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys, torch, torch.distributed as dist
        import torch._C._distributed_c10d as c10d
        rank = int(sys.argv[1])
        dist.init_process_group("gloo", init_method="file://{tmp_path}/store", rank=rank, world_size=2)
        t = torch.ones(4)
        for _ in range(3):
            dist.all_reduce(t)
        if rank == 1:
            dist.all_reduce(t, async_op=True)
        open("{tmp_path}/dumps/rank_" + str(rank), "wb").write(c10d._dump_fr_trace())
        os._exit(0)
    """))
    (tmp_path / "dumps").mkdir()
    env = {"TORCH_FR_BUFFER_SIZE": "100", "PATH": "/usr/bin:/bin"}
    procs = [subprocess.Popen([sys.executable, str(script), str(r)], env=env) for r in range(2)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    rep = analyse(tmp_path / "dumps")
    assert not rep.refused and rep.missing == []
    f = rep.findings[0]
    assert (f.kind, f.culprits, f.entered) == ("never-entered", [0], [1])
    assert "all_reduce" in f.detail
