"""Retiring a node where tasks keep failing: ``nodes/NODE.bad`` (no worker takes tasks
there any more), with the verdict of ``hpcml vet --prolog`` run on it at that moment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hpcml import logs
from hpcml.farm.model import NODES
from hpcml.files import write_atomic
from hpcml.schemas import tag

NODE_SCHEMA = tag("farm.node", 1)
log = logs.get(__name__)


#: the check the farm's evidence is stored under at the centre (its type: ``farm``)
FARM_CHECK = "farm-tasks"


def retire(farm: Path, node: str, worker: str, reason: str, vet: dict[str, Any] | None = None) -> None:
    """``vet``: the node's verdict when the caller has it already (else it is taken now).
    The evidence also goes to the centre's collector where one is named (``tell_centre``)."""
    now = time.time()
    doc = {"schema": NODE_SCHEMA, "node": node, "worker": worker, "time": now, "reason": reason,
           "vet": vet if vet is not None else vet_this_node()}
    doc["centre"] = tell_centre(node, reason, now)
    write_atomic(Path(farm) / NODES / f"{node}.bad", json.dumps(doc) + "\n")


def tell_centre(node: str, reason: str, when: float, timeout: float = 5.0) -> str | None:
    """Send the retirement to the collector of ``$HPCML_COLLECTOR`` (``hpcml run``'s) as a
    node report of the farm's Slurm job: check ``farm-tasks``, type ``farm``, failed, the
    reason as its message. Signed with the user's MUNGE credential, the collector proves it
    as the user's report of their own job on its node (job evidence: a rule counts it only
    with ``match.users``, never alone). What became of it, or None where no collector is
    named; never raises: the farm goes on either way."""
    from hpcml.centre.client import post_report
    from hpcml.run.config import URL_ENV
    from hpcml.run.summary import collector_token
    url = (os.environ.get(URL_ENV) or "").strip().rstrip("/")
    if not url:
        return None
    report = {"job_id": os.environ.get("SLURM_JOB_ID"), "node": node, "time": when, "protocol": "farm",
              "verdict": "bad", "results": [{"name": FARM_CHECK, "type": "farm", "outcome": "fail",
                                             "message": reason[:4096]}]}
    refused = post_report(report, url, collector_token(), time.monotonic() + timeout)
    if refused is not None:
        log.warning("hpcml farm: node %s retired; not told to the collector at %s: %s", node, url, refused.why)
        return f"not sent to {url}: {refused.why}"
    return f"sent to {url}"


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
