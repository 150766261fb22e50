"""``hpcml observe hang`` on pipeline-parallel jobs (issue 51): point-to-point entries are
paired per group and peer on their own numbering, never compared as collectives.

The synthetic dumps are built as torch's Flight Recorder writes them (the fields of
``torch.distributed.flight_recorder``'s entries: ``collective_seq_id`` and ``p2p_seq_id``,
``is_p2p``, ``nccl:send a->b`` / ``nccl:recv b<-a`` in the group's local ranks, pg_status
keyed by the rank's local group id and set from whichever operation came last). The real
ones are NVIDIA's nvidia-resiliency-ext fault-injection dumps of a 16-rank Megatron job
(``../shared/testdata/fr_nvrx``), whose faulty ranks the test reads from their own files.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path

from hpcml.observe.hang import analyse

# 8 ranks: tensor parallel 2 ([0, 1], [2, 3], [4, 5], [6, 7]), pipeline parallel 4 ([0, 2, 4, 6],
# [1, 3, 5, 7]). Group names as torch numbers them; the local ids below follow creation order.
GROUPS = {"0": ("default_pg", list(range(8))),
          "1": ("TENSOR_MODEL_PARALLEL_GROUP", [0, 1]), "2": ("TENSOR_MODEL_PARALLEL_GROUP", [2, 3]),
          "3": ("TENSOR_MODEL_PARALLEL_GROUP", [4, 5]), "4": ("TENSOR_MODEL_PARALLEL_GROUP", [6, 7]),
          "5": ("PIPELINE_MODEL_PARALLEL_GROUP", [0, 2, 4, 6]), "6": ("PIPELINE_MODEL_PARALLEL_GROUP", [1, 3, 5, 7])}
TP_LEVEL = 50            # collectives every tensor-parallel group completed
PP_COLLECTIVES = 3       # collectives the pipeline groups ran (at start-up)


def _mine(rank: int) -> list[str]:
    return [name for name, (_, ranks) in GROUPS.items() if rank in ranks]


def _tp(rank: int) -> str:
    return next(n for n in _mine(rank) if GROUPS[n][0].startswith("TENSOR"))


def _pp(rank: int) -> str:
    return next(n for n in _mine(rank) if GROUPS[n][0].startswith("PIPELINE"))


def _stage(rank: int) -> int:
    return GROUPS[_pp(rank)][1].index(rank)


def _p2p_count(rank: int) -> int:
    """Sends and receives a stage posted in the steps that completed: the first and the last
    stage talk to one neighbour, the others to two."""
    return 100 if _stage(rank) in (0, 3) else 200


def _entry(rank: int, record: int, pg: str, name: str, *, coll: int, p2p: int = 0, is_p2p: bool = False,
           size: tuple[int, ...] = (4096, 1, 5120)) -> dict:
    return {"record_id": record, "pg_id": _mine(rank).index(pg), "process_group": (pg, GROUPS[pg][0]),
            "thread_name": "pt_main_thread", "thread_id": "1", "collective_seq_id": coll, "p2p_seq_id": p2p,
            "op_id": coll + p2p, "profiling_name": f"nccl:{name}", "time_created_ns": 1_000_000 + record,
            "input_sizes": [list(size)], "input_dtypes": ["BFloat16"], "output_sizes": [list(size)],
            "output_dtypes": ["BFloat16"], "state": "scheduled", "time_discovered_started_ns": None,
            "time_discovered_completed_ns": None, "retired": False, "timeout_ms": 600000, "is_p2p": is_p2p,
            "frames": []}


def _send(rank: int, record: int, to_stage: int, n: int) -> dict:
    pg = _pp(rank)
    return _entry(rank, record, pg, f"send {_stage(rank)}->{to_stage}", coll=PP_COLLECTIVES,
                  p2p=_p2p_count(rank) + n, is_p2p=True)


def _recv(rank: int, record: int, from_stage: int, n: int) -> dict:
    pg = _pp(rank)
    return _entry(rank, record, pg, f"recv {_stage(rank)}<-{from_stage}", coll=PP_COLLECTIVES,
                  p2p=_p2p_count(rank) + n, is_p2p=True)


def _status(rank: int, tp_enqueued: int, p2p_enqueued: int) -> dict:
    """pg_status as torch keeps it: per local id, from the last operation of any kind."""
    out = {}
    for local, pg in enumerate(_mine(rank)):
        if pg == _tp(rank):
            enq, done = tp_enqueued, TP_LEVEL
        elif pg == _pp(rank):
            enq, done = p2p_enqueued, _p2p_count(rank)          # a p2p_seq_id, not a collective's
        else:
            enq = done = 7
        out[str(local)] = {"last_enqueued_collective": enq, "last_started_collective": -1,
                           "last_completed_collective": done}
    return out


def _write(d: Path, entries: dict[int, list[dict]], tp_enqueued: dict[int, int]) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    config = {name: {"name": name, "desc": desc, "ranks": str(ranks)} for name, (desc, ranks) in GROUPS.items()}
    for rank in range(8):
        mine = entries.get(rank, [])
        p2p = max([e["p2p_seq_id"] for e in mine if e["is_p2p"]], default=_p2p_count(rank))
        dump = {"version": "2.9", "nccl_version": "2.27.3", "pg_config": config, "entries": mine,
                "pg_status": _status(rank, tp_enqueued.get(rank, TP_LEVEL), p2p)}
        (d / f"_dump_{rank}").write_bytes(pickle.dumps(dump))
    return d


def _all_reduce(rank: int, record: int, seq: int) -> dict:
    return _entry(rank, record, _tp(rank), "all_reduce", coll=seq, size=(120,))


def test_pipeline_stages_posting_fewer_p2p_are_not_behind(tmp_path):
    """A healthy moment: every stage waits in its next send or receive, paired with its
    neighbour's; the first and last stages have posted fewer of them. No finding at all."""
    entries: dict[int, list[dict]] = {}
    for first, second, third, fourth in ([0, 2, 4, 6], [1, 3, 5, 7]):
        entries[first] = [_send(first, 1, 1, 1)]
        entries[second] = [_recv(second, 1, 0, 1), _send(second, 2, 2, 2)]
        entries[third] = [_recv(third, 1, 1, 1), _send(third, 2, 3, 2)]
        entries[fourth] = [_recv(fourth, 1, 2, 1)]
    rep = analyse(_write(tmp_path / "fr", entries, {}))
    assert rep.findings == [] and rep.roots == []


