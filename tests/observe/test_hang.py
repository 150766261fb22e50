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
from tests import needs


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
    needs.module("torch")
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


# -- dumps as the NCCL backend writes them on a hang (tests/observe/frdumps.py) -------------------

from tests.observe import frdumps as fr  # noqa: E402


def _pending_world_collectives(ranks, stuck: tuple[int, ...], level: int, ahead: int = 3) -> None:
    """The others enqueued ``ahead`` world all-reduces past ``level`` (the first started);
    the stuck ranks never enqueued any."""
    for r, rank in ranks.items():
        if r in stuck:
            rank.status["0"] = (level, level, level)
            continue
        rank.status["0"] = (level + ahead, level + 1, level)
        rank.entries = [fr.entry(level + k, state="started" if k == 1 else "scheduled") for k in range(1, ahead + 1)]


def test_pending_only_dumps_blame_the_ranks_with_empty_entry_lists(tmp_path):
    """The GIL case: ranks 9 and 14 never reached all-reduce #45265; their dumps are empty."""
    ranks = fr.job()
    _pending_world_collectives(ranks, stuck=(9, 14), level=45264)
    rep = analyse(fr.write(tmp_path, ranks))
    assert rep.missing == [] and not rep.refused
    assert len(rep.findings) == 1
    f = rep.findings[0]
    assert (f.pg, f.kind, f.seq, f.culprits) == ("0 (default_pg)", "never-entered", 45265, [9, 14])
    assert f.evidence[9] == {"enqueued": 45264, "started": 45264, "completed": 45264}
    assert f.group == {"enqueued": 45267, "started": 45265, "completed": 45264}
    assert "rank 9 45264/45264/45264; rank 14 45264/45264/45264" in f.detail
    assert "nccl:all_reduce" in f.detail


def test_empty_dumps_without_pg_status_are_still_members(tmp_path):
    """Older dumps without pg_status: membership from pg_config, and an empty pending-only
    dump means nothing pending, so behind the others."""
    ranks = fr.job()
    _pending_world_collectives(ranks, stuck=(3,), level=500)
    write_dir = fr.write(tmp_path, ranks)
    import pickle as _p
    for f in write_dir.iterdir():
        d = _p.loads(f.read_bytes())
        d.pop("pg_status")
        f.write_bytes(_p.dumps(d))
    f = analyse(tmp_path).findings[0]
    assert (f.kind, f.seq, f.culprits) == ("never-entered", 501, [3])


def test_a_rank_whose_stream_is_stuck_never_started(tmp_path):
    """The GPU-error case: everyone enqueued #1200, rank 5 never started it."""
    ranks = fr.job()
    for r, rank in ranks.items():
        started = 1199 if r == 5 else 1200
        rank.status["0"] = (1200, started, 1199)
        rank.entries = [fr.entry(1200, state="scheduled" if r == 5 else "started")]
    f = analyse(fr.write(tmp_path, ranks)).findings
    assert [(x.kind, x.seq, x.culprits) for x in f] == [("never-started", 1200, [5])]
    assert "never started" in f[0].detail and "rank 5 1200/1199/1199" in f[0].detail


def test_all_to_all_sizes_differ_legitimately(tmp_path):
    """MoE routing: each rank sends different sizes in all_to_all_single; no one is blamed."""
    ranks = fr.job()
    for r, rank in ranks.items():
        rank.status["0"] = (301, 301, 300)
        rank.entries = [fr.entry(301, name="nccl:all_to_all_single", sizes=((1000 + 37 * r, 4096),), state="started")]
    rep = analyse(fr.write(tmp_path, ranks))
    assert rep.findings == []


def test_all_to_all_beside_a_rank_that_is_behind_in_its_group(tmp_path):
    ranks = fr.job()
    for r, rank in ranks.items():
        rank.status["0"] = (301, 301, 300)
        rank.entries = [fr.entry(301, name="nccl:all_to_all_single", sizes=((1000 + 37 * r, 4096),), state="started")]
    for r in fr.GROUPS["8"][1]:                             # dp group [3, 7, 11, 15]
        ranks[r].status["8"] = (70, 70, 69) if r == 11 else (71, 71, 70)
        if r != 11:
            ranks[r].entries.append(fr.entry(71, pg="8", state="started"))
    rep = analyse(fr.write(tmp_path, ranks))
    assert [(f.pg, f.kind, f.culprits) for f in rep.findings] == [("8 (dp)", "never-entered", [11])]


