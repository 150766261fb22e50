"""``hpcml run --vet auto``: as much vetting as the job is worth (issue 68).

Why: a 2-node hour and a 256-node week got the same protocol. The cost of vetting grows
with the allocation (every node waits while it runs); what it saves grows with the
allocation and the time left (a bad node left in hurts the whole job). The model prices
three tiers of the protocol, none, ``quick`` (the checks a prolog runs, ``prolog.select_fast``)
and ``full``, and takes the one that saves most, in GPU-hours (node-hours without GPUs):

- expected hurts E = ``rate`` (jobs hurt by a node per node-day held) x nodes x days left;
- the wall hours they cost the whole job: with ``--max-restarts`` each costs the detection,
  the restart and the work since the last checkpoint (``RECOVERY_LOSS_H``), E x that, at
  most the time left; without, the first ends the job (it comes with probability 1 - e^-E),
  losing half the time left (a fault at a uniform moment, nothing saved before it);
- vetting can prevent only the hurts of nodes already bad when the job starts: those of its
  first ``START_H`` hours (assumed), E0; a tier that catches a share c of bad nodes saves what
  E costs less what E - c E0 costs, x nodes x GPUs, and costs its checks' seconds x nodes x
  GPUs, plus the launcher's own ``OVERHEAD_S``; a check costs at most its timeout and a tier
  at most the protocol's deadline (each is stopped there, whatever the fleet measured).

Every figure comes from the collector where it measured it (``GET /v1/plan``: the rate,
each check's mean duration and recall) and otherwise from the defaults below, each named in
the job's report with its source: none is passed off as measured.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpcml import logs
from hpcml.jobmodel import VetAuto, VetTier
from hpcml.vet.protocol import EvalSpec, Protocol
from hpcml.words import plural

log = logs.get(__name__)

#: jobs hurt by a node per node-day: Llama 3 405B's 419 unexpected interruptions in 54 days
#: on 2,048 nodes of 8 H100 GPUs (Meta, "The Llama 3 Herd of Models", 2024), 78% of them hardware
DEFAULT_RATE = 419 / (54 * 2048)
DEFAULT_RATE_SOURCE = "default: Llama 3 405B, 419 unexpected interruptions in 54 days on 2,048 nodes"
#: share of bad nodes a tier catches where the collector measured no recall for its checks
DEFAULT_CATCH = {"quick": 0.5, "full": 0.9}
DEFAULT_CATCH_SOURCE = "default (assumed, not measured)"
#: seconds one check takes where the collector measured none (an assumption, said as one)
DEFAULT_CHECK_S = 5.0
#: seconds hpcml run's vetting adds over a plain srun beside its checks (bench_run.py, 2 nodes)
OVERHEAD_S = 1.0
#: wall hours a hurt costs a job that recovers in its allocation (assumed: a hang's detection,
#: the restart, half an hour's checkpoint interval)
RECOVERY_LOSS_H = 0.5
#: the time left assumed where Slurm gives no limit (outside Slurm, UNLIMITED)
DEFAULT_HOURS = 24.0
AUTO = "auto"
MIN_BAD_NODES = 3               # a recall measured on fewer bad nodes is not used
MIN_NODE_DAYS = 100.0           # a rate measured on fewer node-days of jobs is not used
MIN_HURTS = 3                   # under this many hurts the rate is the rule of three's bound
#: hours within which a node bad when the job starts hurts it (assumed): vetting at the start
#: can prevent those hurts only, not those of nodes that fail later
START_H = 24.0


def gpus_per_node(env: Mapping[str, str] | None = None, visible: int = 0) -> int:
    """Slurm's GPUs on a node (``SLURM_GPUS_ON_NODE``), else those visible here."""
    env = os.environ if env is None else env
    raw = env.get("SLURM_GPUS_ON_NODE", "")
    return int(raw) if raw.isdigit() else visible


