"""Prolog / HealthCheckProgram mode: the fast checks of a protocol on this node, in a budget.

Slurm runs the prolog as root on every node of a new allocation (``PrologFlags=Alloc``)
and must see it end before ``BatchStartTimeout`` (default 10 s); a non-zero exit drains the
node ("Prolog error") and requeues the job. ``HealthCheckProgram`` runs the same command
every ``HealthCheckInterval``, but Slurm ignores its exit code: there the node drains only
if we drain it ourselves (``drain=True``).

Only checks marked fast run: an eval's ``fast:`` key, else the check class's ``fast``
attribute (plugins), else ``FAST_TYPES``. Checks of the whole allocation (collectives) and
those that need the other nodes' results (``clock``) never run here. All of them start
side by side in forked children (``worker.run_checks``), each under its own timeout and
all under one budget counted from the start of this process (interpreter start-up
included). A check still running at the budget is killed and reported as ``error`` "did
not finish within the prolog budget"; by default that makes the node bad too, since a
node too slow to vet is suspect (``overrun_ok=True`` only reports it). A node on which no check
ran or every one was skipped is not bad (exit 0: nothing to drain for) but not healthy either:
``healthy`` is null, the line says "not vetted" and the collector is told ``unchecked``.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from typing import Any

from hpcml.schemas import DRAIN_CHECK, DRAIN_TYPE, tag
from hpcml.vet import registry, verdict
from hpcml.vet.model import CheckResult, NodeReport, Outcome
from hpcml.vet.protocol import EvalSpec, Protocol

DEFAULT_BUDGET = 5.0
#: check types cheap enough for a prolog (a few ms to ~1 s, no throughput measurement)
FAST_TYPES = frozenset({"memory", "load", "disk", "mounts", "env", "processes", "gpu", "xid"})
#: kept back from the budget to judge, print, and set the drain reason
RESERVE = 0.3
OVERRUN = "did not finish within the prolog budget"
#: where scontrol lives when the prolog's PATH is minimal
SBIN_PATH = "/usr/bin:/usr/local/bin:/bin:/opt/slurm/bin"
EXIT_OK, EXIT_BAD, EXIT_DRAIN_FAILED = 0, 1, 3


@dataclass
class PrologResult:
    node: str
    results: list[CheckResult]
    bad: list[str]                    # one line per reason the node is bad
    duration: float                   # seconds since this process started
    budget: float
    skipped: list[str] = field(default_factory=list)   # checks not fast enough for a prolog
    drained: str | None = None        # the reason set with scontrol, if any
    drain_failed: str | None = None   # why scontrol could not drain a bad node (--drain)
    job_id: str | None = None         # none under HealthCheckProgram
    notes: list[str] = field(default_factory=list)

    @property
    def checked(self) -> bool:
        """Whether any check measured something: a pass, warning or failure (not every one
        skipped or broken, not none run)."""
        return any(r.outcome in (Outcome.PASS, Outcome.WARN, Outcome.FAIL) for r in self.results)

    @property
    def healthy(self) -> bool | None:
        """False: bad; None: nothing was checked, so nothing is known; True: checked and not bad."""
        return False if self.bad else True if self.checked else None

    @property
    def exit_code(self) -> int:
        return EXIT_DRAIN_FAILED if self.drain_failed else EXIT_BAD if self.bad else EXIT_OK

    def node_report(self, protocol: str, started: float) -> dict[str, Any]:
        """This run as the collector's node report (``collector.schema.NodeReport``): its
        verdict ``unchecked`` where nothing was checked, since unknown is never good."""
        results = [{"name": r.check, "type": r.type, "outcome": r.outcome.value,
                    "value": r.value if isinstance(r.value, (int, float, str)) else None,
                    "unit": r.unit, "message": (r.message or "")[:4096], "duration": r.duration}
                   for r in self.results]
        if self.drained or self.drain_failed:     # its own drain, for the handler and the centre report
            results.append({"name": DRAIN_CHECK, "type": DRAIN_TYPE, "outcome": "fail" if self.drained else "error",
                            "message": (self.drained or f"drain failed: {self.drain_failed}")[:4096]})
        return {"job_id": self.job_id, "node": self.node, "time": started, "protocol": protocol,
                "verdict": {False: "bad", True: "good", None: "unchecked"}[self.healthy], "results": results}

    def to_json(self) -> dict[str, Any]:
        return {"schema": tag("vet.prolog", 1), "node": self.node,
                "job_id": self.job_id, "healthy": self.healthy,
                "exit_code": self.exit_code, "duration": round(self.duration, 3),
                "budget": self.budget, "bad": self.bad, "skipped": self.skipped,
                "drained": self.drained, "drain_failed": self.drain_failed, "notes": self.notes,
                "results": [r.to_dict() for r in self.results]}


def is_fast(ev: EvalSpec) -> bool:
    """Whether an eval runs in prolog mode (see the module docstring)."""
    if ev.scope != "node" or ev.type == "clock":
        return False
    if ev.fast is not None:
        return ev.fast
    declared = getattr(registry.load(ev.check), "fast", None)
    return bool(declared) if declared is not None else ev.type in FAST_TYPES


def select_fast(protocol: Protocol) -> tuple[list[EvalSpec], list[EvalSpec]]:
    """The protocol's evals split into (fast, not run in a prolog)."""
    fast = [e for e in protocol.evals if is_fast(e)]
    return fast, [e for e in protocol.evals if e not in fast]


