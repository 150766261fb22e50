"""Where the job's time went: every second from ``hpcml run``'s start to its end, in parts
that add up to the whole, and the job's effective training time ratio.

ETTR, as Meta's study of its research clusters defines it (Kokolis et al., "Revisiting
Reliability in Large-Scale Machine Learning Research Clusters", arXiv:2410.21680, 2024):
the productive training time over the wall-clock time the job held its resources. Here
the whole is from the first attempt's start (vetting included) to the last one's end, and
productive is the time from each attempt's first completed step to its last, less the steps
it did again after a restart. Each part is read from what the job recorded (run.json's
times, each rank's metadata and last heartbeat); a part that was not measured is said to
be unknown, never counted as 0, and the ratio is then a bound.

Parts, per attempt, in time order: ``vetting``; ``launch`` (hpcml's start, srun, the
ranks' wrappers); ``startup`` (the ranks' start until the first step ended: imports, data,
model, a checkpoint load); ``productive``; ``redone`` (steps done again after the last
restart: the steps lost times the median step time); then how the attempt ended: ``tail``
(the last step to the end of a job that ended by itself), or ``detection`` (from the last
sign of life, the last step or the fault's start, to hpcml noticing) and ``stopping`` (to the
attempt's end); between attempts, ``relaunch`` (re-vetting the suspects and starting
again, the allocation held), or ``queued`` after a Slurm requeue (the job back in Slurm's
queue until it runs again: no node held, so no node-seconds, and not in ETTR's whole, the
time the job held its resources). ``other`` closes the sum (clock steps, a part the data
does not bound).
``checkpoint``: the saves that held the loop between the first and the last step, taken out
of ``productive`` (hpcml.ckpt's blocking, the script's torch.save and DCP saves:
``hpcml.observe.saves``); ``stalls``: gaps between the job's steps of several median steps
(a pause short of the hang timeout, an evaluation), less one median step and the saves in
them, taken out of ``productive`` too.

The allocation's time is node-seconds: each part's seconds times the nodes it held (the
whole allocation while vetting and relaunching; the ranks' nodes otherwise), plus ``idle``:
the allocation's other nodes (``--spare-nodes``, nodes vetting excluded) while the ranks
ran. Multiplied by the GPUs per node, that is the GPU time each part cost.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcml.jobmodel import LEDGER_CITATION as CITATION
from hpcml.jobmodel import Attempt, Ledger, LedgerPart, RunRecord

__all__ = ["CITATION", "Ledger", "LedgerPart", "build", "line"]

def _span(a: float | None, b: float | None) -> float | None:
    return max(0.0, b - a) if a is not None and b is not None else None


def _attempt_times(d: Path, rec: Attempt) -> tuple[float | None, float | None]:
    """(the ranks' start, the last sign of progress) of attempt ``rec``: the earliest rank
    start in its store's metadata, the latest step or section end in its ranks' heartbeats."""
    from hpcml.observe.beat import read_beats
    from hpcml.run.jobdir import observe_dir, rank_meta
    starts = [m["start"] for m in rank_meta(d, rec.attempt) if isinstance(m.get("start"), (int, float))]
    beats = read_beats(observe_dir(d, rec.attempt))
    last = [b.progress for b in beats.values() if b.progress is not None and b.progress >= rec.started]
    return min(starts, default=None), max(last, default=None)


#: a gap between two of the job's steps this many median steps long ...
STALL_STEPS = 3.0
#: ... and this many seconds over the median is a stall or a pause (a short hiccup of a fast job is not)
STALL_MIN_S = 1.0
DENSE_STEPS = 1 << 22          # step numbers below this are merged in an array indexed by them


@dataclass
class _Loop:
    """What held attempt's training loop between its first and last step: saves
    (``checkpoint_s``) and the gaps no step ended in (``stalled_s``, ``stalls``)."""

    checkpoint_s: float | None = None
    step_s: float | None = None        # the median gap between the job's steps
    stalled_s: float = 0.0
    stalls: int = 0
    longest_s: float = 0.0


def _latest(ids: Any, ends: Any) -> tuple[Any, Any]:
    """(each step id once, its latest end) of parallel arrays of step ids and ends."""
    import numpy as np
    if not len(ids):
        return ids, ends
    order = np.lexsort((ends, ids))
    ids, ends = ids[order], ends[order]
    last = np.r_[np.flatnonzero(ids[1:] != ids[:-1]), len(ids) - 1]
    return ids[last], ends[last]


def _loop(d: Path, attempt: int, first: float, stop: float) -> _Loop:
    """Read attempt ``attempt``'s store once, rank by rank, for its loop's holds.

    ``checkpoint_s``: the ``checkpoint`` sections (hpcml.ckpt, the script's torch.save and
    DCP saves) of the rank that spent the longest in them (a synchronous job waits for its
    slowest saver). Stalls: each step ends when its last rank ends it (the job's pace); a gap
    between two such ends of over ``STALL_STEPS`` median gaps and ``STALL_MIN_S`` seconds
    more than one is a stall (a pause short of the hang timeout, an evaluation, a
    synchronous data refill): it costs its length less one median step, less the saves that
    ended inside it (they are ``checkpoint``'s)."""
    import numpy as np
    import pyarrow.compute as pc

    from hpcml.observe.api import CHECKPOINT, STEP
    from hpcml.observe.store import iter_ranks
    from hpcml.run.jobdir import observe_dir
    files = sorted(observe_dir(d, attempt).glob("rank-*.arrows"))
    out = _Loop()
    lo, hi = int(first * 1e6), int(stop * 1e6)
    paced_ids, paced_ends = np.zeros(0, np.int64), np.zeros(0, np.int64)   # each step's latest end so far
    dense = np.zeros(0, np.int64)                                           # ... by step number, where small
    saves: list[tuple[np.ndarray, np.ndarray]] = []                         # per saving rank: (end us, seconds)
    for data in iter_ranks(files):
        r_ids: list[np.ndarray] = []
        r_ends: list[np.ndarray] = []
        r_at: list[np.ndarray] = []
        r_took: list[np.ndarray] = []
        for b in data.batches:
            ts = pc.cast(b.column("ts"), "int64")
            section = pc.and_(pc.equal(b.column("kind"), "section"),
                              pc.and_(pc.greater_equal(ts, lo), pc.less_equal(ts, hi)))
            keep = pc.and_(section, pc.equal(b.column("name"), CHECKPOINT))
            got = pc.filter(b.column("value"), keep).to_numpy(zero_copy_only=False).astype(float)
            if len(got):
                r_at.append(pc.filter(ts, keep).to_numpy(zero_copy_only=False))
                r_took.append(got)
            keep = pc.and_(section, pc.equal(b.column("name"), STEP))
            r_ends.append(pc.filter(ts, keep).to_numpy(zero_copy_only=False))
            r_ids.append(pc.filter(pc.fill_null(pc.cast(b.column("step"), "int64"), -1), keep)
                         .to_numpy(zero_copy_only=False))
        if r_took:
            at, took = np.concatenate(r_at), np.concatenate(r_took)
            ok = np.isfinite(took) & (took > 0)               # a damaged or forged value is no save
            if ok.any():
                out.checkpoint_s = max(out.checkpoint_s or 0.0, float(took[ok].sum()))
                saves.append((at[ok], took[ok]))
        if r_ends:
            e, i = np.concatenate(r_ends), np.concatenate(r_ids)
            if len(e) and (i < 0).any():            # steps without a number: this rank's own order
                order = np.argsort(e, kind="stable")
                e, i = e[order], np.arange(1, len(e) + 1)
            # merged into each step's latest end as each rank is read: memory of one rank's steps
            if len(i) and i.min() >= 0 and i.max() < DENSE_STEPS:      # step numbers: one array indexed by them
                if len(dense) <= i.max():
                    dense = np.concatenate([dense, np.full(int(i.max()) + 1 - len(dense), -1, np.int64)])
                np.maximum.at(dense, i, e)
            elif len(i):
                paced_ids, paced_ends = _latest(np.concatenate([paced_ids, i]), np.concatenate([paced_ends, e]))
    if len(dense):                                    # the dense steps' ends, with any sparse ones
        have = np.flatnonzero(dense >= 0)
        paced_ids, paced_ends = _latest(np.concatenate([paced_ids, have]), np.concatenate([paced_ends, dense[have]]))
    if not len(paced_ends):
        return out
    paced = np.sort(paced_ends) / 1e6                 # each step ends when its last rank ends it
    gaps = np.diff(paced)
    if len(gaps) < 2:
        return out
    med = float(np.median(gaps))
    out.step_s = med
    stalled = np.flatnonzero((gaps > STALL_STEPS * med) & (gaps > med + STALL_MIN_S))
    if not len(stalled):
        return out
    held = np.zeros(len(gaps))                     # saves inside a gap are the checkpoint part's:
    for at, took in saves:                         # each rank's, summed per gap; the rank held longest
        where = np.searchsorted(paced, at / 1e6, side="left") - 1
        ok = (where >= 0) & (where < len(gaps))
        mine = np.zeros(len(gaps))
        np.add.at(mine, where[ok], took[ok])
        held = np.maximum(held, mine)
    cost = np.maximum(0.0, gaps[stalled] - med - held[stalled])
    out.stalled_s = round(float(cost.sum()), 3)
    out.stalls = int((cost > 0).sum())
    out.longest_s = round(float(gaps[stalled].max()), 3)
    return out


def build(d: Path, run: RunRecord, step_s: float | None) -> Ledger | None:
    """The ledger of the job in ``d`` (None while it has not ended: the whole is not known)."""
    records = run.records()
    if run.ended is None or not records:
        return None
    parts: list[LedgerPart] = []
    productive, unknown, unmeasured = 0.0, False, False
    # no attempt recorded a step (a script that logs none and steps no torch optimizer, a
    # non-Python rank, no observe store): whether it trained is not known, never "0 %"
    steps_seen = any(rec.first_step_at is not None for rec in records)
    prev: Attempt | None = None
    for rec in records:
        n = rec.attempt
        if prev is not None and prev.ended is not None and prev.requeued is not None:
            parts.append(LedgerPart(part="queued", attempt=n, seconds=_span(prev.ended, rec.started),
                                    note="requeued: in Slurm's queue until it ran again, no node held"))
        elif prev is not None and prev.ended is not None:
            revet = prev.restart.revet.duration_s if prev.restart and prev.restart.revet else None
            parts.append(LedgerPart(part="relaunch", attempt=n, seconds=_span(prev.ended, rec.started),
                                    note=f"re-vetting {revet:.0f} s of it" if revet else ""))
        ranks, last = _attempt_times(d, rec)
        # an end never recorded (its launcher killed with it): at least its last heartbeat's step,
        # what follows it unplaced ("other"), never the steps it was seen to take cut to none
        end = rec.ended if rec.ended is not None else max(
            t for t in (rec.started, rec.first_step_at, last) if t is not None)
        vet = min(rec.vet.duration_s or 0.0, end - rec.started) if rec.vet and rec.vet.duration_s else 0.0
        if vet:
            parts.append(LedgerPart(part="vetting", attempt=n, seconds=round(vet, 3)))
        # the ranks' start not recorded (no store): hpcml's launch is counted as start-up
        launched = min(max(ranks, rec.started + vet), end) if ranks is not None else rec.started + vet
        if ranks is not None:
            parts.append(LedgerPart(part="launch", attempt=n, seconds=_span(rec.started + vet, launched)))
        first = rec.first_step_at
        if not steps_seen:
            parts.append(LedgerPart(part="other", attempt=n, seconds=_span(launched, end),
                                    note="no step recorded: training or not, not measured"))
            prev = rec
            continue
        if first is not None and last is None and first <= end:
            # a step completed (run.json says when), but the attempt's heartbeats are lost: its
            # training is not measured, never "no step completed"
            unmeasured = True
            parts.append(LedgerPart(part="startup", attempt=n, seconds=_span(launched, max(first, launched))))
            parts.append(LedgerPart(part="productive", attempt=n, seconds=None,
                                    note="its steps after the first were not recorded (no heartbeat read)"))
            prev = rec
            continue
        if first is None or last is None or first > end:
            parts.append(LedgerPart(part="startup", attempt=n, seconds=_span(launched, end),
                                    note="no step completed"))
            prev = rec
            continue
        first = max(first, launched)
        hang_began = rec.hang.began if rec.hang is not None else None
        fault = rec.restart.fault if rec.restart is not None else None
        stop = min(t for t in (last, hang_began, fault.began if fault else None, end) if t is not None)
        stop = max(stop, first)
        parts.append(LedgerPart(part="startup", attempt=n, seconds=_span(launched, first)))
        steps = _span(first, stop) or 0.0
        loop = _loop(d, n, first, stop)
        pace = loop.step_s or step_s           # this attempt's own pace, else the job's
        redone_s: float | None = 0.0
        lost: int | None = None
        if prev is not None and prev.restart is not None and prev.restart.action == "restart":
            lost = prev.restart.resumed.steps_lost if prev.restart.resumed is not None else None
            redone_s = None if lost is None or pace is None else min(steps, max(0, lost) * pace)
        if redone_s is None:
            unknown = True
            parts.append(LedgerPart(part="redone", attempt=n, seconds=None,
                                    note="steps done again after the restart: not measured (no checkpoint step or "
                                         "--step-pattern to read the resume step from, or no step time); "
                                         "counted as productive"))
        elif redone_s:
            parts.append(LedgerPart(part="redone", attempt=n, seconds=round(redone_s, 3),
                                    note=f"{lost} steps x {pace:.3g} s" if pace else ""))
        saving = loop.checkpoint_s
        if saving:
            saving = min(saving, max(0.0, steps - (redone_s or 0.0)))
            parts.append(LedgerPart(part="checkpoint", attempt=n, seconds=round(saving, 3),
                                    note="saves that held the training loop (the rank that was held longest)"))
        stalled = min(loop.stalled_s, max(0.0, steps - (redone_s or 0.0) - (saving or 0.0)))
        if stalled > 0:
            parts.append(LedgerPart(part="stalls", attempt=n, seconds=round(stalled, 3),
                                    note=f"{loop.stalls} gap(s) between steps of over {STALL_STEPS:g} median steps "
                                         f"(an evaluation, a pause short of the hang timeout), the longest "
                                         f"{loop.longest_s:.1f} s, each less one median step and its saves"))
        done = round(steps - (redone_s or 0.0) - (saving or 0.0) - stalled, 3)
        productive += done
        parts.append(LedgerPart(part="productive", attempt=n, seconds=done))
        detected = rec.hang.detected if rec.hang is not None else fault.detected if fault is not None else None
        if detected is not None and detected >= stop:
            parts.append(LedgerPart(part="detection", attempt=n, seconds=_span(stop, min(detected, end)),
                                    note="from the last sign of life to hpcml noticing"))
            parts.append(LedgerPart(part="stopping", attempt=n, seconds=_span(min(detected, end), end)))
        elif rec.ended is None:                # when it ended is not known: its tail neither ("other" holds it)
            parts.append(LedgerPart(part="tail", attempt=n, seconds=None,
                                    note="the last step to the attempt's end, which was not recorded"))
        else:
            parts.append(LedgerPart(part="tail", attempt=n, seconds=_span(stop, end),
                                    note="the last step to the attempt's end"))
        prev = rec
    total = round(max(0.0, run.ended - records[0].started), 3)
    known = sum(p.seconds for p in parts if p.seconds is not None)
    if abs(total - known) > 0.001:
        parts.append(LedgerPart(part="other", attempt=run.attempt, seconds=round(total - known, 3),
                                note="what the recorded times do not place"))
    node_s = _node_seconds(parts, records)
    held = total - sum(p.seconds or 0.0 for p in parts if p.part == "queued")
    ettr = round(productive / held, 4) if held > 0 and steps_seen and not unmeasured else None
    return Ledger(total_s=total, parts=parts, productive_s=round(productive, 3) if steps_seen else None, ettr=ettr,
                  ettr_bound="at most" if unknown and ettr is not None else None, node_s=node_s,
                  productive_node_s=round(sum(p.node_s or 0.0 for p in parts if p.part == "productive"), 3)
                  if steps_seen and not unmeasured else None)


#: parts during which the whole allocation is busy (or held for the job as a whole)
_WHOLE = frozenset({"vetting", "relaunch", "other"})


def _node_seconds(parts: list[LedgerPart], records: list[Attempt]) -> float:
    """Give every part its node-seconds, add each attempt's ``idle`` part (nodes of the
    allocation no rank ran on: the spares and the excluded, while the ranks ran), and
    return the sum: the allocation's node-seconds."""
    by_no = {rec.attempt: rec for rec in records}
    width: dict[int, tuple[int, int]] = {}
    for rec in records:
        held = len(set(rec.allocation))
        used = len(rec.nodes) if rec.nodes else max(held, 1)
        width[rec.attempt] = (max(held, used), used)
    ran: dict[int, float] = {}
    for p in parts:
        alloc, used = width.get(p.attempt, (1, 1))
        if p.part == "queued":
            p.node_s = 0.0                        # back in Slurm's queue: the job held no node
        elif p.seconds is not None:
            p.node_s = round(p.seconds * (alloc if p.part in _WHOLE else used), 3)
            if p.part not in _WHOLE:
                ran[p.attempt] = ran.get(p.attempt, 0.0) + p.seconds
    for n, seconds in ran.items():
        alloc, used = width[n]
        if alloc > used and seconds > 0:
            rec = by_no[n]
            excluded = len(set(rec.excluded) & set(rec.allocation))
            spares = alloc - used - excluded
            why = ", ".join(x for x in (f"{spares} spare" if spares > 0 else "",
                                        f"{excluded} excluded" if excluded > 0 else "") if x)
            parts.append(LedgerPart(part="idle", attempt=n, seconds=0.0, node_s=round((alloc - used) * seconds, 3),
                                    note=f"{alloc - used} of {alloc} nodes held while no rank ran on them ({why})"))
    return round(sum(p.node_s or 0.0 for p in parts), 3)


def line(ledger: Ledger) -> str:
    """The report's first line about time: "time: 98 s, 71% training (ETTR 0.71): ..."."""
    if ledger.ettr is not None:
        ratio = f", {'at most ' if ledger.ettr_bound else ''}{ledger.ettr * 100:.0f}% training (ETTR {ledger.ettr:.2f})"
    elif ledger.productive_s is None:
        ratio = ", training not measured (no step recorded)"
    else:
        ratio = ""
    parts = ", ".join(f"{name} {s:.0f} s" for name, s in ledger.by_part().items() if name != "productive" and s >= 0.5)
    idle = sum(p.node_s or 0.0 for p in ledger.parts if p.part == "idle")
    if idle >= 0.5:
        parts += (", " if parts else "") + f"idle nodes {idle:.0f} node-s"
    unknown = [p.part for p in ledger.parts if p.seconds is None]
    return (f"time: {ledger.total_s:.0f} s{ratio}" + (f"; {parts}" if parts else "")
            + (f"; not measured: {', '.join(dict.fromkeys(unknown))}" if unknown else ""))
