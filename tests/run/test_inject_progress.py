"""Progress without a script change: ``hpcml run``'s sitecustomize (``hpcml.run.inject``)
makes every optimizer step of an unchanged script a step (``hpcml.observe.optimsteps``).

Real ``hpcml run`` in local mode, 2 ranks of a plain DDP loop over gloo that never imports
hpcml (tests/run/scripts/raw_ddp.py), real recorders, store, report and watch. The rules
themselves (nesting, several optimizers, a forked child): tests/observe/test_optimsteps.py.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import json
import sys
from pathlib import Path

import pytest

from hpcml.observe.beat import read_beats
from hpcml.observe.store import read_job
from hpcml.run.inject import sitecustomize as site
from hpcml.run.watch import HANG
from tests.run.test_watch import hpcml

SCRIPT = Path(__file__).with_name("scripts") / "raw_ddp.py"
PKG = "waitpkg"              # made in tmp_path by a test, imported by name


def step_sections(job: Path) -> dict[int, list[int]]:
    """Each rank's ``step`` section rows in the store: their step numbers, in order."""
    t = read_job(job / "observe").table.to_pydict()
    out: dict[int, list[int]] = {}
    for rank, kind, name, step in zip(t["rank"], t["kind"], t["name"], t["step"]):
        if kind == "section" and name == "step":
            out.setdefault(rank, []).append(step)
    return out


@pytest.mark.torch
def test_every_optimizer_step_of_a_plain_ddp_script_is_a_step(tmp_path):
    """8 optimizer steps of 3 micro-batches each, a second optimizer stepping every iteration,
    a DataLoader worker and a subprocess (which has the recorder's pipe) stepping their own:
    8 steps per rank, in the heartbeat, the store and the report, each as long as its iteration."""
    p = hpcml("run", "--ntasks", "2", "--dir", "job", "--", "python", SCRIPT, cwd=tmp_path,
              env={"STEPS": "8", "ACCUM": "3", "STEP_S": "0.1"})
    assert p.returncode == 0, p.stderr
    job = tmp_path / "job"
    assert step_sections(job) == {0: list(range(1, 9)), 1: list(range(1, 9))}
    beats = read_beats(job / "observe")
    assert [(b.step, b.steps, b.recent_steps) for _, b in sorted(beats.items())] == [(8, 8, list(range(1, 9)))] * 2
    assert all(min(b.recent_s[1:]) >= 0.1 for b in beats.values())      # the iteration, not step() alone
    run = json.loads((job / "run.json").read_text())
    assert run["furthest_step"] == 8 and run["exit_code"] == 0
    rep = json.loads(hpcml("report", "job", "--json", cwd=tmp_path).stdout)["observe"]
    assert rep["straggler_check"]["steps"] == 8 and rep["sections"]["step"]["total_s"] >= 2 * 7 * 0.1
    assert rep["progress"]["steps"] == {**rep["progress"]["steps"], "rank": 0, "count": 8, "fewest": 8, "most": 8}
    lines = hpcml("report", "job", cwd=tmp_path).stdout.splitlines()
    assert lines[2].startswith("  time: ") and "  did: 8 steps (rank 0)" in lines[3]   # where the time went leads
    assert rep["throughput"]["source"] == "section" and rep["throughput"]["median"] > 0


STUCK_AFTER = 45              # steps of 0.1 s compute (0.2 s on the slow rank): 30 judged, 5 s of them


def slow_then_stuck_rank_1_named(tmp_path: Path, script: Path, **env: str) -> None:
    """``hpcml run`` of ``script``, 2 ranks over gloo, rank 1 computing twice as long as rank 0
    (a slow node: its data or its forward, before DDP's all-reduce, where rank 0 then waits)
    and then stuck after ``STUCK_AFTER`` steps. Live, rank 1 is named a straggler about 2x
    before the hang; the hang is stopped (exit HANG), rank 1 named on the script's ``#
    culprit`` line, rank 0 blocked behind it; run.json and the end report say both, the
    report's factor measured on compute (the step less its wait in collectives)."""
    from hpcml.run.report import build
    p = hpcml("run", "--ntasks", "2", "--dir", "job", "--no-report", "--hang-timeout", "3s", "--kill-grace", "3",
              "--straggler-window", "5s", "--", "python", script, cwd=tmp_path,
              env={"STEPS": "1000", "STUCK_RANK": "1", "STUCK_AFTER": str(STUCK_AFTER), "SLOW_RANK": "1",
                   "STEP_S": "0.1", **env})
    assert p.returncode == HANG, p.stderr
    run = json.loads((tmp_path / "job" / "run.json").read_text())
    hang = run["hang"]
    assert run["exit_code"] == HANG and hang["action"] == "stop" and run["furthest_step"] == STUCK_AFTER
    assert [c["rank"] for c in hang["verdict"]["culprits"]] == [1] and hang["verdict"]["blocked"] == [0]
    line = next(i for i, t in enumerate(script.read_text().splitlines(), 1) if t.endswith("# culprit"))
    assert hang["verdict"]["culprits"][0]["where"].startswith(f"{script}:{line} in ")
    assert [e["kind"] for e in run["timeline"]] == ["straggler", "hang"], p.stderr
    live = run["stragglers"]
    assert [s["rank"] for s in live] == [1] and 1.6 <= live[0]["score"] <= 2.3, live
    assert "hpcml run: straggler: rank 1 on " in p.stderr
    rep = build(tmp_path / "job")["observe"]
    assert rep["straggler_check"]["measure"] == "compute" and rep["straggler_check"]["judged"], rep["straggler_check"]
    assert [s["rank"] for s in rep["stragglers"]] == [1] and 1.6 <= rep["stragglers"][0]["score"] <= 2.3
    assert rep["throughput"]["source"] == "section" and rep["throughput"]["median"] > 0     # steps/s of its steps


