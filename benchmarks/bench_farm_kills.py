"""How often a farm task runs twice when the farm is killed: ``kill -9`` of ``hpcml farm
run``'s process group at random moments, many times (issue 68).

    python benchmarks/bench_farm_kills.py [--kills 500] [--slots 2] [--task-s 0.2] [--seed 1]

A farm of short tasks (``sleep TASK_S`` then one O_APPEND line "ID ATTEMPT" into a side
file, then exit), run by ``hpcml farm run`` as a job script starts it (a process group of
its own), killed with SIGKILL at a uniformly random moment of its life, and started again,
``--kills`` times; then run to the end. The count is the task's own: a task ran twice when
its side file has more than one line (its last act before exit was done by two attempts).
Every task must end "ok" exactly once (checked). Writes benchmarks/results/farm_kills.json:
kills, tasks, tasks run twice, the rate per kill and per task, and the wall time.

A task killed after its append and before its exit is run again by any farm (it did not
end); what the farm controls is the window between a task's exit and its end record.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
HPCML = [sys.executable, "-m", "hpcml"]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _farm_alive(farm: Path) -> bool:
    """Any process (agent, guard, worker, task) still naming the farm or its tasks' marker."""
    mark = str(farm)
    for p in psutil.process_iter(["cmdline", "environ", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE or p.pid == os.getpid():
                continue
            if any(mark in a for a in p.info["cmdline"] or ()) or (p.info["environ"] or {}).get("HPCML_FARM_DIR") == mark:
                return True
        except psutil.Error:
            continue
    return False


def _wait_gone(farm: Path, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while _farm_alive(farm):
        if time.monotonic() > end:
            sys.exit(f"the farm's processes outlived it by {timeout} s")
        time.sleep(0.02)


def ends(farm: Path) -> dict[tuple[int, int], str]:
    out = {}
    for f in (farm / "ends").iterdir():
        if f.name.startswith("."):
            continue
        tid, att = f.name.split(".")
        out[(int(tid), int(att))] = json.loads(f.read_text())["outcome"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=500)
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--task-s", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "farm_kills.json")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    work = Path(tempfile.mkdtemp(prefix="farm-kills-"))
    farm, side = work / "farm", work / "side"
    # enough tasks that the farm never runs dry while it is killed (a kill comes within 2
    # task lengths of the first claim: a few tasks end per kill), few enough to finish fast
    n = max(200, a.kills * 2)
    script = work / "task.sh"
    script.write_text(f"sleep {a.task_s}\necho $HPCML_FARM_TASK_ID $HPCML_FARM_ATTEMPT >> {side}\n")
    (work / "tasks.txt").write_text(f"sh {script}\n" * n)
    subprocess.run(HPCML + ["farm", "create", str(farm), str(work / "tasks.txt")], check=True, env=_env(),
                   stdout=subprocess.DEVNULL)
    t0 = time.monotonic()
    for k in range(a.kills):
        run = subprocess.Popen(HPCML + ["farm", "run", str(farm), "--slots", str(a.slots)], env=_env(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        claims = len(os.listdir(farm / "claims"))
        started = time.monotonic() + 30
        while len(os.listdir(farm / "claims")) == claims and time.monotonic() < started:
            time.sleep(0.01)                                  # its first task claimed: the farm is running
        time.sleep(rng.uniform(0.0, 2 * a.task_s))            # then any moment of its tasks' lives
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
        _wait_gone(farm)
        if (k + 1) % 50 == 0:
            print(f"{k + 1} kills, {len(ends(farm))} ends", flush=True)
    p = subprocess.run(HPCML + ["farm", "run", str(farm), "--slots", str(a.slots)], env=_env(),
                       capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"the last farm run failed: {p.stderr[-2000:]}")
    wall = time.monotonic() - t0
    rec = ends(farm)
    ok = Counter(t for (t, _), o in rec.items() if o == "ok")
    if sorted(ok) != list(range(n)) or max(ok.values()) != 1:
        sys.exit("not every task ended ok exactly once")
    lines = Counter(int(line.split()[0]) for line in side.read_text().splitlines())
    twice = sorted(t for t, c in lines.items() if c > 1)
    doc = {"schema": "hpcml.bench.farm_kills/1", "kills": a.kills, "tasks": n, "slots": a.slots, "task_s": a.task_s,
           "tasks_run_twice": len(twice), "per_kill": round(len(twice) / a.kills, 4),
           "per_task": round(len(twice) / n, 5), "lost_attempts": sum(o == "lost" for o in rec.values()),
           "wall_s": round(wall, 1), "seed": a.seed}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
