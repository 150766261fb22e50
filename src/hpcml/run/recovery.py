"""``hpcml run --max-restarts N``: a job that recovers inside its own allocation.

NVRx's in-job restart keeps the allocation and restarts the workload but does not know which
node was at fault; torchrun's elastic agent restarts ranks on the same nodes; submitit and
``--requeue`` go back through the queue. Here an attempt that ends in a fault (a crash, a
hang the live watch stopped, a straggler with ``--on-straggler restart``, a node Slurm lost)
is followed by another in the same job directory, on the nodes left once the suspects are
out:

* the **suspects** are the nodes of the culprits the watch named (a crashed rank's, a hang's
  culprits', a straggler's) or the nodes Slurm reports lost. A lost node stays out. The
  others are vetted again (``--revet``, default the run's ``--vet`` protocol): one that
  passes returns as the last spare, one that fails stays out, and one named a second time
  stays out whatever its vetting says. Without a protocol a suspect stays out: nothing says
  it is good;
* the next attempt runs on as many nodes as the first (the good ones, then spares), or on
  fewer when ``--min-nodes`` allows; below that the job ends;
* a fault of the same kind at the same step (within one) as the one before is counted as
  a recurrence: the script's, not the nodes' (a bug that fires at step 30 fires on any
  node). After ``RECURRENCES`` of them the job ends, whatever restarts are left.

Outside Slurm (local tasks) there is one node: nothing is excluded, the ranks are restarted
in place, as torchrun's ``--max-restarts`` does.

Everything decided goes into the attempt's ``restart`` record in run.json; the report
shows every attempt from those.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcml import logs
from hpcml.jobmodel import Attempt, Fault, Restart, Resumed, ResumeSplit, Revet
from hpcml.words import plural

log = logs.get(__name__)

ON_STRAGGLER = ("report", "restart")
RECURRENCES = 2          # the same fault at the same step this many times again: the job ends


def fault_of(rec: Attempt) -> Fault | None:
    """The fault that ended an attempt, from its record; None when it ended well or was
    stopped from outside (TERM or INT: Ctrl-C, scancel, the time limit; a requeue). An attempt
    the launcher stopped (``stopped_at``: a hang, a straggler, a lost node) did not end well
    even when its ranks exited 0 (a script that checkpoints on TERM and leaves)."""
    if (rec.exit_code == 0 and not rec.stopped_at) or rec.requeued or rec.aborted:
        return None
    if any(s in ("SIGTERM", "SIGINT") for s in rec.signals_forwarded or ()):
        return None
    step = rec.furthest_step
    lost = rec.lost_nodes or {}
    if lost:
        first = min(lost.values(), key=lambda v: v.seen or 0)
        # when it began: the node's last sign of life (its ranks' last record, in the watch's
        # event), not when Slurm marked it; detected: when Slurm's state said so
        signs = [e.began for e in rec.timeline or [] if e.kind == "node" and e.node in lost and e.began is not None]
        return Fault(kind="node", what=f"Slurm lost {plural(len(lost), 'node')}: "
                     + ", ".join(f"{n} ({v.state})" for n, v in lost.items()),
                     nodes=sorted(lost), step=step, began=min(signs, default=first.seen), detected=first.seen)
    events = rec.timeline or []
    hang = rec.hang
    if hang is not None and hang.action == "stop":
        culprits = hang.verdict.culprits if hang.verdict is not None else []
        nodes = sorted({c.node for c in culprits if c.node})
        what = next((e.what for e in events if e.kind == "hang"), "hang")
        return Fault(kind="hang", what=what, nodes=nodes, step=step, began=hang.began, detected=hang.detected)
    stop = rec.stopped_for
    if stop is not None:
        return Fault(kind="straggler", what=stop.what, nodes=[stop.node] if stop.node else [], step=step,
                     began=stop.began, detected=stop.detected)
    crash = next((e for e in events if e.kind == "crash"), None)
    if crash is not None:
        return Fault(kind="crash", what=crash.what + (f": {crash.stderr}" if crash.stderr else ""),
                     nodes=[crash.node] if crash.node else [], step=crash.step if crash.step is not None else step,
                     began=crash.began, detected=crash.detected)
    first_failure = rec.first_failure
    if first_failure is not None:
        return Fault(kind="crash", what=f"rank {first_failure.rank} exited {first_failure.exit_code}",
                     nodes=[first_failure.node] if first_failure.node else [], step=step, began=first_failure.end,
                     detected=first_failure.end)
    return Fault(kind="crash", what=f"the launch exited {rec.exit_code}", nodes=[], step=step, began=rec.ended,
                 detected=rec.ended)


@dataclass
class Pool:
    """The allocation's nodes as the job sees them: running, spare, out (and why)."""

    active: list[str]
    spare: list[str]
    out: dict[str, list[str]] = field(default_factory=dict)
    named: Counter = field(default_factory=Counter)      # node -> times it was a suspect

    @classmethod
    def start(cls, good: list[str], spares: int) -> Pool:
        cut = max(1, len(good) - max(0, spares))
        return cls(list(good[:cut]), list(good[cut:]))

    def remove(self, nodes: list[str]) -> None:
        self.active = [n for n in self.active if n not in nodes]
        self.spare = [n for n in self.spare if n not in nodes]

    def exclude(self, node: str, why: str) -> None:
        self.remove([node])
        self.out.setdefault(node, []).append(why)

    def fill(self, want: int) -> list[str]:
        """The next attempt's nodes: those still running, then spares, up to ``want``."""
        while len(self.active) < want and self.spare:
            self.active.append(self.spare.pop(0))
        return list(self.active)