def test_a_rank_stuck_before_a_tp_collective_is_the_root_not_the_pipeline_ends(tmp_path):
    """Rank 5 (stage 2) hangs before its tensor-parallel all_reduce #51: rank 4 waits in it,
    rank 7 (last stage) waits in a receive rank 5 never posted, and rank 6 in one from
    rank 4, which is stuck in the all_reduce. pg_status of the pipeline groups holds p2p
    numbers (100 on the end stages, 200 inside): compared as collectives they made the end
    stages look behind. The root is rank 5 alone; ranks 4, 6 and 7 wait."""
    entries = {
        0: [_send(0, 1, 1, 1)], 1: [_send(1, 1, 1, 1)],
        2: [_recv(2, 1, 0, 1), _send(2, 2, 2, 2)], 3: [_recv(3, 1, 0, 1), _send(3, 2, 2, 2)],
        4: [_recv(4, 1, 1, 1), _all_reduce(4, 2, TP_LEVEL + 1), _send(4, 3, 3, 2)],
        5: [_recv(5, 1, 1, 1)],
        6: [_recv(6, 1, 2, 1)], 7: [_recv(7, 1, 2, 1)],
    }
    rep = analyse(_write(tmp_path / "fr", entries, {4: TP_LEVEL + 1, 5: TP_LEVEL}))
    assert rep.roots == [5]
    tp = [f for f in rep.findings if f.kind == "never-entered"]
    assert [(f.pg, f.culprits, f.waiting, f.late) for f in tp] == [
        ("3 (TENSOR_MODEL_PARALLEL_GROUP)", [5], [4], [5])]
    p2p = sorted((f.waiting, f.late) for f in rep.findings if f.kind == "p2p-unmatched")
    assert p2p == [([7], [5])]      # rank 6's receive from 4 sits behind 4's pending all_reduce
    assert not any(f.pg.startswith(("5 ", "6 ")) and f.kind != "p2p-unmatched" for f in rep.findings)
    assert "rank 7 waits in a receive from rank 5" in rep.findings[-1].detail