def _catch(name: str, checks: list[str], measured: Mapping[str, Any]) -> tuple[float, str]:
    """The share of bad nodes a tier catches: the best recall the collector measured among
    its checks on at least ``MIN_BAD_NODES`` bad nodes (a lower bound: together they may catch
    more); a check it did not measure counts at the default."""
    best: tuple[float, str] | None = None
    unmeasured = False
    for c in checks:
        f = measured.get(c)
        if f is None or f.recall is None or f.bad_nodes < MIN_BAD_NODES:
            unmeasured = True
        elif best is None or f.recall > best[0]:
            best = (f.recall, f"collector: {c} caught {f.caught} of the {f.bad_nodes} bad nodes it ran on")
    if unmeasured and (best is None or DEFAULT_CATCH[name] > best[0]):
        return DEFAULT_CATCH[name], DEFAULT_CATCH_SOURCE
    assert best is not None
    return best


def _check_s(ev: EvalSpec, measured: Mapping[str, Any]) -> float:
    """Seconds one check costs: the collector's mean where it measured one, else the default;
    never past the check's timeout (it is stopped there, whatever the fleet's figure says)."""
    f = measured.get(ev.name)
    return min(f.mean_s if f is not None else DEFAULT_CHECK_S, ev.timeout)


def _rate(plan: Any, why_no_plan: str | None) -> tuple[float, str]:
    """The centre's rate where it held enough jobs to measure one (``MIN_NODE_DAYS``; under
    ``MIN_HURTS`` hurts, the rule of three's 95% upper bound, 3 / node-days), else the default."""
    if plan is not None and plan.node_days >= MIN_NODE_DAYS:
        where = f"{plan.node_days:,.1f} node-days over {plan.window_s / 86400:.0f} d"
        if plan.hurt_jobs >= MIN_HURTS:
            return plan.hurt_jobs / plan.node_days, f"collector: {plan.hurt_jobs} jobs hurt by a node in {where}"
        return 3 / plan.node_days, f"collector: {plan.hurt_jobs} jobs hurt by a node in {where} (rule of three: at most)"
    if plan is not None:
        return DEFAULT_RATE, DEFAULT_RATE_SOURCE + f" (the collector held {plan.node_days:,.1f} node-days of jobs)"
    return DEFAULT_RATE, DEFAULT_RATE_SOURCE + (f" (no plan: {why_no_plan})" if why_no_plan else "")