@dataclass
class Recovery:
    """Decides, after each attempt, whether and where the next one runs."""

    pool: Pool
    max_restarts: int
    want: int                    # nodes per attempt: the first attempt's
    min_nodes: int
    revet: Path | None           # the protocol suspects are vetted again with, or None
    slurm: bool
    restarts: int = 0
    history: list[tuple[str, int | None]] = field(default_factory=list)
    recurrences: int = 0
    interrupted: bool = False            # SIGINT while vetting again: no restart

    @property
    def left(self) -> bool:
        """A restart is left."""
        return self.restarts < self.max_restarts

    def can_replace(self, node: str | None) -> bool:
        """Whether a restart without ``node`` is possible now (a spare, or ``--min-nodes``
        allows one node fewer): a straggler is not worth stopping the job for otherwise."""
        if not self.left:
            return False
        return not self.slurm or bool(self.pool.spare) or len(self.pool.active) - 1 >= self.min_nodes

    def after(self, rec: Attempt, vet_out: Path, allocation: Any) -> Restart | None:
        """The ``restart`` record of an attempt that ended in a fault (``action``: restart
        with the next ``nodes``, or stop with ``why``); None when it did not fault."""
        fault = fault_of(rec)
        if fault is None:
            return None
        record = Restart(fault=fault, decided=None)
        self._recurrence(fault)
        if not self.left:
            return self._stop(record, f"no restart left (--max-restarts {self.max_restarts})")
        if self.recurrences >= RECURRENCES:
            at = "before its first step" if fault.step is None else f"at step {fault.step:,}"
            return self._stop(record, f"the same {fault.kind} {at} in {self.recurrences + 1} attempts in a row "
                              "(on other nodes each time where there were any): a fault of the script, not of the "
                              "nodes; not restarting again")
        if self.slurm:
            record.suspects = self._suspects(fault, record, vet_out, allocation)
        if self.interrupted:
            return self._stop(record, "interrupted (SIGINT) while vetting again")
        nodes = self.pool.fill(self.want) if self.slurm else list(self.pool.active)
        record.excluded = {n: self.pool.out[n] for n in record.suspects or [] if n in self.pool.out}
        if len(nodes) < self.min_nodes:
            return self._stop(record, f"{plural(len(nodes), 'good node')} left, fewer than --min-nodes "
                              f"{self.min_nodes}")
        self.restarts += 1
        record.action, record.nodes, record.spares = "restart", nodes, list(self.pool.spare)
        record.restart, record.decided = self.restarts, time.time()
        return record

    def _recurrence(self, fault: Fault) -> None:
        if self.history:
            kind, step = self.history[-1]
            same = kind == fault.kind and (step == fault.step or (step is not None and fault.step is not None
                                                                   and abs(step - fault.step) <= 1))
            self.recurrences = self.recurrences + 1 if same else 0
        self.history.append((fault.kind, fault.step))

    def _stop(self, record: Restart, why: str) -> Restart:
        record.action, record.why, record.decided = "stop", why, time.time()
        return record

    def _suspects(self, fault: Fault, record: Restart, vet_out: Path, allocation: Any) -> list[str]:
        """Take the suspects out; vet again those that may return (not lost, not named before)."""
        suspects = [n for n in fault.nodes if n in self.pool.active or n in self.pool.spare]
        again: list[str] = []
        cause = f"{fault.kind} in attempt {len(self.history) - 1}"
        for n in suspects:
            self.pool.named[n] += 1
            reason = f"{cause}: {fault.what}"
            if fault.kind == "node":
                self.pool.exclude(n, reason)
            elif self.pool.named[n] > 1:
                self.pool.exclude(n, f"{reason} (a suspect for the {_nth(self.pool.named[n])} time)")
            elif self.revet is None:
                self.pool.exclude(n, f"{reason} (no --revet protocol to clear it)")
            else:
                self.pool.remove([n])
                again.append(n)
        if again:
            record.revet = self._revet(again, vet_out, allocation, cause)
        return suspects

    def _revet(self, nodes: list[str], out: Path, allocation: Any, cause: str) -> Revet:
        from hpcml.cluster.hostlist import fold
        from hpcml.errors import HpcmlError
        from hpcml.vet.isolate import interrupted
        from hpcml.vet.session import vet_job
        began = time.time()
        log.info(f"hpcml run: vetting {fold(nodes)} again ({self.revet})")
        try:
            run_, _ = vet_job(self.revet, min_nodes=1, nodes=fold(nodes), out=out, allocation=allocation)  # type: ignore[arg-type]
            good, reasons = set(run_.verdict.good), run_.verdict.reasons
        except HpcmlError as exc:                       # vetting could not run: nothing clears them
            good, reasons = set(), {n: [f"vetting again failed: {exc}"] for n in nodes}
        if interrupted():                               # Ctrl-C while vetting (vet's own handler took it)
            self.interrupted = True
        passed = [n for n in nodes if n in good]
        failed = [n for n in nodes if n not in good]
        self.pool.spare += passed                       # back, as the last spares
        for n in failed:
            self.pool.out.setdefault(n, []).append(f"{cause}, then failed vetting: "
                                                   + "; ".join(reasons.get(n) or ["no verdict"]))
        took = time.time() - began
        said = ([f"{', '.join(passed)} passed (back as a spare)"] if passed else []) \
            + ([f"{', '.join(failed)} failed (out)"] if failed else [])
        log.info(f"hpcml run: vetted again in {took:.1f} s: {'; '.join(said)}")
        return Revet(nodes=nodes, passed=passed, began=began, duration_s=round(took, 3), dir=str(out))


