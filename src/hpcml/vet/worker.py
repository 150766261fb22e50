"""The per-node side of a vetting run: ``python -m hpcml.vet.worker``.

srun starts one worker per node. It imports the checks named in ``HPCML_VET_PRELOAD``,
then reads the resolved protocol (one JSON line) from stdin, runs each check in a forked child under its own timeout
(the few marked ``inline``, which only read kernel values, in the worker itself),
stops before the run's deadline, and prints its report on
stdout (``hpcml.vet.wire``), which srun carries back to the launcher. No coordinator, no port, no shared
filesystem needed for node checks. It imports only what the checks it runs need.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import time
from typing import Any

from hpcml.vet.model import CheckReport, CheckResult, NodeReport, Outcome
from hpcml.vet.wire import PRELOAD_ENV

#: time kept back from the deadline so the result line still reaches the launcher
MARGIN = 0.5


def _run_one(ev: dict[str, Any], ctx_fields: dict[str, Any]) -> dict[str, Any]:
    """Executed in the forked child: build the check and run it."""
    from dataclasses import asdict

    from hpcml.vet import registry
    from hpcml.vet.checks.base import CheckContext
    cls = registry.load(ev["check"])
    ctx = CheckContext(**ctx_fields, extra={"name": ev["name"]})
    start = time.time()
    report = cls(cls.worker_params(ev["params"]), ctx).run()
    report.details["_duration"] = round(time.time() - start, 4)
    d = asdict(report)
    d["outcome"] = report.outcome.value
    return d


def _inline(ev: dict[str, Any]) -> bool:
    from hpcml.vet import registry
    try:
        return bool(registry.load(ev["check"]).inline)
    except Exception:  # noqa: BLE001 - the forked child reports the import error
        return False


def _run_inline(ev: dict[str, Any], ctx_fields: dict[str, Any]) -> Any:
    """A check that cannot block, run in the worker: what it raises is its error outcome."""
    from hpcml.vet.isolate import ChildFailed, Interrupted, interrupted
    if interrupted():
        return Interrupted("interrupted before it started")
    try:
        # the worker's stdout carries its report: what a check prints goes to stderr
        with contextlib.redirect_stdout(sys.stderr):
            return _run_one(ev, ctx_fields)
    except KeyboardInterrupt:
        return Interrupted("interrupted while it ran")
    except Exception as exc:  # noqa: BLE001 - as the forked child reports it
        text = str(exc).strip()
        return ChildFailed(type(exc).__name__, text.splitlines()[0] if text else "")


def _error(exc_name: str, msg: str) -> CheckReport:
    if exc_name == "MissingDependency":
        return CheckReport(Outcome.ERROR, message=f"missing dependency: {msg}")
    if exc_name in ("ImportError", "ModuleNotFoundError"):
        return CheckReport(Outcome.ERROR, message=f"missing dependency: {msg} (run `hpcml vet setup`)")
    return CheckReport(Outcome.ERROR, message=f"check raised {exc_name}: {msg}" if msg else
                       f"check raised {exc_name}")


def _report(ev: dict[str, Any], budget: float, outcome: Any) -> CheckReport:
    from hpcml.vet.isolate import ChildFailed, Interrupted, Timeout
    if isinstance(outcome, Interrupted):
        return CheckReport(Outcome.ERROR, message=f"interrupted: {outcome}")
    if isinstance(outcome, Timeout):
        cut = budget < ev["timeout"]
        said = (f"stopped at the run's deadline after {budget:.1f} s" if cut else
                f"timed out after {ev['timeout']:g} s")
        return CheckReport(Outcome.ERROR, message=said + _starved(outcome, budget),
                           details=_sched(outcome, budget))
    if isinstance(outcome, ChildFailed):
        return _error(*outcome.args[:2]) if len(outcome.args) >= 2 else \
            CheckReport(Outcome.ERROR, message=str(outcome.args[0]))
    outcome["outcome"] = Outcome(outcome["outcome"])
    return CheckReport(**outcome)


#: a check that spent more than this share of its time waiting for a CPU was starved
STARVED = 0.5


def _sched(outcome: Any, budget: float) -> dict[str, Any]:
    if outcome.ran_s is None:
        return {}
    return {"cpu_s": round(outcome.ran_s, 3), "cpu_wait_s": round(outcome.waited_s, 3),
            "starved": outcome.waited_s >= STARVED * budget}


def _starved(outcome: Any, budget: float) -> str:
    """Says whether the time ran out waiting for a CPU: the node's CPUs were oversubscribed
    (vetting workers of many virtual nodes on one host, another job's processes), which is not
    the check's hang. Still an error: fail closed."""
    sched = _sched(outcome, budget)
    if not sched.get("starved"):      # a hang: the details keep the figures
        return ""
    return (f", waiting for a CPU: it waited {sched['cpu_wait_s']:.1f} s and ran "
            f"{sched['cpu_s']:.2f} s (the node's CPUs are oversubscribed)")


def run_checks(evals: list[dict[str, Any]], ctx_fields: dict[str, Any],
               deadline_at: float) -> list[CheckResult]:
    """Run evals side by side, each in its own child with its timeout (never past the
    deadline), and judge their severity."""
    from hpcml.vet.isolate import run_many
    start = time.time()
    budget = {ev["name"]: min(ev["timeout"], deadline_at - start - MARGIN) for ev in evals}
    runnable = [ev for ev in evals if budget[ev["name"]] > 0]
    inline = [ev for ev in runnable if _inline(ev)]
    forked = [ev for ev in runnable if ev not in inline]
    outcomes = {ev["name"]: _run_inline(ev, ctx_fields) for ev in inline}   # microseconds: first
    outcomes.update(zip([ev["name"] for ev in forked], run_many(
        [(functools.partial(_run_one, ev, ctx_fields), budget[ev["name"]]) for ev in forked])))
    took = round(time.time() - start, 4)
    results = []
    for ev in evals:
        if ev["name"] in outcomes:
            report = _report(ev, budget[ev["name"]], outcomes[ev["name"]])
        else:
            report = CheckReport(Outcome.ERROR, message="not run: the run's deadline was reached")
        if report.outcome is Outcome.FAIL and ev.get("severity") == "warn":
            report.outcome = Outcome.WARN
        ran = report.details.pop("_duration", took)      # the forked child's own timing
        results.append(CheckResult(
            node=ctx_fields["node"], check=ev["name"], type=ev["type"], outcome=report.outcome,
            value=report.value, threshold=report.threshold, unit=report.unit,
            duration=ran if isinstance(ran, (int, float)) else took, message=report.message,
            details=report.details))
    return results


def run_check(ev: dict[str, Any], ctx_fields: dict[str, Any], deadline_at: float) -> CheckResult:
    return run_checks([ev], ctx_fields, deadline_at)[0]


def _preload(checks: list[str]) -> None:
    """Import the check modules (and what they will import) once, before forking, so each
    child inherits them."""
    import importlib

    from hpcml.vet import registry
    for path in checks:
        try:
            for module in registry.load(path).warm_imports:
                importlib.import_module(module)
        except Exception:  # the child reports it, as this check's error
            pass


def run_node(spec: dict[str, Any], ctx_fields: dict[str, Any]) -> NodeReport:
    _preload([ev["check"] for ev in spec["evals"]])
    # light checks side by side, then measurements one at a time so they do not disturb
    # each other; results keep the protocol's order
    shared = [ev for ev in spec["evals"] if not ev.get("exclusive")]
    done = {r.check: r for r in run_checks(shared, ctx_fields, spec["deadline_at"])}
    for ev in spec["evals"]:
        if ev.get("exclusive"):            # (after an interrupt, run_many starts nothing more)
            done[ev["name"]] = run_checks([ev], ctx_fields, spec["deadline_at"])[0]
    results = [done[ev["name"]] for ev in spec["evals"]]
    return NodeReport(node=ctx_fields["node"], results=results, sent_at=time.time())


def context_fields(spec: dict[str, Any], env=os.environ) -> dict[str, Any]:
    from hpcml.cluster.allocation import task_gpus, this_node
    node = this_node(env)
    nodes = tuple(spec.get("nodes") or (node,))
    return {"node": node, "nodes": nodes, "rank": nodes.index(node) if node in nodes else 0,
            "workdir": spec.get("workdir"), "gpus": task_gpus(env),
            "require_gpus": spec.get("require_gpus", False)}


def _free_port() -> int | None:
    """A TCP port free on this node now, sent beside the results: ``hpcml run`` gives it to
    rank 0 when this node is rank 0's (its rendezvous), without a step of its own to ask the
    node. Not part of the vetting report."""
    from hpcml.ports import free_port
    try:
        return free_port()
    except OSError:
        return None


def main() -> int:
    _preload([p for p in os.environ.get(PRELOAD_ENV, "").split(",") if p])
    raw = sys.stdin.readline()
    if not raw.strip():  # the launcher found the protocol invalid: run nothing
        return 0
    spec = json.loads(raw)
    report = run_node(spec, context_fields(spec))
    from hpcml.vet import wire
    sys.stdout.write(wire.encode(report.node, {**report.to_dict(), "free_port": _free_port()}))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
