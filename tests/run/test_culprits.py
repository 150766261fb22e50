"""Naming a hang's culprits from heartbeats and stacks (``hpcml.run.culprits``)."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

from hpcml.observe.beat import Beat
from hpcml.observe.hang import Finding, HangReport
from hpcml.observe.stacks import Stack
from hpcml.run.culprits import in_collective, name, stack_line

LIB = sysconfig.get_path("purelib")
PYSPY = Path(__file__).parents[1] / "fixtures" / "pyspy"


def stack(*frames: tuple[str, int, str]) -> Stack:
    return Stack.of({"threads": [{"main": False, "frames": [{"name": "_loop", "file": f"{LIB}/x.py", "line": 1}]},
                                 {"main": True, "frames": [{"name": n, "file": f, "line": ln} for f, ln, n in frames]}]})


def real(name: str) -> Stack:
    """A real py-spy dump (tests/fixtures/pyspy) as the rank's stack file has it."""
    raw = json.loads((PYSPY / f"pyspy-0.4.3-{name}.json").read_text())
    return Stack.of(json.loads(json.dumps(Stack.of_py_spy(raw, raw[0]["pid"]).to_json())))


WAITING = stack((f"{LIB}/torch/distributed/distributed_c10d.py", 2800, "all_reduce"), ("/home/u/train.py", 40, "main"))
SLEEPING = stack(("/home/u/train.py", 37, "main"))
LOADING = stack(("/home/u/data.py", 12, "__getitem__"), (f"{LIB}/torch/utils/data/dataloader.py", 700, "__next__"),
                ("/home/u/train.py", 30, "main"))


def beats(steps: dict[int, int | None]) -> dict[int, Beat]:
    return {r: Beat(rank=r, node=f"n{r // 4}", step=s) for r, s in steps.items()}


def test_the_main_threads_own_innermost_line_is_named():
    assert stack_line(LOADING) == "/home/u/data.py:12 in __getitem__"
    assert stack_line(WAITING) == "/home/u/train.py:40 in main"
    assert in_collective(WAITING) and in_collective(LOADING) is False and in_collective(Stack.of({})) is None
    assert in_collective(None) is None and stack_line(None) is None


def test_a_stack_s_names_are_printed_as_text_not_terminal_escapes():
    """A stack file's function and file names are the job's program's: the culprit's line
    shows an escape as text, never a faked launcher line or a cleared screen."""
    odd = stack(("/home/u/train.py", 7, "main\x1b]0;owned\x07\x1b[2K\rhpcml run: hang: culprit rank 3 on nid0042"))
    where = stack_line(odd)
    assert where is not None and "\x1b" not in where and "\r" not in where and where.startswith("/home/u/train.py:7 in main")


def test_real_py_spy_stacks_name_the_rank_and_its_own_line():
    """py-spy's own dumps: the rank in the user's data loader is the culprit, on the line it is
    stuck on (not its heartbeat thread's, which py-spy lists first); the one in all_reduce waits."""
    waiting, loading = real("waiting"), real("loading")
    assert stack_line(waiting) == "/tmp/job/home/u/train.py:22 in main" and in_collective(waiting)
    assert stack_line(loading) == "/tmp/job/home/u/data.py:8 in Shards.__getitem__" and in_collective(loading) is False
    v = name(beats({0: 2, 1: 2, 2: 2}), {0: waiting, 1: loading, 2: waiting})
    assert v.method == "stacks" and v.blocked == [0, 2]
    assert [(c.rank, c.where) for c in v.culprits] == [(1, "/tmp/job/home/u/data.py:8 in Shards.__getitem__")]


def test_the_flight_recorders_roots_come_first_with_their_finding():
    found = Finding(pg="0 (default_pg)", seq=7, kind="never-entered", culprits=[2], detail="never entered all_reduce #7")
    fr = HangReport(dumps={}, refused={}, missing=[], findings=[found], last_seq={}, roots=[2])
    v = name(beats({0: 9, 1: 9, 2: 9}), {0: WAITING, 1: WAITING, 2: WAITING}, fr)
    assert v.method == "flight-recorder" and v.blocked == [0, 1]
    assert [(c.rank, c.why, c.where) for c in v.culprits] == [(2, "never entered all_reduce #7", "/home/u/train.py:40 in main")]
    v = name(beats({0: 9, 1: 9, 2: 9}), {}, HangReport(dumps={}, refused={}, missing=[], findings=[found], last_seq={}))
    assert [c.rank for c in v.culprits] == [2]                  # no roots: the findings' culprits