def process_start() -> float:
    """Wall-clock time this process started: the budget includes the interpreter start-up."""
    try:
        import psutil
        return psutil.Process().create_time()
    except Exception:  # psutil missing or /proc unreadable: count from now
        return time.time()


def _mark_overruns(results: list[CheckResult], budget: float) -> None:
    for r in results:
        if r.outcome is Outcome.ERROR and r.message.startswith(("stopped at the run's deadline",
                                                               "not run: the run's deadline")):
            r.message = f"{OVERRUN} ({budget:g} s)"
            r.details["budget_overrun"] = True


def run_prolog(protocol: Protocol, *, budget: float = DEFAULT_BUDGET, started: float | None = None,
               overrun_ok: bool = False, drain: bool = False, env=None) -> PrologResult:
    """Run the fast checks of ``protocol`` on this node and judge it; never raises for a
    check's failure. ``started``: when the budget began (default: this process's start)."""
    from hpcml.vet.worker import context_fields, run_checks
    env = os.environ if env is None else env
    t0 = process_start() if started is None else started
    fast, slow = select_fast(protocol)
    spec: dict[str, Any] = {"nodes": [], "workdir": None, "require_gpus": protocol.require_gpus}
    ctx = context_fields(spec, env)
    # run_checks keeps its own margin (worker.MARGIN) on top of RESERVE
    results = run_checks([e.to_dict() for e in fast], ctx, t0 + budget - RESERVE) if fast else []
    _mark_overruns(results, budget)
    count_errors = {e.name: e.count_errors for e in fast}
    if overrun_ok:
        count_errors.update({r.check: False for r in results if r.details.get("budget_overrun")})
    report = NodeReport(node=ctx["node"], results=results)
    out = PrologResult(node=ctx["node"], results=results, budget=budget,
                       bad=verdict.reasons(report, count_errors), duration=0.0,
                       skipped=[e.name for e in slow], job_id=env.get("SLURM_JOB_ID"))
    if not fast:
        out.notes.append(f"protocol '{protocol.name}' has no fast checks: nothing vetted")
    elif not out.checked:
        why = next((r.message for r in results if r.message), "")
        out.notes.append(f"all {len(results)} fast checks were skipped: nothing vetted" + (f" (e.g. {why})" if why else ""))
    if out.bad and drain:
        out.drained, out.drain_failed = drain_node(out.node, out.bad, timeout=max(0.5, t0 + budget - time.time()))
    out.duration = time.time() - t0
    return out


def drain_reason(bad: list[str], limit: int = 200) -> str:
    """One short line for ``scontrol ... reason=``: Slurm shows it in ``sinfo -R``."""
    text = "hpcml: " + "; ".join(bad)
    text = " ".join(text.replace('"', "'").split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def drain_node(node: str, bad: list[str], timeout: float = 2.0) -> tuple[str | None, str | None]:
    """``scontrol update nodename=NODE state=drain reason="hpcml: ..."``.

    Slurm drains a node whose prolog fails with the reason "Prolog error"; a node drained
    first keeps our reason, which names the check. A node already drained or down is left as
    it is (as a health check, this runs on drained nodes too): a person's drain stays theirs,
    and hpcml's first drain stands, so what resumes the node is what drained it (a rule that
    wants a person must not be turned into a prolog drain the handler resumes by itself).
    Returns (reason set, note on failure); (None, None) when it was drained already.
    """
    from hpcml.cluster import slurm
    from hpcml.errors import SlurmError
    scontrol = shutil.which("scontrol") or shutil.which("scontrol", path=SBIN_PATH)
    if scontrol is None:
        return None, "cannot set the drain reason: scontrol not found"
    reason = drain_reason(bad)
    started = time.monotonic()
    try:
        shown = slurm.run([scontrol, "show", "-o", "node", node], timeout=timeout).stdout
    except SlurmError as exc:
        return None, f"cannot set the drain reason: {exc}"
    state = shown.split("State=", 1)[1].split()[0].upper() if "State=" in shown else ""
    if "DRAIN" in state or "DOWN" in state:
        return None, None               # drained already (HealthCheckNodeState=ANY runs us there): that drain stays
    try:
        slurm.run([scontrol, "update", f"nodename={node}", "state=drain", f"reason={reason}"],
                  timeout=max(0.5, timeout - (time.monotonic() - started)))
    except SlurmError as exc:
        return None, f"cannot set the drain reason: {exc}"
    return reason, None
