"""Retiring a node where tasks keep failing: ``nodes/NODE.bad`` (no worker takes tasks
there any more), with the verdict of ``hpcml vet --prolog`` run on it at that moment."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hpcml.farm.model import NODES
from hpcml.files import write_atomic
from hpcml.schemas import tag

NODE_SCHEMA = tag("farm.node", 1)


def retire(farm: Path, node: str, worker: str, reason: str, vet: dict[str, Any] | None = None) -> None:
    """``vet``: the node's verdict when the caller has it already (else it is taken now).
    ``hpcml farm run`` tells the centre's collector at its end (``centre: null`` until then)."""
    doc = {"schema": NODE_SCHEMA, "node": node, "worker": worker, "time": time.time(), "reason": reason,
           "vet": vet if vet is not None else vet_this_node(), "centre": None}
    write_atomic(Path(farm) / NODES / f"{node}.bad", json.dumps(doc) + "\n")


def vet_this_node(timeout: float = 60.0) -> dict[str, Any]:
    """``hpcml vet --prolog --json`` on a node being retired: its exit code (1: the node is
    bad) and verdict go into nodes/NODE.bad, so the operator sees whether the node or the
    tasks are to blame, and decide, where no other node ran the failed tasks, whether to retire
    it at all. With ``HPCML_VET_REPORT_TO`` set (inherited), ``hpcml vet`` also sends the
    results to the centre's collector. Nothing is drained: that is the operator's call."""
    try:
        p = subprocess.run([sys.executable, "-m", "hpcml", "vet", "--prolog", "--json"], capture_output=True,
                           text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"exit_code": None, "problem": str(exc)}
    try:
        report = json.loads(p.stdout)
    except ValueError:
        report = None
    out: dict[str, Any] = {"exit_code": p.returncode}
    if isinstance(report, dict):
        out["report"] = report
    elif p.stderr.strip():
        out["problem"] = p.stderr.strip().splitlines()[-1]
    return out
