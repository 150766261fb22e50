"""hpcml.run.earlyvet: --vet's workers started before the launcher's imports, only where the
launcher would start them itself. Starting them for real (and a run that ends up not vetting
leaving none running) is tested on the local Slurm cluster in test_run_slurm.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hpcml.run import earlyvet
from hpcml.run.config import Options


def _opts(vet: str | None) -> Options:
    return Options(cmd=["true"], vet=Path(vet) if vet else None)


@pytest.fixture
def allocation(monkeypatch, tmp_path):
    """Slurm's variables of a 2-node allocation, outside any step; no srun is started
    (``start_workers`` is replaced: the cases below must decide before it would run)."""
    for k in ("SLURM_STEP_ID", "HPCML_RUN_BACKEND", "HPCML_RUN_LOCAL", "HPCML_FARM_DIR"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    started: list[list[str]] = []

    class Told:
        """What the workers' stdin would get (``launch.Step.send``)."""
        protocol = None
        sent: dict | None = None

        def send(self, spec):
            self.sent = spec

    def fake(nodes, python=None, *, use_srun=True, preload=()):
        started.append(list(nodes))
        return Told()
    monkeypatch.setattr("hpcml.vet.launch.start_workers", fake)
    proto = tmp_path / "p.yaml"
    proto.write_text("name: p\nevals: [{name: m, type: memory}]\n")
    return started, proto


def test_started_on_every_node_of_an_allocation(allocation) -> None:
    started, proto = allocation
    before = time.time()
    early = earlyvet.start(_opts(str(proto)))
    assert early is not None and early.nodes == ("n1", "n2") and started == [["n1", "n2"]]
    told = early.step.sent             # hpcml's own checks only: their spec went at once
    assert told["nodes"] == ["n1", "n2"] and [e["name"] for e in told["evals"]] == ["m"]
    assert told["deadline_at"] >= before + early.step.protocol.deadline - 1
    assert told["workdir"] == str(Path("hpcml-run-7") / "vet" / "work")


def test_a_sites_check_waits_for_the_launcher(allocation, tmp_path) -> None:
    """A check from outside hpcml may use the run's directory, which the launcher makes: the
    workers start, and get their spec from the launcher."""
    started, _ = allocation
    proto = tmp_path / "site.yaml"
    proto.write_text("name: p\nevals: [{name: m, type: memory}, {name: v, type: tests.plugins.testchecks.Value, "
                     "value: 1}]\n")
    early = earlyvet.start(_opts(str(proto)))
    assert early is not None and started == [["n1", "n2"]] and early.step.sent is None


def test_a_protocol_that_does_not_validate_is_left_to_the_launcher(allocation, tmp_path) -> None:
    started, _ = allocation
    proto = tmp_path / "bad.yaml"
    proto.write_text("name: p\ncolour: blue\nevals: [{name: m, type: memory}]\n")
    early = earlyvet.start(_opts(str(proto)))
    assert early is not None and early.step.sent is None and early.step.protocol is None


@pytest.mark.parametrize("case", ["no vet", "auto", "auto:file", "missing file", "in a step", "local", "backend",
                                  "no allocation"])
def test_not_started_where_the_launcher_would_not_vet_through_srun(allocation, monkeypatch, case) -> None:
    started, proto = allocation
    vet = {"no vet": None, "auto": "auto", "auto:file": f"auto:{proto}", "missing file": str(proto) + ".gone"}.get(
        case, str(proto))
    if case == "in a step":
        monkeypatch.setenv("SLURM_STEP_ID", "0")
    if case == "local":
        monkeypatch.setenv("HPCML_RUN_LOCAL", "1")
    if case == "backend":
        monkeypatch.setenv("HPCML_RUN_BACKEND", "site")
    if case == "no allocation":
        monkeypatch.delenv("SLURM_JOB_ID")
    assert earlyvet.start(_opts(vet)) is None and started == []
