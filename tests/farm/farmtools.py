"""Helpers of the farm tests: the real CLI in a subprocess, and the side file each task
appends one line to (O_APPEND, one write), which is how "exactly once" is counted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This interpreter's hpcml (the checkout's src first), outside any Slurm job."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT), e.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    e["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{e.get('PATH', '')}"
    e.update(extra or {})
    return e


def hpcml(*args, timeout: float = 300, extra: dict[str, str] | None = None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcml", *map(str, args)], capture_output=True, text=True,
                          env=env(extra), timeout=timeout, cwd=cwd)


def start(*args, extra: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "hpcml", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env(extra))


def side_task(side: Path, tid_note: str = "$HPCML_FARM_TASK_ID", before: str = "") -> str:
    """A task command that appends 'ID ATTEMPT' to ``side`` as its last action."""
    return f"{before}echo {tid_note} $HPCML_FARM_ATTEMPT >> {side}"


def side_lines(side: Path) -> list[tuple[int, int]]:
    if not side.exists():
        return []
    return [(int(a), int(b)) for a, b in (line.split() for line in side.read_text().splitlines())]


def ends(farm: Path) -> dict[tuple[int, int], dict]:
    out = {}
    for f in (farm / "ends").iterdir():
        if not f.name.startswith("."):
            tid, att = f.name.split(".")
            out[(int(tid), int(att))] = json.loads(f.read_text())
    return out


def assert_exactly_once(farm: Path, side: Path, n: int) -> None:
    """Every task ended "ok" in exactly one attempt and its side line is there exactly once
    for that attempt; a second line of a task may only come from an attempt the farm
    recorded as lost (killed with its worker after its append, before its exit)."""
    rec = ends(farm)
    ok = Counter(tid for (tid, _), e in rec.items() if e["outcome"] == "ok")
    assert sorted(ok) == list(range(n)), f"tasks not ok: {sorted(set(range(n)) - set(ok))[:10]}"
    assert max(ok.values()) == 1, [t for t, c in ok.items() if c > 1]
    lines = side_lines(side)
    ok_attempt = {tid: att for (tid, att), e in rec.items() if e["outcome"] == "ok"}
    counted = Counter(tid for tid, att in lines if ok_attempt.get(tid) == att)
    assert all(counted[t] == 1 for t in range(n)), [t for t in range(n) if counted[t] != 1][:10]
    for tid, att in lines:
        if ok_attempt.get(tid) != att:
            assert rec.get((tid, att), {}).get("outcome") == "lost", (tid, att, rec.get((tid, att)))


def wait_for(cond, timeout: float = 60.0, what: str = "condition") -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.05)
    raise TimeoutError(f"{what} not reached in {timeout} s")


def count_ends(farm: Path) -> int:
    return sum(1 for f in os.listdir(farm / "ends") if not f.startswith("."))
