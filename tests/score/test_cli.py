"""``hpcml score`` from the command line: report, import, bad input and the selftest's
judgement (the workloads need a GPU and DCGM to be scored; here they run on the CPU only
to prove they start and finish)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hpcml.score.archive import write_store
from hpcml.score.report import build
from hpcml.score.selftest import judge
from tests import needs

from . import synth


def _hpcml(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcml", "score", *args], capture_output=True, text=True,
                          timeout=300, **kw)


@pytest.fixture(scope="module")
def job_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("score") / "job"
    write_store(synth.recording(), d)
    return d


def test_report_of_a_job_dir_matches_the_in_memory_score(job_dir):
    p = _hpcml("report", str(job_dir), "--json", "--no-html")
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    direct = build(synth.recording())
    assert rep["score"] == direct["score"] and rep["bound"] == "compute"
    assert rep["gpus"] == 8 and rep["nodes"] == 2
    assert [g["gpu"] for g in rep["per_gpu"]] == [g["gpu"] for g in direct["per_gpu"]]
    assert any("nid00001:3" in f for f in rep["findings"])          # the lagging GPU is named
    assert any("nid00000:1" in f for f in rep["findings"])          # the GPU that dropped out


def test_terminal_summary_leads_with_score_and_top_finding(job_dir, tmp_path):
    out = tmp_path / "r.html"
    p = _hpcml("report", str(job_dir), "--html", str(out), env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("GPU saturation score 0.70 (compute-bound) — 8 GPUs on 2 nodes")
    assert any(line.startswith("  compute") and "0.70" in line for line in lines)
    assert any(line.startswith("→ GPUs well below the job's median score") for line in lines)
    assert out.exists() and out.stat().st_size > 10_000


def test_import_then_refuse_a_non_empty_target(job_dir, tmp_path):
    src = tmp_path / "copy"
    p = _hpcml("import", str(job_dir), "--dir", str(src))
    assert p.returncode == 0, p.stderr
    assert "8 GPUs on 2 nodes" in p.stdout
    again = _hpcml("import", str(job_dir), "--dir", str(src))
    assert again.returncode == 2 and again.stderr.count("\n") == 1
    assert "not an empty directory" in again.stderr


@pytest.mark.parametrize("content, why", [(b"hello world\n", "format"), (b"\x00\x01\x02" * 100, "format")])
def test_unknown_format_is_one_line_and_exit_2(tmp_path, content, why):
    f = tmp_path / "mystery.txt"
    f.write_bytes(content)
    p = _hpcml("report", str(f), "--no-html")
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.count("\n") == 1 and str(f) in p.stderr and why in p.stderr
    assert "Traceback" not in p.stderr


def test_missing_path_and_bad_option(tmp_path):
    p = _hpcml("report", str(tmp_path / "nope"), "--no-html")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "nope" in p.stderr
    q = _hpcml("record", "--gpu-metrics", "cuda", "--", "true")
    assert q.returncode == 2 and "--gpu-metrics" in q.stderr


def _rep(bound, compute, memory, temporal=False):
    return {"temporal_only": temporal, "bound": bound,
            "breakdown": {"compute": compute, "memory": memory, "interconnect": 0.01}}


def test_selftest_judgement():
    assert judge(_rep("compute", 0.8, 0.2), _rep("memory", 0.05, 0.9)) == []
    wrong = judge(_rep("memory", 0.4, 0.5), _rep("memory", 0.05, 0.9))
    assert wrong == ["compute-bound: classified memory-bound, expected compute-bound"]
    assert judge(_rep("compute", 0.5, 0.4), _rep("memory", 0.45, 0.6)) == [
        "compute part does not separate the workloads: 0.50 vs 0.45"]
    assert "only NVML" in judge(_rep(None, None, None, True), _rep("memory", 0.0, 0.9))[0]


def test_selftest_without_gpu_says_so_and_exits_2():
    needs.module("torch")
    p = _hpcml("selftest", "--seconds", "1")
    assert p.returncode == 2 and "no CUDA GPU" in p.stderr and p.stderr.count("\n") == 1


@pytest.mark.parametrize("kind", ["compute", "memory"])
def test_workloads_run_on_cpu(kind):
    needs.module("torch")
    p = subprocess.run([sys.executable, "-m", "hpcml.score.workloads", kind, "--seconds", "0.3",
                        "--device", "cpu"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"{kind}: ") and " iterations " in p.stdout


def test_a_hostile_hostname_in_a_scrape_is_printed_as_text(tmp_path):
    """dcgm-exporter's ``Hostname`` label is the node's word: Rich markup in it ended the
    report with a traceback, an escape sequence reached the terminal (the finding names
    the node of the GPU well below the median)."""
    host = "nid[/x]\x1b]0;PWNED\x07\x1b[2J"
    labels = 'gpu="{g}",UUID="GPU-{g}",modelName="NVIDIA H100 80GB HBM3",Hostname="HOST"'.replace("HOST", host)
    lines = []
    for _ in range(20):
        for g in range(4):
            sm, te, dr = (0.9, 0.6, 0.3) if g else (0.2, 0.05, 0.05)
            lines += [f"DCGM_FI_PROF_SM_ACTIVE{{{labels.format(g=g)}}} {sm}",
                      f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{labels.format(g=g)}}} {te}",
                      f"DCGM_FI_PROF_DRAM_ACTIVE{{{labels.format(g=g)}}} {dr}"]
    (tmp_path / "s.prom").write_text("\n".join(lines) + "\n")
    p = _hpcml("report", str(tmp_path / "s.prom"), "--no-html", env={**os.environ, "FORCE_COLOR": "1"})
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    assert "nid[/x]" in p.stdout and "\x1b]0;" not in p.stdout and "\x1b[2J" not in p.stdout, p.stdout