# -- NVIDIA's fault-injection dumps ------------------------------------------------------------------

def _reference(path: Path) -> set[int]:
    """The ranks in the ``Missing Ranks`` column of NVRx's own analyser output."""
    out: set[int] = set()
    lines = path.read_text().splitlines()
    head = [c.strip() for c in lines[0].split("|")]
    col = head.index("Missing Ranks")
    for line in lines[1:]:
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > col and cells[col]:
            out |= {int(r) for r in cells[col].split(",")}
    return out


def _injected(log: Path) -> set[int]:
    m = re.search(r"Fault ranks:\s*\[([^\]]*)\]", log.read_text())
    assert m, log
    return {int(r) for r in m.group(1).split(",")}


def test_a_receive_without_its_p2p_number_is_numbered_unknown_not_0(tmp_path):
    """A torch whose entries carry no ``p2p_seq_id``: the unmatched receive's number is
    unknown (None in ``--json``, "#?" in the text), not "#0"."""
    import subprocess
    import sys
    entries = {0: [_send(0, 1, 1, 1)], 1: [_send(1, 1, 1, 1)],
               2: [_recv(2, 1, 0, 1), _send(2, 2, 2, 2)], 3: [_recv(3, 1, 0, 1), _send(3, 2, 2, 2)],
               4: [_recv(4, 1, 1, 1), _all_reduce(4, 2, TP_LEVEL + 1), _send(4, 3, 3, 2)],
               5: [_recv(5, 1, 1, 1)], 6: [_recv(6, 1, 2, 1)], 7: [_recv(7, 1, 2, 1)]}
    d = _write(tmp_path / "fr", entries, {4: TP_LEVEL + 1, 5: TP_LEVEL})
    for f in d.iterdir():
        dump = pickle.loads(f.read_bytes())
        for e in dump["entries"]:
            e.pop("p2p_seq_id")
        f.write_bytes(pickle.dumps(dump))
    rep = analyse(d)
    p2p = [f for f in rep.findings if f.kind == "p2p-unmatched"]
    assert p2p and all(f.seq is None for f in p2p), [(f.kind, f.seq) for f in rep.findings]
    out = subprocess.run([sys.executable, "-m", "hpcml", "observe", "hang", str(tmp_path / "fr")],
                         capture_output=True, text=True, timeout=60).stdout
    assert "point-to-point #?" in out and "point-to-point #0" not in out, out


def test_roots_of_nvidia_fault_injection_dumps_are_the_faulty_ranks():
    """Each set: 16 ranks of a Megatron job (tensor, expert and pipeline parallel) with
    faults injected. The roots are what NVRx's own analyser names, all of them ranks the
    fault log injected (gpu_error_1st injects 12 and 14, but 14's fault left no trace: it
    waits for 12 in every group, as NVRx's analyser also finds)."""
    from tests import needs
    base = needs.shared_testdata("fr_nvrx")
    sets = sorted(p for p in base.iterdir() if p.is_dir())
    assert len(sets) == 4
    for d in sets:
        expected = _reference(base / f"{d.name}_reference.txt")
        rep = analyse(d)
        assert not rep.refused and not rep.missing, d.name
        assert set(rep.roots) == expected, (d.name, rep.roots, rep.summary())
        assert expected <= _injected(d / "fault_injection.log"), d.name
        for f in rep.findings:       # pipeline groups never judged on p2p counts
            if f.pg.endswith("(PIPELINE_MODEL_PARALLEL_GROUP)"):
                assert f.kind == "p2p-unmatched", (d.name, f.pg, f.kind, f.detail)