def _nth(n: int) -> str:
    return {2: "second", 3: "third"}.get(n, f"{n}th")


LOST_EVERY = 5.0         # seconds between two asks of Slurm for the attempt's nodes' states
LOST_WAIT = 30.0         # after the kill grace: srun may wait this long for a lost node's tasks


class LostNodes:
    """The attempt's nodes that Slurm lost (its slurmd stopped answering, the node went
    down): one ``scontrol show node`` every ``LOST_EVERY`` seconds from the launcher."""

    def __init__(self, nodes: list[str]) -> None:
        self.nodes = nodes
        self.lost: dict[str, dict[str, Any]] = {}
        self._next = 0.0

    def poll(self, now: bool = False) -> bool:
        """True when a node was found lost by this call."""
        t = time.monotonic()
        if not now and t < self._next:
            return False
        self._next = t + LOST_EVERY
        from hpcml.cluster.hostlist import fold
        from hpcml.cluster.slurm import node_lost, node_states
        from hpcml.errors import SlurmError
        try:
            states = node_states(fold(self.nodes))
        except SlurmError:
            return False                        # the controller did not answer: ask again later
        new = {n: {"state": st, "seen": time.time()} for n, st in states.items()
               if n in self.nodes and n not in self.lost and node_lost(st)}
        for n, v in new.items():
            log.warning(f"hpcml run: node {n} lost ({v['state']}); stopping the attempt")
        self.lost.update(new)
        return bool(new)