def test_mismatch_names_the_minority_sorted(tmp_path):
    ranks = fr.job()
    for r, rank in ranks.items():
        rank.status["0"] = (50, 50, 49)
        rank.entries = [fr.entry(50, sizes=((8,),) if r in (10, 2) else ((4,),), state="started")]
    f = analyse(fr.write(tmp_path, ranks)).findings
    assert [(x.kind, x.seq, x.culprits) for x in f] == [("mismatch", 50, [2, 10])]


def test_mismatch_without_a_majority_names_no_culprit(tmp_path):
    """Every size group holds one rank: saying rank 10 (first in file order) would be a guess."""
    ranks = fr.job()
    for r in fr.GROUPS["3"][1]:                             # tp group [8, 9, 10, 11]
        ranks[r].status["3"] = (9, 9, 8)
        ranks[r].entries = [fr.entry(9, pg="3", sizes=((r,),), state="started")]
    f = analyse(fr.write(tmp_path, ranks, prefix="_dump_")).findings
    assert [(x.pg, x.kind, x.culprits) for x in f] == [("3 (tp)", "mismatch", [])]
    assert f[0].detail.startswith("no majority, so no culprit can be named")


def test_a_rank_without_a_dump_is_missing_not_blamed(tmp_path):
    ranks = fr.job()
    _pending_world_collectives(ranks, stuck=(9,), level=10)
    rep = analyse(fr.write(tmp_path, ranks, skip=(7,)))
    assert rep.missing == [7]
    assert [(f.kind, f.culprits) for f in rep.findings] == [("never-entered", [9])]
    assert (rep.roots, rep.blocked) == ([9], {})


def test_healthy_pending_only_dumps_have_no_finding(tmp_path):
    ranks = fr.job()
    assert analyse(fr.write(tmp_path, ranks)).findings == []


def test_full_dumps_with_completed_entries_still_work(tmp_path):
    ranks = fr.job({"0": 40})
    for r, rank in ranks.items():
        last = 37 if r == 6 else 40
        rank.status["0"] = (last, last, last)
        rank.entries = [fr.entry(s) for s in range(30, last + 1)]
    rep = analyse(fr.write(tmp_path, ranks, only_active=False))
    assert [(f.kind, f.seq, f.culprits) for f in rep.findings] == [("never-entered", 38, [6])]


