"""``hpcml run --collector``: each job's summary reaches a real collector (``hpcml centre serve``
in its own process, SQLite) exactly once, whatever happens to the collector or the sender.

"Exactly once" is counted in the collector's database after the faults: rows of ``jobs``
per (job, attempt). The job itself is a real local ``hpcml run``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest

from hpcml import schemas
from hpcml.ports import free_port
from tests.run.test_watch import TASK, hpcml

TOKEN = "summary-token-0123456789"
TRUSTED = "trusted-token-0123456789"          # the centre's own tools: summaries taken as sent
ROOT = Path(__file__).parents[2]
TRAIN = """
import os, time
from hpcml import observe
for i in range(12):
    with observe.section("step"):
        time.sleep(0.02)
    observe.log(step=i, tokens_per_s=500.0)
"""


class Collector:
    """``hpcml centre serve`` on a free loopback port, its store a SQLite file."""

    def __init__(self, root: Path, port: int | None = None) -> None:
        self.db = root / "centre.db"
        self.port = port or free_port("127.0.0.1")
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> Collector:
        env = {**os.environ, "HPCML_VET_TOKEN": TOKEN}
        trusted = self.db.with_name("trusted-tokens")
        trusted.write_text(TRUSTED + "\n")
        self.proc = subprocess.Popen([sys.executable, "-m", "hpcml", "centre", "serve", "--db", f"sqlite:///{self.db}",
                                      "--port", str(self.port), "--trusted-token-file", str(trusted)],
                                     env=env, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert "listening on" in line, line
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)

    def rows(self) -> list[tuple]:
        if not self.db.exists():
            return []
        with sqlite3.connect(self.db) as conn:
            return conn.execute("SELECT job, attempt, outcome, body FROM jobs ORDER BY job, attempt").fetchall()


@pytest.fixture
def collector(tmp_path):
    c = Collector(tmp_path)
    try:
        yield c
    finally:
        c.stop()


def run_job(tmp_path: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    (tmp_path / "train.py").write_text(TRAIN)
    return hpcml("run", "--ntasks", "2", "--dir", "job", "--interval", "0.2", *args, "--", "python", "train.py",
                 cwd=tmp_path, env={"HPCML_VET_TOKEN": TOKEN, **(env or {})})


def test_a_finished_job_is_summarised_into_the_collector(tmp_path, collector):
    collector.start()
    p = run_job(tmp_path, "--collector", collector.url, env={"SLURM_JOB_ACCOUNT": "a-proj", "USER": "alice"})
    assert p.returncode == 0, p.stderr
    assert "summary not sent" not in p.stderr
    (job, attempt, outcome, body), = collector.rows()
    doc = json.loads(body)
    jsonschema.validate(doc, schemas.load("job.summary"), cls=jsonschema.Draft202012Validator)
    assert job.startswith("local-") and attempt == 0 and outcome == "completed"
    assert doc["user"] == "alice" and doc["exit_code"] == 0 and doc["ntasks"] == 2 and doc["attempts"] == 1
    assert doc["throughput"] == {"median": 500.0, "unit": "tokens_per_s"} and doc["duration_s"] > 0
    spooled = json.loads((tmp_path / "job" / "summary" / "attempt-0.json").read_text())
    assert spooled["job_id"] == job and (tmp_path / "job" / "summary" / "attempt-0.sent").exists()


def test_gpus_given_to_the_ranks_but_not_sampled_are_counted_not_0(tmp_path, collector):
    """Two local ranks given two GPUs each (``CUDA_VISIBLE_DEVICES=0,1``, what the ranks'
    metadata records), sampled by nothing (``--gpu-metrics none``: no score): the summary
    still holds 2 GPUs and their GPU-hours (was: 0 GPUs, 0.0 GPU-hours). No GPU is used;
    the ranks only record what they were given."""
    collector.start()
    p = run_job(tmp_path, "--gpu-metrics", "none", "--collector", collector.url, env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert p.returncode == 0, p.stderr
    (_job, _attempt, _outcome, body), = collector.rows()
    doc = json.loads(body)
    assert doc["gpus"] == 2 and doc["gpu_hours"] == pytest.approx(2 * doc["duration_s"] / 3600, abs=1e-4)
    assert (doc.get("gpu") or {}).get("score") is None


def test_a_job_no_rank_ran_in_sends_its_gpus_unknown_not_0(tmp_path, collector):
    """Vetting aborted the job (no node passes its protocol): no rank ran, so nothing counted
    its GPUs. Its summary sends ``gpus`` and ``gpu_hours`` null and the collector stores
    NULL (was: 0 GPUs, 0.0 GPU-hours, which a centre total then counted as nothing used);
    its node-hours, which are known, are sent. A CPU job whose ranks ran sends 0: known."""
    collector.start()
    (tmp_path / "p.yaml").write_text("name: impossible\nevals:\n  - {name: mem, type: memory, "
                                     "min_available_fraction: 100%}\n")
    p = run_job(tmp_path, "--vet", "p.yaml", "--collector", collector.url)
    assert p.returncode == 4, p.stderr
    spooled = json.loads((tmp_path / "job" / "summary" / "attempt-0.json").read_text())
    # left out, not null: a collector of the version before reads them as its default (was: refused, set aside)
    assert spooled["outcome"] == "aborted" and "gpus" not in spooled and "gpu_hours" not in spooled
    assert spooled["duration_s"] > 0 and spooled["node_hours"] == round(spooled["duration_s"] / 3600, 4)
    jsonschema.validate(spooled, schemas.load("job.summary"), cls=jsonschema.Draft202012Validator)
    with sqlite3.connect(collector.db) as conn:
        assert conn.execute("SELECT gpus, gpu_hours FROM jobs").fetchall() == [(None, None)]
    cpu = tmp_path / "cpu"
    cpu.mkdir()
    assert run_job(cpu, "--collector", collector.url).returncode == 0
    with sqlite3.connect(collector.db) as conn:
        assert sorted(conn.execute("SELECT gpus, gpu_hours FROM jobs").fetchall(), key=str) == [(0, 0.0), (None, None)]


def test_a_collector_that_is_down_neither_fails_the_job_nor_loses_the_summary(tmp_path, collector):
    """Nothing listens at the URL: the job exits 0 with one warning; the summary waits in the
    spool; ``hpcml report --send`` delivers it once the collector is up, and sending it
    again (markers removed, as after a crash between the send and the mark) stores nothing."""
    p = run_job(tmp_path, "--collector", collector.url)
    assert p.returncode == 0, p.stderr
    warned = [line for line in p.stderr.splitlines() if "summary not sent" in line]
    assert len(warned) == 1 and "hpcml report" in warned[0] and "--send" in warned[0], p.stderr
    spool = tmp_path / "job" / "summary"
    assert (spool / "attempt-0.json").exists() and not (spool / "attempt-0.sent").exists()
    collector.start()
    sent = hpcml("report", "job", "--send", "--collector", collector.url, cwd=tmp_path, env={"HPCML_VET_TOKEN": TOKEN})
    assert sent.returncode == 0 and "1 sent, 0 left" in sent.stderr, sent.stderr
    (spool / "attempt-0.sent").unlink()
    again = hpcml("report", "job", "--send", "--collector", collector.url, cwd=tmp_path, env={"HPCML_VET_TOKEN": TOKEN})
    assert again.returncode == 0, again.stderr
    assert len(collector.rows()) == 1


def test_send_killed_at_random_moments_stores_each_summary_once(tmp_path, collector):
    """kill -9 of ``hpcml report --send`` at random moments, many times, four attempts'
    summaries waiting: afterwards every attempt is stored exactly once."""
    p = run_job(tmp_path)
    assert p.returncode == 0, p.stderr
    spool = tmp_path / "job" / "summary"
    first = json.loads((spool / "attempt-0.json").read_text())
    for n in (1, 2, 3):                       # later attempts of the same job, as a requeue leaves them
        (spool / f"attempt-{n}.json").write_text(json.dumps({**first, "attempt": n}))
    collector.start()
    env = {**os.environ, "HPCML_VET_TOKEN": TOKEN, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    rng = random.Random(38)
    for _ in range(12):
        sender = subprocess.Popen([sys.executable, "-m", "hpcml", "report", "job", "--send", "--collector",
                                   collector.url], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            sender.wait(rng.uniform(0.2, 2.5))  # killed at that moment, unless it ended before
        sender.kill()
        sender.wait()
        for marker in spool.glob("*.sent"):   # as if every kill came before the marks
            if rng.random() < 0.5:
                marker.unlink()
    last = hpcml("report", "job", "--send", "--collector", collector.url, cwd=tmp_path, env={"HPCML_VET_TOKEN": TOKEN})
    assert last.returncode == 0, last.stderr
    rows = collector.rows()
    assert [(r[0], r[1]) for r in rows] == [(first["job_id"], n) for n in range(4)]
    assert not list(spool.glob(".*.tmp")), "a killed sender left a temporary file"


def test_two_senders_at_once_store_each_summary_once(tmp_path, collector):
    p = run_job(tmp_path)
    assert p.returncode == 0, p.stderr
    collector.start()
    env = {**os.environ, "HPCML_VET_TOKEN": TOKEN, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    senders = [subprocess.Popen([sys.executable, "-m", "hpcml", "report", "job", "--send", "--collector",
                                 collector.url], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for s in senders:
        _, err = s.communicate(timeout=120)
        assert s.returncode == 0, err
    assert len(collector.rows()) == 1


@pytest.mark.parametrize("args, key", [
    (("run", "--collector", "ftp://centre:21", "--", "true"), "--collector"),
    (("run", "--collector", "centre:8787", "--", "true"), "--collector"),
    (("run", "--collector", "http://[::1", "--", "true"), "--collector"),
    (("run", "--collector", "http://centre:99999", "--", "true"), "--collector"),
    (("report", "job", "--send"), "--send"),
])
def test_a_collector_url_that_is_not_http_is_one_line_exit_2(tmp_path, args, key):
    p = hpcml(*args, cwd=tmp_path, env={"HPCML_COLLECTOR": ""})
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and key in lines[0] and "Traceback" not in p.stderr, p.stderr
    assert not (tmp_path / "job").exists() or args[0] == "report"


@pytest.mark.torch
def test_a_hang_culprit_reaches_the_collector_with_its_node(tmp_path, collector):
    """A real 2-rank DDP job whose rank 1 hangs in its collective: the summary names the
    culprit rank and its node, the outcome is hung, and the fleet report ranks that node. The
    job runs outside Slurm, so nothing can prove it: it is sent with a trusted token (the
    proof of real Slurm jobs: tests/centre/collector/test_proof_slurm.py)."""
    collector.start()
    p = hpcml("run", "--ntasks", "2", "--dir", "job", "--no-report", "--hang-timeout", "2s", "--kill-grace", "3",
              "--vet", str(ROOT / "examples" / "vet" / "cpu.yaml"),
              "--collector", collector.url, "--", "python", TASK, cwd=tmp_path,
              env={"FAULT": "collective", "HPCML_COLLECTOR_TOKEN": TRUSTED})
    assert p.returncode == 5, p.stderr
    (_, _, outcome, body), = collector.rows()
    doc = json.loads(body)
    assert outcome == "hung" and doc["exit_code"] == 5 and doc["hangs"] == 1
    (culprit,) = doc["culprits"]
    assert culprit["rank"] == 1 and culprit["node"] == doc["nodes"][0]
    assert doc["crashed"] == [] and doc["lost"] == []        # ranks hpcml stopped did not crash
    (vetted,) = doc["vetting"]                                 # what --vet found reached the centre
    assert vetted["node"] == culprit["node"] and vetted["verdict"] == "good"
    rep = hpcml("centre", "report", "--db", f"sqlite:///{collector.db}", "--since", "1d", "--json", cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr
    fleet = json.loads(rep.stdout)
    assert fleet["nodes"][0]["node"] == culprit["node"] and fleet["nodes"][0]["culprit"] == 1
    assert fleet["nodes"][0]["vet"]["reports"] == 1 and fleet["nodes"][0]["vet"]["bad"] == 0
    assert fleet["totals"]["hung"] == 1


def test_a_report_while_the_job_runs_sends_nothing_and_the_end_sends_the_final_summary(tmp_path, collector):
    """A summary is stored once, so only an ended attempt's is ever sent: a report taken
    while the job runs (``$HPCML_COLLECTOR`` exported) sends nothing."""
    collector.start()
    go = tmp_path / "go"                       # the task ends once the report below is taken
    (tmp_path / "slow.py").write_text(f"import os, time\nfor _ in range(1200):\n    if os.path.exists({str(go)!r}):\n"
                                      "        break\n    time.sleep(0.05)\n")
    env = {**os.environ, "HPCML_VET_TOKEN": TOKEN, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env = {k: v for k, v in env.items() if not k.startswith("SLURM_")}
    job = subprocess.Popen([sys.executable, "-m", "hpcml", "run", "--ntasks", "1", "--dir", "job", "--collector",
                            collector.url, "--", "python", "slow.py"], cwd=tmp_path, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while not (tmp_path / "job" / "run.json").exists() and time.time() < deadline:
            time.sleep(0.2)
        during = hpcml("report", "job", cwd=tmp_path, env={"HPCML_VET_TOKEN": TOKEN, "HPCML_COLLECTOR": collector.url})
        assert during.returncode == 0, during.stderr
        assert "still running" in during.stderr and collector.rows() == []
    finally:
        go.touch()
        _, err = job.communicate(timeout=120)
    assert job.returncode == 0, err
    (_, _, outcome, body), = collector.rows()
    assert outcome == "completed" and json.loads(body)["exit_code"] == 0


def test_overwrite_sends_the_new_jobs_summary(tmp_path, collector):
    collector.start()
    assert run_job(tmp_path, "--collector", collector.url).returncode == 0
    (tmp_path / "train.py").write_text("import sys\nsys.exit(3)\n")
    again = hpcml("run", "--ntasks", "1", "--dir", "job", "--overwrite", "--collector", collector.url, "--",
                  "python", "train.py", cwd=tmp_path, env={"HPCML_VET_TOKEN": TOKEN})
    assert again.returncode == 3, again.stderr
    assert sorted(r[2] for r in collector.rows()) == ["completed", "failed"]


def test_a_refused_summary_is_set_aside_and_does_not_hold_back_the_others(tmp_path, collector):
    p = run_job(tmp_path)
    assert p.returncode == 0, p.stderr
    spool = tmp_path / "job" / "summary"
    first = json.loads((spool / "attempt-0.json").read_text())
    # a score no GPU has: the model the collector validates with refuses it, here before it is sent
    (spool / "attempt-0.json").write_text(json.dumps({**first, "gpu": {"score": 1.2}}))
    (spool / "attempt-1.json").write_text(json.dumps({**first, "attempt": 1}))
    (spool / "attempt-2.json").symlink_to("/etc/passwd")                                    # never read
    (spool / "attempt-x.json").write_text(json.dumps({**first, "attempt": 9}))              # not a spool name
    collector.start()
    sent = hpcml("report", "job", "--send", "--collector", collector.url, cwd=tmp_path, env={"HPCML_VET_TOKEN": TOKEN})
    assert sent.returncode == 0, sent.stderr
    assert "attempt-0.json not sent" in sent.stderr and "gpu.score" in sent.stderr, sent.stderr
    assert [r[1] for r in collector.rows()] == [1]
    assert (spool / "attempt-0.refused").exists() and (spool / "attempt-1.sent").exists()


def test_a_node_whose_vetting_measured_nothing_is_left_out_of_the_summary_never_good(tmp_path):
    """The start's vetting: n1 passed, n2's every check was skipped, n3 failed, n4 gave no
    result; a restart's vetting again measured nothing on n2. The summary's vetting history
    says nothing of n2 (unknown is never good), and keeps what was measured."""
    from hpcml.run.jobdir import vet_dir
    from hpcml.run.summary import _vetting
    from tests.vet.reports import vet_report
    vet = vet_dir(tmp_path)
    (vet / "again-1").mkdir(parents=True)
    (vet / "report.json").write_text(json.dumps(vet_report(
        {"n1": [("mem", "memory", "pass")], "n2": [("gpu", "gpu", "skipped")], "n3": [("mem", "memory", "fail")],
         "n4": None})))
    (vet / "again-1" / "report.json").write_text(json.dumps(vet_report({"n2": [("gpu", "gpu", "skipped")]})))
    got = {(v["attempt"], v["node"]): (v["verdict"], v["failing"]) for v in _vetting(tmp_path, ["n1", "n2", "n3", "n4"])}
    assert got == {(0, "n1"): ("good", []), (0, "n3"): ("bad", ["mem"]), (0, "n4"): ("bad", [])}, got


def test_gpus_counted_on_some_nodes_only_are_not_sent_as_the_job_s(tmp_path):
    """4 nodes x 4 GPUs, 16 ranks; node n4's ranks wrote no metadata (its store lost): the
    12 GPUs the others were given are not the job's, so its GPUs and GPU-hours are unknown,
    not 12 and 12.0 (a quarter short, said as the whole); with n4's ranks' metadata, 16."""
    from hpcml.jobmodel import RunRecord
    from hpcml.run import report, summary
    from hpcml.run.jobdir import observe_dir, write_run
    t0 = time.time() - 4000
    nodes = ["n1", "n2", "n3", "n4"]
    write_run(tmp_path, RunRecord(command=["x"], mode="slurm", job_id="42", started=t0, ended=t0 + 3600, exit_code=0,
                                  allocation=nodes, nodes=nodes, ntasks=16, ntasks_per_node=4))
    od = observe_dir(tmp_path, 0)
    od.mkdir(parents=True, exist_ok=True)

    def ranks(which: range) -> None:
        for r in which:
            (od / f"rank-{r}.json").write_text(json.dumps({"rank": r, "node": nodes[r // 4], "gpus": [str(r % 4)],
                                                           "start": t0 + 5}))
    ranks(range(12))
    doc = summary.build(tmp_path, report.build(tmp_path)).to_json()
    assert doc.get("gpus") is None and doc.get("gpu_hours") is None and doc["node_hours"] == 4.0, doc
    ranks(range(12, 16))
    doc = summary.build(tmp_path, report.build(tmp_path)).to_json()
    assert doc["gpus"] == 16 and doc["gpu_hours"] == 16.0, doc


def test_a_job_of_two_attempts_sends_their_gpu_score_weighted_by_their_seconds(tmp_path):
    """Attempt 0 ran 3,000 s on a GPU a spin kernel kept busy doing nothing, attempt 1 1,000 s
    of GEMMs (each rank's recorder on the recorded H100's phases: the GPM replay, no GPU here). The summary's score,
    which the centre weighs the job's GPU-hours by, is the two weighted by their seconds (was:
    the last attempt's alone, said as the whole job's); an earlier attempt with no score makes
    it unknown."""
    from hpcml.jobmodel import RunRecord
    from hpcml.run import report, summary
    from hpcml.run.jobdir import observe_dir, write_run
    from hpcml.score.importers import load
    from hpcml.score.report import build as score_of
    replay = Path(__file__).parents[1] / "fixtures" / "gpm" / "gpm-h100.jsonl"
    scores = []
    for attempt, phase in ((0, "spin_no_fp"), (1, "gemm_bf16")):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CUDA_VISIBLE", "ROCR_", "HPCML_OBSERVE"))}
        env.update(HPCML_GPM_REPLAY=str(replay), HPCML_GPM_REPLAY_PHASES=phase, DCGM_HOSTENGINE="127.0.0.1:1")
        p = subprocess.run([sys.executable, "-m", "hpcml", "observe", "record", "--dir", str(observe_dir(tmp_path, attempt)),
                            "--interval", "0.2", "--", sys.executable, "-c", "import time; time.sleep(6)"],
                           env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        scores.append(score_of(load(observe_dir(tmp_path, attempt), "store"))["score"])
    assert scores[1] - scores[0] > 0.1, scores
    t0 = time.time() - 5000
    first = RunRecord(command=["x"], mode="local", started=t0, ended=t0 + 3000, launch=["x"], exit_code=1)
    rec = RunRecord(command=["x"], mode="local", started=t0 + 3010, ended=t0 + 4010, launch=["x"], attempt=1,
                    exit_code=0, attempts=[first.as_attempt()])
    write_run(tmp_path, rec)
    doc = summary.build(tmp_path, report.build(tmp_path)).to_json()
    assert doc["gpu"]["score"] == pytest.approx((3000 * scores[0] + 1000 * scores[1]) / 4000, abs=1e-3), (doc, scores)
    for f in observe_dir(tmp_path, 0).glob("rank-*"):
        f.unlink()                               # attempt 0's store lost: its score unknown, so the job's
    assert summary.build(tmp_path, report.build(tmp_path)).to_json()["gpu"]["score"] is None