def describe(restart: Restart | dict[str, Any]) -> str:
    """One line for the report and the log: the fault, what was done, how it resumed (a
    report's ``restart`` is its JSON form).

    ``hang on n2: culprit ranks 1 ...; detected 5 s after it began; n2 out; restarted on
    n1, n3; resumed from step 20 (9 steps lost), 13 s from the fault to the first step``
    (the fault's nodes next to its kind: after "ranks 0 blocked behind them" they would read
    as the blocked ranks' nodes)"""
    if isinstance(restart, dict):
        restart = Restart.model_validate(restart)
    fault = restart.fault
    parts = [f"{fault.kind}" + (f" on {', '.join(fault.nodes)}" if fault.nodes else "") + f": {fault.what}"]
    began, detected = fault.began, fault.detected
    if began is not None and detected is not None and detected > began:
        parts.append(f"detected {detected - began:.0f} s after it began")
    if restart.revet is not None and restart.revet.passed:
        parts.append(f"{', '.join(restart.revet.passed)} passed vetting again")
    out = sorted(restart.excluded or {})
    if out:
        parts.append(f"{', '.join(out)} out")
    if restart.action != "restart":
        return "; ".join(parts + [f"not restarted: {restart.why}"])
    parts.append("restarted" + (f" on {', '.join(restart.nodes)}" if restart.nodes else ""))
    res = restart.resumed
    if res is not None:
        lost = f" ({plural(res.steps_lost, 'step')} lost)" if res.steps_lost is not None else ""
        parts.append((f"resumed from step {res.step:,}{lost}" if res.step is not None
                      else f"resumed at the script's step {res.printed_step:,}{lost}" if res.printed_step is not None
                      else "resumed without a checkpoint step hpcml could read (steps lost unknown)")
                     + (f", {res.time_to_resume_s:.0f} s from the fault to the first step"
                        if res.time_to_resume_s is not None else ""))
    return "; ".join(parts)


#: what the report says for steps done again that it could not count, and what would count them
UNKNOWN_REDONE = ("unknown: the step the script resumed at is not known (hpcml.ckpt, HF Trainer or Lightning "
                  "measure it; a script that prints its step measures it with hpcml run --step-pattern, "
                  "e.g. --step-pattern 'iter (\\d+):' for nanoGPT)")


