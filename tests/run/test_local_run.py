"""``hpcml run`` outside Slurm (local tasks) and ``hpcml report``: the README's main job.

Real processes, real torch.distributed (gloo on CPU), the real vet protocol, the real
observe store; the HTML report renders in headless Chromium.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from hpcml import schemas
from hpcml.observe.beat import beat_path
from tests.observe.browser import assert_not_blank, render

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "run" / "train_ddp.py"
CPU = ROOT / "examples" / "vet" / "cpu.yaml"
SECTIONS = ("run-job", "run-findings", "run-vet", "run-env", "run-ending", "run-watch", "run-observe", "run-score")


def hpcml(*args, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    return subprocess.run([sys.executable, "-m", "hpcml", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=timeout)


def valid(doc: dict, name: str) -> dict:
    jsonschema.validate(doc, schemas.load(name), cls=jsonschema.Draft202012Validator)
    return doc


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    tmp = tmp_path_factory.mktemp("run")
    p = hpcml("run", "--ntasks", "2", "--vet", CPU, "--dir", "job", "--", "python", EXAMPLE,
              "--data", tmp / "data", "--samples", "512", "--epochs", "2", cwd=tmp)
    return tmp / "job", p


@pytest.mark.torch
def test_example_trains_with_ddp_on_two_local_ranks(trained):
    d, p = trained
    assert p.returncode == 0, p.stderr
    assert "trained 8 steps on 2 ranks" in (d / "logs" / "rank-00000.out").read_text()
    run = valid(json.loads((d / "run.json").read_text()), "run")
    assert run["mode"] == "local" and run["ntasks"] == 2 and run["exit_code"] == 0
    assert run["vet"]["decision"] == "continue" and run["master"].startswith("127.0.0.1:")
    assert (d / "vet" / "report.json").is_file() and (d / "observe" / "rank-00001.arrows").is_file()
    assert "vet: continue" in p.stdout and f"html: {d.name}/report.html" in p.stdout      # the report, at the end
    assert (d / "report.html").stat().st_size > 10_000


@pytest.mark.torch
def test_report_of_the_example_is_complete(trained, tmp_path):
    d, _ = trained
    p = hpcml("report", d, "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    rep = valid(json.loads(p.stdout), "run.report")
    assert rep["vet"]["decision"] == "continue" and rep["ending"]["exit_code"] == 0
    assert rep["ending"]["first_failure"] is None
    obs = rep["observe"]
    assert obs["ranks_with_data"] == 2 and obs["throughput"]["name"] == "samples_per_s"
    assert obs["sections"]["step"]["total_s"] > 0
    assert rep["score"] is None and rep["score_missing"].startswith("no GPU samples")
    text = hpcml("report", d, cwd=tmp_path)
    assert text.returncode == 0 and "vet: continue" in text.stdout and "html:" in text.stdout


@pytest.mark.torch
def test_html_report_renders_with_every_section(trained, tmp_path):
    d, _ = trained
    page = d / "report.html"
    assert hpcml("report", d, "--html", page, cwd=tmp_path).returncode == 0
    pixels, dom = render(page, tmp_path)
    assert_not_blank(pixels)
    for section in SECTIONS:
        assert f"id=\"{section}\"" in dom or f"id='{section}'" in dom, section
    # one page (issue 37): one title and one findings list, the observe page's sections
    # inside it rather than its whole page with its own title, job table and findings
    import re
    assert len(re.findall(r"<h1[ >]", dom)) == 1, re.findall(r"<h1[^<]*", dom)
    assert len(re.findall(r">Findings</h[1-6]>", dom)) == 1
    assert "<h2>Over time</h2>" not in dom and "<h3>Over time</h3>" in dom
    assert dom.count("<!DOCTYPE") <= 1 and dom.count("<body") == 1


def test_every_task_gets_the_rendezvous(tmp_path):
    probe = ("import os; print(' '.join(os.environ[k] for k in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', "
             "'LOCAL_WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT')))")
    p = hpcml("run", "--ntasks", "3", "--dir", "job", "--no-report", "--", sys.executable, "-c", probe, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert not (tmp_path / "job" / "report.html").exists() and "html:" not in p.stdout
    seen = [(tmp_path / "job" / "logs" / f"rank-{r:05d}.out").read_text().split() for r in range(3)]
    ports = {s[5] for s in seen}
    assert [s[:5] for s in seen] == [[str(r), str(r), "3", "3", "127.0.0.1"] for r in range(3)]
    assert len(ports) == 1 and ports != {"29500"}
    # the observe store records the user's command, not the step that starts it
    meta = json.loads((tmp_path / "job" / "observe" / "rank-00002.json").read_text())
    assert meta["command"] == [sys.executable, "-c", probe]


def _parents_libraries(tmp_path: Path, until: str, before: str = "") -> tuple[str, str]:
    """Run one rank that does ``before``, waits until its heartbeat record matches the
    regular expression ``until`` (the recorder wrote it: a handshake, not a sleep, so a
    loaded machine cannot read too early), then prints its parent's command line and the
    shared objects the parent has mapped."""
    beat = beat_path(Path("OBSERVE"), 0).relative_to("OBSERVE")
    probe = (before + "\nimport os, re, time; b = os.path.join(os.environ['HPCML_OBSERVE_DIR'], " + repr(str(beat)) + "); "
             "t = time.time() + 120\n"
             "while time.time() < t and not (os.path.exists(b) and re.search(" + repr(until) + ", open(b).read())): "
             "time.sleep(0.1)\n"
             "p = os.getppid(); "
             "print(open(f'/proc/{p}/cmdline').read().split(chr(0))[1:3]); "
             "print(sorted({os.path.basename(os.readlink(f'/proc/{p}/map_files/' + m)).split('.')[0] "
             "for m in os.listdir(f'/proc/{p}/map_files')}))")
    p = hpcml("run", "--ntasks", "1", "--dir", "job", "--no-report", "--", sys.executable, "-c", probe, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    cmdline, libs = (tmp_path / "job" / "logs" / "rank-00000.out").read_text().splitlines()[-2:]
    return cmdline, libs


def test_the_ranks_one_helper_process_loads_only_what_recording_needs(tmp_path):
    """Each rank has one helper process (the task wrapper, which records in-process) and it
    pays for no library it does not use: pyarrow would import pandas at its first array
    (0.4 s, 50 MB per rank) and the run.json model pydantic (0.2 s)."""
    cmdline, libs = _parents_libraries(tmp_path, until=".")
    assert cmdline == "['-m', 'hpcml.run.task']"                         # the parent is the wrapper
    assert "lib" in libs and "_psutil_linux" in libs                      # it records: pyarrow, psutil
    assert "_pydantic_core" not in libs and "hashtable" not in libs and "groupby" not in libs, libs  # pandas' own


def test_a_rank_that_logs_its_steps_costs_its_helper_no_pandas(tmp_path):
    """The door beside the one above: a rank that logs (``hpcml.observe``) sends the recorder
    Arrow batches, whose timestamps ``to_pydict`` made timezone-aware datetimes, for which
    pyarrow imported pandas in every rank's recorder: 0.4-0.5 s of CPU per rank (measured
    around examples/observe/train.py: the wrapper's CPU 0.70 s before, 0.19 s after). The
    rank waits until the recorder has counted its five steps."""
    logs = ("from hpcml import observe\n"
            "for step in range(1, 6):\n"
            "    with observe.section('step', step=step): pass\n"
            "    observe.log(step=step, loss=1.0 / step)\n"
            "observe.flush()")
    cmdline, libs = _parents_libraries(tmp_path, until='"steps":5', before=logs)
    assert cmdline == "['-m', 'hpcml.run.task']"
    assert "lib" in libs and "_psutil_linux" in libs
    assert "hashtable" not in libs and "groupby" not in libs and "_pydantic_core" not in libs, libs


@pytest.mark.torch
def test_a_crashing_rank_gives_its_exit_code_and_its_stderr(tmp_path):
    p = hpcml("run", "--ntasks", "2", "--dir", "job", "--", "python", EXAMPLE, "--data", tmp_path / "data",
              "--samples", "256", "--fail-rank", "1", "--fail-step", "2", cwd=tmp_path)
    assert p.returncode == 3, p.stderr
    rep = json.loads(hpcml("report", "job", "--json", cwd=tmp_path).stdout)
    first = rep["ending"]["first_failure"]
    assert first["rank"] == 1 and first["exit_code"] == 3
    assert any("injected failure at step 2" in line for line in first["stderr_tail"])
    assert rep["findings"][0]["kind"] == "failed_rank" and "rank 1" in rep["findings"][0]["message"]


def test_vetting_abort_never_starts_the_command(tmp_path):
    (tmp_path / "p.yaml").write_text("name: impossible\nevals:\n  - {name: mem, type: memory, min_available_fraction: 100%}\n")
    marker = tmp_path / "started"
    p = hpcml("run", "--vet", "p.yaml", "--dir", "job", "--", "touch", marker, cwd=tmp_path)
    assert p.returncode == 4, p.stderr
    assert not marker.exists() and not (tmp_path / "job" / "logs").exists()
    run = json.loads((tmp_path / "job" / "run.json").read_text())
    assert run["aborted"] is True
    rep = json.loads(hpcml("report", "job", "--json", cwd=tmp_path).stdout)
    assert rep["findings"][0]["kind"] == "aborted" and rep["observe"] is None


@pytest.mark.parametrize("args,needle", [
    ([], "no command to run"),
    (["--vet", "bad.yaml", "--", "true"], "bad.yaml"),
    (["--min-nodes", "5", "--", "true"], "--min-nodes"),
    (["--env", "nope.toml", "--", "true"], "nope.toml"),
    (["--ntasks", "0", "--", "true"], "--ntasks"),
])
def test_bad_input_is_one_line_exit_2_and_launches_nothing(tmp_path, args, needle):
    (tmp_path / "bad.yaml").write_text("name: bad\nevals:\n  - {name: d, type: disk, path: /tmp, min_free: lots}\n")
    p = hpcml("run", "--dir", "job", *args, cwd=tmp_path)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert p.stderr.count("\n") == 1 and needle in p.stderr and p.stderr.startswith("hpcml run: error:")
    assert not (tmp_path / "job" / "logs").exists()


def test_report_of_something_else_is_one_line_exit_2(tmp_path):
    p = hpcml("report", tmp_path, cwd=tmp_path)
    assert p.returncode == 2 and "no run.json" in p.stderr and p.stderr.count("\n") == 1


def test_usr1_to_hpcml_run_reaches_every_rank_and_they_checkpoint(tmp_path):
    """``#SBATCH --signal=B:USR1@300`` with ``exec hpcml run``: the warning goes to hpcml run
    alone. It passes it on (here to its local ranks, under Slurm to srun, which passes it to
    every task); each rank's Checkpointer saves and stops; the run exits 0 and says so."""
    import signal
    import time
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    p = subprocess.Popen([sys.executable, "-m", "hpcml", "run", "--ntasks", "2", "--dir", "job", "--no-report", "--",
                          sys.executable, ROOT / "examples" / "ckpt" / "train_resume.py", "ckpt", "--steps", "100000",
                          "--size-mb", "0.1", "--step-sleep", "0.02"],
                         cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 120
        while not any(tmp_path.glob("ckpt/step-*")) and time.monotonic() < end and p.poll() is None:
            time.sleep(0.1)
        assert any(tmp_path.glob("ckpt/step-*")), p.communicate(timeout=5)
        p.send_signal(signal.SIGUSR1)
        out, err = p.communicate(timeout=120)
    finally:
        p.kill()
    assert p.returncode == 0, err
    logs = [(tmp_path / "job" / "logs" / f"rank-{r:05d}.out").read_text() for r in range(2)]
    stopped = [int(line.split()[2]) for log in logs for line in log.splitlines() if line.startswith("stopped at")]
    assert len(stopped) == 2 and all("(SIGUSR1)" in log for log in logs), logs
    run = valid(json.loads((tmp_path / "job" / "run.json").read_text()), "run")
    assert run["signals_forwarded"] == ["SIGUSR1"] and run["exit_code"] == 0
    assert max(int(d.name.split("-")[1]) for d in tmp_path.glob("ckpt/step-*")) >= min(stopped)


def test_the_ranks_gpu_sampler_is_chosen_like_observe_record_s(tmp_path):
    """``hpcml run --gpu-metrics``: a name the sampler registry does not know is one line,
    exit 2, naming the flag; ``none`` reaches every rank's recorder (it always ran 'auto')."""
    import json
    bad = hpcml("run", "--gpu-metrics", "cuda", "--dir", "bad", "--", "true", cwd=tmp_path)
    assert bad.returncode == 2 and "flag '--gpu-metrics'" in bad.stderr and len(bad.stderr.splitlines()) == 1
    ok = hpcml("run", "--ntasks", "2", "--gpu-metrics", "none", "--dir", "job", "--no-report", "--", "true",
               cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "2 local tasks" in ok.stderr
    for r in (0, 1):
        label = json.loads((tmp_path / "job" / "observe" / f"rank-0000{r}.json").read_text())["gpu_sampler"]
        assert label["reason"] == "off"
