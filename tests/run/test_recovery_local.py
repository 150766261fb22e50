"""``hpcml run --max-restarts`` with local tasks (no Slurm): the ranks restart in place, as
torchrun's ``--max-restarts`` does, and the job resumes from its hpcml.ckpt checkpoint.

What the user's script did is counted from a file it appends to (O_APPEND), not from
hpcml's records; the final weights are compared bitwise with a fault-free run's.
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
from tests.leftovers import running

ROOT = Path(__file__).resolve().parents[2]
RESUMABLE = ROOT / "tests" / "run" / "resumable_ddp.py"

# a script with a bug at step 5 on rank 0, without torch: fast to start, and the same on any node
BUGGY = """\
import os, sys, time
from hpcml import observe
rank = int(os.environ["RANK"])
fd = os.open(os.environ["DONE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
os.write(fd, f"start {os.environ.get('HPCML_RUN_ATTEMPT')} {rank}\\n".encode())
for step in range(10):
    if step == 5 and rank == 0:
        raise SystemExit("a bug at step 5")
    observe.log(step=step, loss=1.0)
    time.sleep(0.05)
"""


def hpcml(args: list[str], cwd: Path, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    e = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "hpcml", "run", *args], cwd=cwd, env=e, capture_output=True,
                          text=True, timeout=timeout)


def steps_done(path: Path) -> dict[int, list[tuple[int, int]]]:
    """attempt -> [(rank, step)], from the script's own appends."""
    out: dict[int, list[tuple[int, int]]] = {}
    for line in path.read_text().splitlines():
        a, r, s = (int(x) for x in line.split()[:3])
        out.setdefault(a, []).append((r, s))
    return out


def training(tmp: Path, name: str, **fault: str) -> dict[str, str]:
    return {"CKPT": str(tmp / f"{name}-ckpt"), "DONE": str(tmp / f"{name}.done"), "OUT": str(tmp / f"{name}.pt"),
            **fault}


def same_weights(a: Path, b: Path) -> bool:
    import torch
    x, y = torch.load(a), torch.load(b)
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def no_process_left(marker: str, cwd: Path) -> list[str]:
    """What still runs with ``marker`` in its command line, of the job started in ``cwd``."""
    return [" ".join(p.info["cmdline"] or []) for p in running(marker, cwd=cwd)]


@pytest.fixture(scope="session")
def reference(tmp_path_factory) -> Path:
    """The fault-free run's weights: 2 local ranks (the math does not depend on the nodes)."""
    tmp = tmp_path_factory.mktemp("reference")
    p = hpcml(["--ntasks", "2", "--dir", "ref", "--no-report", "--", sys.executable, str(RESUMABLE)], tmp,
              training(tmp, "ref"))
    assert p.returncode == 0, p.stderr
    return tmp / "ref.pt"


@pytest.mark.torch
def test_a_crashed_rank_restarts_in_place_and_ends_bitwise_as_a_fault_free_run(tmp_path, reference):
    p = hpcml(["--ntasks", "2", "--max-restarts", "2", "--dir", "job", "--", sys.executable, str(RESUMABLE)],
              tmp_path, training(tmp_path, "job", FAULT="crash", FAULT_RANK="1", STEP_S="0.1"))
    assert p.returncode == 0, p.stderr
    assert "crash: rank 1" in p.stderr and "attempt 1 (restart 1 of 2)" in p.stderr
    assert same_weights(reference, tmp_path / "job.pt")
    done = steps_done(tmp_path / "job.done")
    assert sorted(done) == [0, 1]
    first = {s for r, s in done[0] if r == 1}
    assert first == set(range(30))                         # rank 1 crashed before step 30
    run = json.loads((tmp_path / "job" / "run.json").read_text())
    restart = run["attempts"][0]["restart"]
    resumed = restart["resumed"]["step"]
    assert resumed in (20, 30) and {s for r, s in done[1] if r == 1} == set(range(resumed + 1, 50))
    assert restart["resumed"]["steps_lost"] == run["attempts"][0]["furthest_step"] - resumed
    assert restart["fault"]["kind"] == "crash" and run["attempt"] == 1 and run["exit_code"] == 0
    assert "restarted" in p.stdout and "resumed from step" in p.stdout        # the report
    jsonschema.validate(run, schemas.load("run"), cls=jsonschema.Draft202012Validator)
    rep = subprocess.run([sys.executable, "-m", "hpcml", "report", "job", "--json"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    doc = json.loads(rep.stdout)
    jsonschema.validate(doc, schemas.load("run.report"), cls=jsonschema.Draft202012Validator)
    assert doc["recovery"]["restarts"] == 1 and doc["recovery"]["steps_lost"] == restart["resumed"]["steps_lost"]
    assert [f["kind"] for f in doc["findings"]].count("restarted") == 1
    assert no_process_left(str(RESUMABLE), tmp_path) == []
    ledger_matches_the_scripts_own(doc["ledger"], tmp_path / "job.done", run)
    # run.json keeps the ledger the job's own report printed (hpcml run's, at its end)
    kept = run["ledger"]
    assert kept["total_s"] == doc["ledger"]["total_s"] and kept["parts"] == doc["ledger"]["parts"]
    ledger_matches_the_scripts_own(kept, tmp_path / "job.done", run)
    assert sum(p["node_s"] for p in kept["parts"]) == pytest.approx(kept["node_s"], abs=0.01)
    # the summary the centre ranks by: the ledger's node time that did not train, and its largest part
    from hpcml.run.summary import build as summary_of
    got = summary_of(tmp_path / "job").to_json()
    assert got["node_hours_not_training"] == round((kept["node_s"] - kept["productive_node_s"]) / 3600, 4)
    unproductive: dict = {}
    for p_ in kept["parts"]:
        if p_["part"] != "productive":
            unproductive[p_["part"]] = unproductive.get(p_["part"], 0) + p_["node_s"]
    assert got["not_training_why"] == max(unproductive, key=unproductive.get)


def ledger_matches_the_scripts_own(ledger: dict, done: Path, run: dict) -> None:
    """The report's time ledger against the script's own step ledger (each step a rank
    completed, with its time): the parts add up to hpcml run's whole time, each attempt's
    productive time is its first to its last step less the steps done again, and those are
    the steps the script redid after its restart, at the median step time."""
    times: dict[int, list[tuple[int, int, float]]] = {}
    for line in done.read_text().splitlines():
        a, r, s, t = line.split()[:4]
        times.setdefault(int(a), []).append((int(r), int(s), float(t)))
    whole = run["ended"] - run["attempts"][0]["started"]
    assert abs(ledger["total_s"] - whole) < 0.01
    parts = ledger["parts"]
    assert abs(sum(p["seconds"] for p in parts if p["seconds"] is not None) - ledger["total_s"]) < 0.01
    assert sum(p["seconds"] for p in parts if p["part"] == "other") < 1.0        # nearly every second placed
    step_s = None
    for attempt, rows in times.items():
        ts = [t for _, _, t in rows]
        span = max(ts) - min(ts)
        redone = sum(p["seconds"] or 0 for p in parts if p["part"] == "redone" and p["attempt"] == attempt)
        productive = sum(p["seconds"] for p in parts if p["part"] == "productive" and p["attempt"] == attempt)
        assert abs(productive - (span - redone)) <= 0.5 + 0.05 * span, (attempt, productive, span, redone)
        if attempt == 1:
            before = max(s for _, s, _ in times[0])
            again = sorted(t for r, s, t in rows if r == 0 and s <= before)    # the steps rank 0 did twice
            step_s = (max(ts) - min(ts)) / max(1, len({s for _, s, _ in rows}) - 1)
            assert abs(redone - len(again) * step_s) <= 1.0 + 0.5 * len(again) * step_s, (redone, len(again), step_s)
    assert 0 < ledger["ettr"] <= 1 and ledger["ettr"] == round(sum(
        p["seconds"] for p in parts if p["part"] == "productive") / ledger["total_s"], 4)


def test_a_bug_at_the_same_step_stops_after_two_restarts(tmp_path):
    (tmp_path / "buggy.py").write_text(BUGGY)
    done = tmp_path / "done"
    p = hpcml(["--ntasks", "2", "--max-restarts", "5", "--dir", "job", "--no-report", "--kill-grace", "2", "--",
               sys.executable, "buggy.py"], tmp_path, {"DONE": str(done)})
    assert p.returncode == 1, p.stderr                      # the last attempt's exit code
    starts = done.read_text().split("\n")
    assert sorted(s for s in starts if s) == sorted(f"start {a} {r}" for a in range(3) for r in range(2))
    last = [ln for ln in p.stderr.splitlines() if "not restarting" in ln]
    assert len(last) == 1 and "the same crash at step" in last[0] and "3 attempts in a row" in last[0], p.stderr
    run = json.loads((tmp_path / "job" / "run.json").read_text())
    assert run["attempt"] == 2 and run["restart"]["action"] == "stop" and len(run["attempts"]) == 2


def test_max_restarts_0_is_the_single_attempt_it_always_was(tmp_path):
    (tmp_path / "buggy.py").write_text(BUGGY)
    done = tmp_path / "done"
    p = hpcml(["--ntasks", "2", "--dir", "job", "--no-report", "--", sys.executable, "buggy.py"], tmp_path,
              {"DONE": str(done)})
    assert p.returncode == 1 and "a bug at step 5" in p.stderr
    assert sorted(done.read_text().split()) == sorted("start 0 0 start 0 1".split())
    run = json.loads((tmp_path / "job" / "run.json").read_text())
    assert run["attempt"] == 0 and "attempts" not in run and "restart" not in run
    assert not (tmp_path / "job" / "attempts").exists()


# rank 1 hangs at step 5 of the first attempt only: the watch stops it, the restart completes
HANGS_ONCE = """\
import os, time
from hpcml import observe
rank, attempt = int(os.environ["RANK"]), os.environ.get("HPCML_RUN_ATTEMPT")
for step in range(10):
    while step == 5 and rank == 1 and attempt == "0":
        time.sleep(0.5)
    observe.log(step=step, loss=1.0)
    time.sleep(0.1)
"""


def test_while_it_ran_tells_every_attempt_and_no_section_contradicts_another(tmp_path):
    """Attempt 0 hangs and is restarted; attempt 1 ends well. Terminal, JSON and HTML all
    name attempt 0's hang and its culprit; none says the watch saw no hang; all agree with
    run.json."""
    (tmp_path / "hangs.py").write_text(HANGS_ONCE)
    p = hpcml(["--ntasks", "2", "--max-restarts", "1", "--dir", "job", "--no-report", "--hang-timeout", "3s",
               "--kill-grace", "2", "--", sys.executable, "hangs.py"], tmp_path)
    assert p.returncode == 0, p.stderr
    run = json.loads((tmp_path / "job" / "run.json").read_text())
    assert run["attempt"] == 1 and run["attempts"][0]["hang"]["action"] == "stop"
    culprit = run["attempts"][0]["hang"]["verdict"]["culprits"][0]
    assert culprit["rank"] == 1
    rep = subprocess.run([sys.executable, "-m", "hpcml", "report", "job", "--json"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    doc = json.loads(rep.stdout)
    jsonschema.validate(doc, schemas.load("run.report"), cls=jsonschema.Draft202012Validator)
    assert doc["attempts"][0]["watch"]["hang"] == run["attempts"][0]["hang"]
    hung = [f["message"] for f in doc["findings"] if f["kind"] == "hang"]
    assert len(hung) == 1 and hung[0].startswith("attempt 0: the job hung") and f"rank 1 on {culprit['node']}" in hung[0]
    term = subprocess.run([sys.executable, "-m", "hpcml", "report", "job", "--html", "page.html"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert term.returncode == 0, term.stderr
    assert any(ln.strip().startswith("attempt 0: hang:") for ln in term.stdout.splitlines()), term.stdout
    page = (tmp_path / "page.html").read_text()
    watch = page[page.index("id='run-watch'"):page.index("id='run-observe'")]
    assert "attempt 0: hang:" in watch and "attempt 0: culprit: rank 1" in watch, watch
    assert "saw no" not in page
    assert "None" not in page and "None" not in term.stdout                  # no Python for people to read
    assert term.stdout.splitlines()[3:5] == ["  did (attempt 0): 10 steps (rank 0; ranks did 5-10); last loss 1 (rank 0)",
                                             "  did (attempt 1): 10 steps (rank 0); last loss 1 (rank 0)"], term.stdout


@pytest.mark.parametrize("args,needle", [
    (["--max-restarts", "-1"], "flag '--max-restarts': must be at least 0"),
    (["--max-restarts", "1", "--spare-nodes", "1"], "flag '--spare-nodes': 1 spares leave no node"),
    (["--spare-nodes", "0", "--on-straggler", "evict"], "flag '--on-straggler': 'evict' is not one of report, restart"),
    (["--max-restarts", "1", "--revet", "nope.yaml"], "nope.yaml"),
])
def test_bad_restart_flags_are_one_line_and_exit_2(tmp_path, args, needle):
    p = hpcml([*args, "--dir", "job", "--", "touch", "ran"], tmp_path, timeout=60)
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], p.stderr
    assert not (tmp_path / "ran").exists() and not (tmp_path / "job").exists()
