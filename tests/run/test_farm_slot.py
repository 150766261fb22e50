"""``hpcml run`` inside an ``hpcml farm`` task on a GPU slot: one rank per GPU of the slot
(CUDA_VISIBLE_DEVICES), not one per GPU of the node (NVML's count ignores that variable).
A 4-GPU node is NVML's replay of a recorded H100; the farm, its workers and the runs are
real processes."""

from __future__ import annotations

from pathlib import Path

from hpcml.farm import store
from hpcml.farm.model import TaskSpec
from tests.farm.farmtools import ends, hpcml

ROOT = Path(__file__).resolve().parents[2]
RANK = "import os; print(os.environ['RANK'], os.environ['WORLD_SIZE'], os.environ['CUDA_VISIBLE_DEVICES'])"


def test_a_run_in_a_gpu_slot_starts_one_rank_per_gpu_of_the_slot(tmp_path):
    farm = tmp_path / "farm"
    cmd = f"python -m hpcml run -- python -c \"{RANK}\""
    store.create(farm, [TaskSpec(cmd), TaskSpec(cmd)], {"retries": 0})
    node = {"HPCML_GPM_REPLAY": str(ROOT / "tests" / "fixtures" / "gpm" / "gpm-h100.jsonl"),
            "HPCML_GPM_REPLAY_GPUS": "4"}
    p = hpcml("farm", "run", farm, "--gpus", "4", extra=node)
    logs = {t: (farm / "logs" / f"{t}.1.out").read_text() + (farm / "logs" / f"{t}.1.err").read_text()
            for t in (0, 1)}
    assert p.returncode == 0 and all(e["outcome"] == "ok" for e in ends(farm).values()), p.stderr + str(logs)
    seen = []
    for t in (0, 1):
        rank_logs = sorted((farm / "runs" / f"{t}.1" / "logs").glob("rank-*.out"))
        ranks = [f.read_text().split() for f in rank_logs]
        assert [r[:2] for r in ranks] == [["0", "1"]], logs[t] + str(ranks)    # one rank, world size 1
        assert "hpcml run: 1 local task," in logs[t], logs[t]
        seen.append(ranks[0][2])
    assert len(set(seen)) == 2 and set(seen) <= {"0", "1", "2", "3"}           # each its slot's GPU