@pytest.mark.machine     # a live straggler verdict: other tests' load is rightly named contention instead (scripts/test)
@pytest.mark.torch
def test_a_slow_then_stuck_rank_of_a_plain_script_is_named_straggler_then_culprit(tmp_path):
    slow_then_stuck_rank_1_named(tmp_path, SCRIPT)
    steps = list(range(1, STUCK_AFTER + 1))
    assert step_sections(tmp_path / "job") == {0: steps, 1: steps}


@pytest.mark.torch
def test_a_script_that_logs_its_own_steps_keeps_them(tmp_path):
    p = hpcml("run", "--ntasks", "2", "--dir", "job", "--no-report", "--", "python", SCRIPT, cwd=tmp_path,
              env={"STEPS": "5", "OWN": "1"})
    assert p.returncode == 0, p.stderr
    assert step_sections(tmp_path / "job") == {0: list(range(1000, 1005)), 1: list(range(1000, 1005))}


def test_a_rank_that_never_imports_torch_pays_no_torch_import(tmp_path):
    code = ("import sys\nprint(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))\n"
            "print([type(f).__name__ for f in sys.meta_path])\n")
    p = hpcml("run", "--ntasks", "1", "--dir", "job", "--no-report", "--", "python", "-c", code, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    loaded, finders = (tmp_path / "job" / "logs" / "rank-00000.out").read_text().splitlines()[:2]
    assert loaded == "[]" and finders.startswith("['_OnImport'")       # waiting for torch.optim, importing nothing


@pytest.fixture
def importable(tmp_path, monkeypatch):
    """A package ``waitpkg`` with a module ``waitpkg.optim``, importable from tmp_path."""
    (tmp_path / "waitpkg").mkdir()
    (tmp_path / "waitpkg" / "__init__.py").write_text("")
    (tmp_path / "waitpkg" / "optim.py").write_text("RAN = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in ("waitpkg.optim", "waitpkg"):
        sys.modules.pop(name, None)


def test_the_finder_calls_back_once_the_module_ran_and_leaves(importable):
    calls = []
    finder = site._OnImport("waitpkg.optim", lambda: calls.append(sys.modules["waitpkg.optim"].RAN))
    sys.meta_path.insert(0, finder)
    try:
        importlib.import_module(PKG)
        assert calls == [] and finder in sys.meta_path
        optim = importlib.import_module(f"{PKG}.optim")
        assert calls == [True] and finder not in sys.meta_path
        assert "exec_module" not in vars(optim.__spec__.loader)        # the loader's own again
        assert optim.__spec__.loader.get_source("waitpkg.optim") == "RAN = True\n"
    finally:
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)


def test_a_loader_that_cannot_be_patched_is_wrapped(importable):
    class Slotted:                                         # no __dict__: exec_module cannot be replaced
        __slots__ = ("inner",)

        def __init__(self, inner) -> None:
            self.inner = inner

        def create_module(self, spec):
            return None

        def exec_module(self, module) -> None:
            self.inner.exec_module(module)

        def get_source(self, name: str) -> str:
            return self.inner.get_source(name)

    class Finder:
        def find_spec(self, name, path=None, target=None):
            spec = importlib.machinery.PathFinder.find_spec(name, path, target)
            if spec is not None and name == "waitpkg.optim":
                spec.loader = Slotted(spec.loader)
            return spec
    calls = []
    other = Finder()
    sys.meta_path.insert(0, other)
    sys.meta_path.insert(0, site._OnImport("waitpkg.optim", lambda: calls.append(1)))
    try:
        optim = importlib.import_module(f"{PKG}.optim")
        assert calls == [1] and optim.RAN and isinstance(optim.__spec__.loader, site._Then)
        assert optim.__spec__.loader.get_source("waitpkg.optim") == "RAN = True\n"
    finally:
        sys.meta_path.remove(other)