def test_cli_prints_late_and_waiting_ranks_with_evidence(tmp_path):
    ranks = fr.job()
    _pending_world_collectives(ranks, stuck=(14, 9), level=45264)
    fr.write(tmp_path, ranks, prefix="_dump_")
    out = subprocess.run([sys.executable, "-m", "hpcml", "observe", "hang", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "never-entered: nccl:all_reduce" in out.stdout and "late: ranks 9, 14 never entered it" in out.stdout
    assert "culprits" not in out.stdout.split("\n", 1)[1]
    assert "group's furthest 45267/45265/45264" in out.stdout


def test_real_nccl_dump_from_an_h100(tmp_path):
    """A real torch 2.11 NCCL dump (one rank, 20 all-reduces, a broadcast, a barrier)."""
    import shutil
    src = Path(__file__).resolve().parents[1] / "fixtures" / "flight_recorder" / "fr-nccl-1rank-torch2.11.rank_0"
    shutil.copy(src, tmp_path / src.name)
    rep = analyse(tmp_path)
    assert not rep.refused and rep.missing == [] and rep.findings == []
    assert rep.last_seq == {"0 (default_pg)": {0: 22}}
    assert rep.backends == ["nccl"] and rep.pending == []     # whose view the dumps give; nothing left running


# -- across process groups: roots and the ranks blocked behind them ---------------------------------


@pytest.mark.parametrize("timing", [True, False])
def test_lock_gil_names_the_roots_not_the_ranks_blocked_in_the_expert_all_to_all(tmp_path, timing):
    """NVRx lock_gil: 9 and 14 hold the GIL before the EP all_to_all. On the default group
    ranks 8-15 are all behind, but 8, 10-13 and 15 wait inside the all_to_all for 9 and 14."""
    rep = analyse(fr.write(tmp_path, fr.lock_gil(timing=timing)))
    assert rep.missing == [] and not rep.refused
    by_pg = {f.pg: (f.kind, f.culprits) for f in rep.findings}
    assert by_pg == {"0 (default_pg)": ("never-entered", list(range(8, 16))),
                     "6 (ep)": ("never-entered", [9, 14])}
    assert rep.roots == [9, 14]
    assert rep.blocked == {r: [9, 14] for r in (8, 10, 11, 12, 13, 15)}
    assert not set(range(8)) & (set(rep.roots) | set(rep.blocked)) and rep.cycles == []
    assert rep.summary() == "roots: ranks 9, 14; ranks 8, 10-13, 15 blocked behind 9, 14"


def test_lock_gil_without_the_stuck_ranks_dumps_points_at_them(tmp_path):
    """9 and 14 left no dump: the expert group has no finding, but the ranks behind on the
    default group wait in it, so they are blocked behind its members without a dump."""
    rep = analyse(fr.write(tmp_path, fr.lock_gil(), skip=(9, 14)))
    assert rep.missing == [9, 14]
    assert [(f.pg, f.culprits) for f in rep.findings] == [("0 (default_pg)", [8, 10, 11, 12, 13, 15])]
    assert rep.roots == [9, 14] and rep.blocked == {r: [9, 14] for r in (8, 10, 11, 12, 13, 15)}
    assert rep.summary() == "roots: ranks 9, 14 (no dump from 9, 14); ranks 8, 10-13, 15 blocked behind 9, 14"


def test_pg_status_is_read_by_local_id_not_group_name(tmp_path):
    """Torch keys pg_status by the rank's local id of a group: rank 14's expert group "6" is
    its key "2". A full dump whose entries are gone save one completed collective on the
    tensor-parallel group (local id 1 is group "4": the creation order bears the names'
    order out) leaves pg_status as the evidence for the rest."""
    ranks = fr.job({"0": 300, "1": 11, "2": 22, "3": 33, "4": 44, "5": 55, "6": 66}, groups=fr.MOE_GROUPS)
    for r in range(8, 16):
        ranks[r].status["6"] = (66, 66, 66) if r == 14 else (67, 67, 66)
        ranks[r].entries = [fr.entry(44, pg="4", groups=fr.MOE_GROUPS)]
    write = fr.write(tmp_path, ranks, only_active=False)
    assert pickle.loads((write / "nccl_trace_dump_14").read_bytes())["pg_status"].keys() == {"0", "1", "2"}
    rep = analyse(write)
    assert [(f.pg, f.kind, f.seq, f.culprits) for f in rep.findings] == [("6 (ep)", "never-entered", 67, [14])]
    assert rep.last_seq["4 (tp)"] == {12: 44, 13: 44, 14: 44, 15: 44}
    assert rep.roots == [14]


def test_a_dump_with_no_entry_to_pair_local_ids_with_names_guesses_no_group(tmp_path):
    """The same job, no entry left in any dump: nothing pairs a local id with a group name,
    and real dumps (NVRx's Megatron MoE runs) do not number their groups in the names'
    order, so pg_status beyond the default group is unknown: no finding blames a rank on a
    group it might not be (was: rank 14 blamed by sorted order)."""
    ranks = fr.job({"0": 300, "1": 11, "2": 22, "3": 33, "4": 44, "5": 55, "6": 66}, groups=fr.MOE_GROUPS)
    for r in range(8, 16):
        ranks[r].status["6"] = (66, 66, 66) if r == 14 else (67, 67, 66)
    rep = analyse(fr.write(tmp_path, ranks, only_active=False))
    assert rep.findings == [] and rep.roots == []


def test_cli_names_roots_and_blocked_ranks_apart(tmp_path):
    fr.write(tmp_path, fr.lock_gil())
    out = subprocess.run([sys.executable, "-m", "hpcml", "observe", "hang", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "roots: ranks 9, 14; ranks 8, 10-13, 15 blocked behind 9, 14"
    out = subprocess.run([sys.executable, "-m", "hpcml", "observe", "hang", "--json", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    doc = json.loads(out.stdout)
    assert doc["schema"] == "hpcml.observe.hang/1"
    assert doc["roots"] == [9, 14] and doc["blocked"]["8"] == [9, 14] and "0" not in doc["blocked"]
    assert doc["summary"].startswith("roots: ranks 9, 14;")


def test_one_group_hang_roots_are_its_culprits(tmp_path):
    ranks = fr.job()
    _pending_world_collectives(ranks, stuck=(9, 14), level=45264)
    rep = analyse(fr.write(tmp_path, ranks))
    assert (rep.roots, rep.blocked, rep.cycles) == ([9, 14], {}, [])
    assert rep.summary() == "roots: ranks 9, 14"


def _waits(ranks, pg: str, behind: tuple[int, ...], level: int) -> None:
    """In group ``pg``, the members outside ``behind`` enqueued and started collective
    ``level + 1``; ``behind`` completed ``level`` and no more."""
    for r in fr.GROUPS[pg][1]:
        if r in behind:
            ranks[r].status[pg] = (level, level, level)
        else:
            ranks[r].status[pg] = (level + 1, level + 1, level)
            ranks[r].entries.append(fr.entry(level + 1, pg=pg, state="started"))


def test_a_chain_of_waits_across_groups_ends_at_its_root(tmp_path):
    """0, 1 and 5 are behind on the default group; 0 waits in tp group [0-3] for 1, which
    waits in dp group [1, 5, 9, 13] for 5: 5 is the root, 0 and 1 wait for it."""
    ranks = fr.job()
    _waits(ranks, "0", behind=(0, 1, 5), level=700)
    _waits(ranks, "1", behind=(1,), level=80)
    _waits(ranks, "6", behind=(5,), level=90)
    rep = analyse(fr.write(tmp_path, ranks))
    assert {f.pg: f.culprits for f in rep.findings} == {"0 (default_pg)": [0, 1, 5], "1 (tp)": [1], "6 (dp)": [5]}
    assert (rep.roots, rep.blocked, rep.cycles) == ([5], {0: [5], 1: [5]}, [])
    assert rep.summary() == "roots: rank 5; ranks 0, 1 blocked behind 5"


def test_ranks_waiting_for_each_other_are_both_roots_and_the_cycle_is_named(tmp_path):
    """0 waits in tp group [0-3] for 1; 1 waits in the default group for 0 (the two issued
    their collectives on the two groups in a different order)."""
    ranks = fr.job()
    _waits(ranks, "0", behind=(0,), level=700)
    _waits(ranks, "1", behind=(1,), level=80)
    rep = analyse(fr.write(tmp_path, ranks))
    assert (rep.roots, rep.blocked, rep.cycles) == ([0, 1], {}, [[0, 1]])
    assert "ranks 0, 1 wait for each other" in rep.summary()


@pytest.mark.torch
def test_real_gloo_pending_only_dumps(tmp_path):
    """Three real ranks on gloo with a subgroup, dumped with onlyActive=True: rank 2 never
    enters the fourth world all-reduce. Gloo writes pg_status but a placeholder pg_config."""
    needs.module("torch")
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys, time, torch, torch.distributed as dist
        import torch._C._distributed_c10d as c10d
        rank = int(sys.argv[1])
        dist.init_process_group("gloo", init_method="file://{tmp_path}/store", rank=rank, world_size=3)
        sub = dist.new_group([0, 1])
        t = torch.ones(4)
        for _ in range(3):
            dist.all_reduce(t)
        if rank in (0, 1):
            dist.all_reduce(t, group=sub)
            dist.all_reduce(t, async_op=True)
        time.sleep(0.5)
        open("{tmp_path}/dumps/rank_" + str(rank), "wb").write(c10d._dump_fr_trace(onlyActive=True))
        os._exit(0)
    """))
    (tmp_path / "dumps").mkdir()
    env = {"TORCH_FR_BUFFER_SIZE": "100", "PATH": "/usr/bin:/bin"}
    procs = [subprocess.Popen([sys.executable, str(script), str(r)], env=env) for r in range(3)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    rep = analyse(tmp_path / "dumps")
    assert not rep.refused and rep.missing == []
    assert [(f.kind, f.seq, f.culprits) for f in rep.findings] == [("never-entered", 4, [2])]