def decide(proto: Protocol, *, nodes: int, gpus: int, seconds_left: float | None, restarts: bool,
           plan: Any = None, why_no_plan: str | None = None) -> VetAuto:
    """The tier that saves most for this job (ties: the cheaper), with every number."""
    from hpcml.vet.prolog import select_fast
    measured = {c.name: c for c in plan.checks} if plan is not None else {}
    rate, rate_source = _rate(plan, why_no_plan)
    hours = DEFAULT_HOURS if seconds_left is None else seconds_left / 3600
    hours_source = "default (no time limit known)" if seconds_left is None else "Slurm: TimeLimit less RunTime"
    if restarts:
        loss, loss_source = min(RECOVERY_LOSS_H, hours), "default: --max-restarts recovers in the allocation (assumed)"
    else:
        loss, loss_source = hours / 2, "half the time left (no --max-restarts)"
    hurts = rate * nodes * hours / 24
    at_start = rate * nodes * min(hours, START_H) / 24      # what vetting can prevent: nodes bad already
    width = nodes * max(gpus, 1)

    def lost(expected: float) -> float:
        """Wall hours the job expects to lose to ``expected`` hurts: with restarts each
        costs ``loss`` (at most the whole time left); without, the first one ends the job
        (Poisson: it comes with probability 1 - e^-expected), losing half the time left."""
        return min(expected * loss, hours) if restarts else -math.expm1(-expected) * hours / 2

    fast, _ = select_fast(proto)
    tiers = [VetTier(name="none", catch_source="")]
    floor = 0.0
    for name, evals in (("quick", fast), ("full", proto.evals)):
        if not evals or (name == "quick" and len(evals) == len(proto.evals)):
            continue                                # a protocol of fast checks only: it is its own full tier
        names = [e.name for e in evals]
        secs = OVERHEAD_S + min(sum(_check_s(e, measured) for e in evals), proto.deadline)
        catch, source = _catch(name, names, measured)
        if catch < floor:                           # full runs every quick check: it catches at least as much
            catch, source = floor, "at least the quick tier's"
        floor = catch
        cost = width * secs / 3600
        saved = (lost(hurts) - lost(hurts - catch * at_start)) * width
        tiers.append(VetTier(name=name, checks=names, seconds=round(secs, 2), catch=round(catch, 4),
                             catch_source=source, cost_h=round(cost, 4), saved_h=round(saved, 4),
                             net_h=round(saved - cost, 4)))
    best = max(tiers, key=lambda t: (t.net_h, -t.cost_h))
    note = ""
    if not restarts and hurts >= 1 and len(tiers) > 1:
        best = tiers[-1]                # beyond the model: a job that expects to be hurt takes every check
        note = (f"expects {hurts:.3g} hurts and has no --max-restarts: it is unlikely to finish; every check "
                "runs, and --max-restarts would let it recover in its allocation")
    return VetAuto(protocol=proto.name, nodes=nodes, gpus_per_node=gpus, hours=round(hours, 3),
                   hours_source=hours_source, rate_per_node_day=round(rate, 6), rate_source=rate_source,
                   loss_h=round(loss, 3), loss_source=loss_source, expected_hurts=round(hurts, 5),
                   unit="GPU-h" if gpus else "node-h", tiers=tiers, chosen=best.name, note=note)


def chosen_protocol(proto: Protocol, auto: VetAuto) -> Protocol | None:
    """The protocol cut to the chosen tier (None: no vetting)."""
    tier = next(t for t in auto.tiers if t.name == auto.chosen)
    if tier.name == "none":
        return None
    keep = set(tier.checks)
    from dataclasses import replace
    return replace(proto, evals=[e for e in proto.evals if e.name in keep])


def lines(auto: VetAuto) -> list[str]:
    """The model in words, for the log and the report."""
    width = plural(auto.nodes, "node") + (f" x {plural(auto.gpus_per_node, 'GPU')}" if auto.gpus_per_node else "")
    out = [f"vet auto: {auto.chosen} ({width}, {auto.hours:.1f} h left; "
           f"{auto.expected_hurts:.3g} expected hurts at {auto.rate_per_node_day:.4g} a node-day, "
           f"{auto.loss_h:.2f} h lost to a hurt)",
           f"  rate: {auto.rate_source}; time: {auto.hours_source}; loss: {auto.loss_source}"]
    if auto.note:
        out.append(f"  note: {auto.note}")
    for t in auto.tiers:
        if t.name == "none":
            continue
        out.append(f"  {t.name}: {len(t.checks)} checks, {t.seconds:.1f} s; catches {t.catch:.0%} "
                   f"({t.catch_source}); costs {t.cost_h:.3g} {auto.unit}, saves {t.saved_h:.3g}, "
                   f"net {t.net_h:+.3g}" + (" <- chosen" if t.name == auto.chosen else ""))
    return out


def split(value: str) -> Path | None:
    """``--vet auto`` -> the built-in protocol (None); ``--vet auto:PATH`` -> PATH; anything
    else is not auto (raises ValueError)."""
    if value == AUTO:
        return None
    if value.startswith(AUTO + ":") and len(value) > len(AUTO) + 1:
        return Path(value[len(AUTO) + 1:])
    raise ValueError(value)


def builtin_protocol() -> Path:
    """The protocol ``--vet auto`` prices when given none: the CPU one (a GPU site names its
    own, ``--vet auto:gpu.yaml``)."""
    return Path(__file__).parent / "protocols" / "cpu.yaml"