def test_nccl_dumps_of_every_rank_that_name_no_root_leave_the_host_side_rules_unasked():
    """NCCL: every rank dumped and the Flight Recorder names no root (every rank started the
    collective on its GPU: a network or GPU fault). Rank 0's CPU is a step behind only for
    its ``loss.item()``, which blocked first: no culprit is named from the host's view (was:
    rank 0 "behind"). The same from gloo, whose collectives run on the host, still asks it."""
    paths = {r: Path(f"/fr/rank_{r}") for r in range(3)}
    nccl = HangReport(dumps=paths, refused={}, missing=[], findings=[], last_seq={}, backends=["nccl"],
                      pending=[0, 1, 2])
    v = name(beats({0: 8, 1: 9, 2: 9}), {0: SLEEPING, 1: WAITING, 2: WAITING}, nccl)
    assert v.culprits == [] and v.method == "none" and "network or GPU fault" in v.note, v
    mismatch = Finding(pg="0 (default_pg)", seq=7, kind="mismatch", culprits=[], detail="sizes differ, no majority")
    odd = HangReport(dumps=paths, refused={}, missing=[], findings=[mismatch], last_seq={}, backends=["nccl"],
                     pending=[0, 1, 2])
    assert "network or GPU fault" not in name(beats({0: 9, 1: 9, 2: 9}), {}, odd).note      # a bug in the code
    # rank 0 with nothing pending on its GPU (stuck in host code, a store wait): the host's view names it
    idle = HangReport(dumps=paths, refused={}, missing=[], findings=[], last_seq={}, backends=["nccl"], pending=[1, 2])
    assert [c.rank for c in name(beats({0: 8, 1: 9, 2: 9}), {0: SLEEPING, 1: WAITING, 2: WAITING}, idle).culprits] == [0]
    gloo = HangReport(dumps=paths, refused={}, missing=[], findings=[], last_seq={}, backends=["gloo"],
                      pending=[0, 1, 2])
    v = name(beats({0: 8, 1: 9, 2: 9}), {0: SLEEPING, 1: WAITING, 2: WAITING}, gloo)
    assert v.method == "progress" and [c.rank for c in v.culprits] == [0]


def test_ranks_behind_in_steps_are_the_culprits():
    v = name(beats({0: 30, 1: 29, 2: 30, 3: 30}), {1: SLEEPING})
    assert v.method == "progress" and [c.rank for c in v.culprits] == [1] and v.blocked == [0, 2, 3]
    assert v.culprits[0].where == "/home/u/train.py:37 in main"


def test_ranks_that_log_no_steps_are_not_accused_by_progress():
    """Only rank 0 logs steps (a common script): the others are judged by their stacks."""
    v = name(beats({0: 30, 1: None, 2: None}), {0: WAITING, 1: WAITING, 2: LOADING})
    assert v.method == "stacks" and [c.rank for c in v.culprits] == [2] and v.blocked == [0, 1]


def test_at_the_same_step_the_rank_outside_a_collective_is_the_culprit():
    v = name(beats({r: 29 for r in range(8)}), {**{r: WAITING for r in range(8)}, 5: LOADING})
    assert v.method == "stacks" and [(c.rank, c.node) for c in v.culprits] == [(5, "n1")] and v.blocked == [0, 1, 2, 3, 4, 6, 7]


def test_no_culprit_is_invented():
    v = name(beats({0: 29, 1: 29}), {0: WAITING, 1: WAITING})
    assert v.culprits == [] and "every rank waits in a collective" in v.note
    v = name(beats({0: 29, 1: 29}), {0: WAITING})
    assert v.culprits == [] and "no stack from ranks 1" in v.note


def test_a_stack_with_a_hostile_path_names_the_rank_without_a_traceback():
    bad = stack(("/x/a\x00b", 3, "f"), ("/home/u/train.py", 9, "main"))
    v = name(beats({0: 29, 1: 29}), {0: WAITING, 1: bad})
    assert [c.rank for c in v.culprits] == [1] and v.culprits[0].where == "/home/u/train.py:9 in main"


def test_a_rank_still_running_after_the_others_ended_well_is_the_culprit():
    """Rank 1 hangs outside any collective after rank 0 finished with exit 0: nobody waits
    for it, and it is the one to look at (before, 'no rank waits in a collective')."""
    v = name(beats({1: 5}), {1: SLEEPING}, done=(0,))
    assert v.method == "progress" and [c.rank for c in v.culprits] == [1] and v.blocked == []
    assert "after rank 0 ended with exit 0" in v.culprits[0].why
    assert name(beats({1: 5}), {1: WAITING}, done=(0,)).culprits == []      # waits for a rank that left: not named
    assert name(beats({1: 5}), {1: SLEEPING}).culprits == []                # alone, no evidence against it