def time_lost(records: list[Attempt], step_s: float | None) -> dict[str, Any] | None:
    """What the faults cost the job: the time from each fault to the next attempt's first
    step, and the steps done again (at ``step_s`` seconds each, when known)."""
    restarts = [r.restart for r in records if r.restart is not None]
    if not restarts:
        return None
    restarted = [r for r in restarts if r.action == "restart"]
    waits = [r.resumed.time_to_resume_s if r.resumed is not None else None for r in restarted]
    known = [w for w in waits if w is not None]
    waited = round(sum(known), 3) if known else None          # None: no next attempt reached a step
    # a restart whose next attempt completed no step lost time no figure holds: the sum is a floor
    unresumed = len(waits) - len(known)
    # unknown is not 0: one resume without its step (no hpcml.ckpt checkpoint) leaves the sum unknown
    lost = [r.resumed.steps_lost if r.resumed is not None else None for r in restarted]
    redone = sum(s for s in lost if s is not None) if lost and None not in lost else None
    total = None if unresumed else (round(waited + redone * step_s, 3) if waited is not None and redone is not None
                                    and step_s else waited if redone == 0 else None)
    return {"faults": len(restarts), "restarts": len(restarted),
            "time_to_resume_s": waited, "steps_lost": redone, "time_lost_s": total, "step_s": step_s,
            **({"not_resumed": unresumed} if unresumed else {}),
            **({"steps_lost_unknown": UNKNOWN_REDONE} if lost and redone is None else {})}


def resume_of(d: Path, prev: Attempt, nxt: Attempt) -> Resumed:
    """How attempt ``nxt`` resumed the training ``prev`` left after its fault: the step its
    checkpoint held (``requeue.note_resumed``) and the steps lost (the last step seen minus
    that one; without a checkpoint's step, from what rank 0 printed, ``--step-pattern``:
    ``prev``'s origin in the script's numbering plus the steps it did, less ``nxt``'s origin,
    each origin the first step the attempt printed less the optimizer steps before it), and
    the time from the fault to ``nxt``'s first step, split into detection, stop, vetting
    again, relaunch and the script's own start-up. Read from the job directory, so the
    report can say it for an attempt whose launcher did not live to write it."""
    from hpcml.cluster import requeue
    from hpcml.observe.beat import Trust, read_beats
    from hpcml.run.jobdir import attempt_dir, observe_dir, rank_meta
    restart, n = prev.restart, nxt.attempt
    fault = restart.fault if restart is not None else None
    note = requeue.resumed(attempt_dir(d, n))
    step = note["step"] if note else None
    furthest = prev.furthest_step
    lost = furthest - step if step is not None and furthest is not None else None
    printed = None
    if step is None:                                  # the script's printed steps (--step-pattern)
        now, then = requeue.printed_origin(attempt_dir(d, n)), requeue.printed_origin(attempt_dir(d, prev.attempt))
        printed = now + 1 if now is not None else None
        if now is not None and then is not None and furthest is not None and then + furthest >= now:
            lost = then + furthest - now
    first = nxt.first_step_at
    if first is None and nxt.ntasks:                   # the launcher did not write it: the ranks' records,
        # of the ranks it started and not before it started (its key died with it: unsigned)
        firsts = [b.first for b in read_beats(observe_dir(d, n), {}, Trust(nxt.ntasks)).values()
                  if b.first is not None and b.first >= nxt.started]
        first = min(firsts, default=None)
    starts = [m["start"] for m in rank_meta(d, n) if isinstance(m.get("start"), (int, float))]
    began = (fault.began or fault.detected) if fault is not None else None
    detected = fault.detected if fault is not None else None

    def gap(a: Any, b: Any) -> float | None:
        return round(b - a, 3) if isinstance(a, (int, float)) and isinstance(b, (int, float)) else None
    return Resumed(step=step, checkpoint=note["checkpoint"] if note else None, first_step_at=first,
                   printed_step=printed, steps_lost=lost,
                   time_to_resume_s=gap(began, first),
                   split_s=ResumeSplit(detection=gap(began, detected), stop=gap(detected, prev.ended),
                                       revet=(restart.revet.duration_s if restart is not None and restart.revet
                                              else 0.0),
                                       relaunch=gap(restart.decided if restart is not None else None,
                                                    max(starts, default=None)),
                                       startup=gap(max(starts, default=None), first)))
