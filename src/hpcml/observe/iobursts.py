"""Storage beside throughput: each rank's reads and writes, and the I/O a job-wide stall
coincides with (the CSCS paper's Figure 6: asynchronous checkpoint writes as regular
throughput drops on Alps).

Inputs are the host sampler's cumulative per-rank counters (``proc_read_chars``,
``proc_write_chars``, ``proc_read_bytes``, ``proc_write_bytes``, ``proc_read_calls``,
``proc_write_calls``: ``/proc/PID/io`` of the rank's whole process tree), the node's
filesystem client counters (``fs_lustre_*``, ``fs_nfs_*``: ``hpcml.samplers.fsclients``),
the ``checkpoint`` section (the time a save blocked the loop: ``hpcml.ckpt``, a
``torch.save`` under ``hpcml run``) and the report's stalls. A stall is said to come with
a burst when the ranks wrote or read in it at ``BURST`` times their rate over the job, or
when a checkpoint blocked in it; with another job's load when the node's filesystem client
moved ``FOREIGN`` times what the job's own ranks did. Nothing is said from counters a node
does not have: no row is no figure, never a zero.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hpcml.units import fmt_bytes

RANK_ROWS = {"read_chars": "proc_read_chars", "read_bytes": "proc_read_bytes", "write_chars": "proc_write_chars",
             "write_bytes": "proc_write_bytes", "read_calls": "proc_read_calls", "write_calls": "proc_write_calls"}
FS_ROWS = ("fs_lustre_read_bytes", "fs_lustre_write_bytes", "fs_nfs_read_bytes", "fs_nfs_write_bytes")
BURST = 3.0               # a stall's own I/O rate this many times the job's: a burst
FOREIGN = 2.0             # the node's client moved this many times the job's own bytes: another job's load
FOREIGN_MIN = 64 << 20    # ... and at least this much
IMBALANCE = 3.0           # a rank read or wrote this many times the others' median ...
IMBALANCE_MIN = 256 << 20  # ... and at least this much
CKPT_SLACK_S = 1.0        # a save that ended this soon after a stall's end is the stall's


class _Cumulative:
    """One cumulative counter's rows, sorted once by (rank or node, time): each question
    (what it was at a time, what it moved) is a binary search per rank, never a pass over
    every row (1,024 ranks x an hour of samples is millions of rows, asked once per stall)."""

    def __init__(self, g: Any) -> None:
        order = np.lexsort((g.x, g.ridx))
        self.x, self.v = np.asarray(g.x)[order], np.asarray(g.value)[order]
        ridx = np.asarray(g.ridx)[order]
        cuts = np.flatnonzero(np.diff(ridx)) + 1
        self.segments = list(zip(np.concatenate([[0], cuts]).tolist(), np.concatenate([cuts, [len(ridx)]]).tolist()))

    def moved(self, a: float, b: float) -> float | None:
        """What it grew by over ``a`` to ``b``: from each rank's last sample at or before
        ``a`` to its first at or after ``b`` (else its last; samples come every interval: what
        was written in the window is all counted, and at most an interval more), summed over
        the ranks (or nodes) with a sample at or before ``a``; None where none has one."""
        total, any_ = 0.0, False
        for lo, hi in self.segments:
            xs = self.x[lo:hi]
            i = int(np.searchsorted(xs, a, side="right")) - 1
            if i < 0:
                continue
            j = min(int(np.searchsorted(xs, b, side="left")), hi - lo - 1)
            total += max(0.0, float(self.v[lo + j]) - float(self.v[lo + i]))
            any_ = True
        return total if any_ else None

    def span(self) -> float:
        """What it moved over the job: each rank's (node's) last less its first, summed
        (nodes' counters start anywhere: their spread is not traffic)."""
        return sum(max(0.0, float(self.v[hi - 1]) - float(self.v[lo])) for lo, hi in self.segments)


def _totals(g: Any, nr: int) -> np.ndarray:
    out = np.full(nr, np.nan)
    np.fmax.at(out, g.ridx, g.value)
    return out


def summarise(groups: dict, rank_ids: np.ndarray, span: float, stalls: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The report's ``io``: per rank, its totals; per stall, what moved in it; None where the
    ranks' counters were not recorded."""
    have = {k: groups[("host", row)] for k, row in RANK_ROWS.items()
            if ("host", row) in groups and len(groups[("host", row)].value)}
    if not have:
        return None
    nr = len(rank_ids)
    per = {k: _totals(g, nr) for k, g in have.items()}
    ranks = []
    for i, rank in enumerate(rank_ids):
        row: dict[str, Any] = {"rank": int(rank)}
        for k in RANK_ROWS:
            v = per[k][i] if k in per else float("nan")
            row[k] = int(v) if np.isfinite(v) else None
        ranks.append(row)
    ckpt = groups.get(("section", "checkpoint"))
    fs = {row: _Cumulative(groups[("host", row)]) for row in FS_ROWS
          if ("host", row) in groups and len(groups[("host", row)].value)}
    moving: dict[str, _Cumulative] = {k: _Cumulative(have[k]) for k in ("read_chars", "write_chars") if k in have}
    job = {k: float(np.nansum(v)) for k, v in per.items()}
    bursts = []
    for s in stalls:
        a, b = float(s["start_s"]), float(s["end_s"])
        moved = {k: c.moved(a, b) for k, c in moving.items()}
        burst: dict[str, Any] = {"start_s": s["start_s"], "end_s": s["end_s"], "kind": s.get("kind"),
                                 "read_bytes": _int(moved.get("read_chars")), "write_bytes": _int(moved.get("write_chars"))}
        if ckpt is not None and len(ckpt.value):
            ends = ckpt.x
            begins = ckpt.x - ckpt.value
            hit = (begins < b) & (ends > a - CKPT_SLACK_S) & (ends <= b + CKPT_SLACK_S)
            burst["checkpoint_saves"] = int(hit.sum())
            burst["checkpoint_s"] = round(float(ckpt.value[hit].max(initial=0.0)), 3)
        fs_moved = {row: c.moved(a, b) for row, c in fs.items()}
        burst["fs_bytes"] = {row: int(v) for row, v in fs_moved.items() if v is not None} or None
        dur = max(b - a, 1e-9)
        for k, name in (("write_chars", "write"), ("read_chars", "read")):
            got = moved.get(k)
            over = job.get(k, 0.0) / span if span > 0 else 0.0
            burst[f"{name}_times_job_rate"] = round(got / dur / over, 1) if got and over > 0 else None
        bursts.append(burst)
    return {"ranks": ranks, "bursts": bursts,
            "job": {k: int(v) for k, v in job.items()},
            "fs": {row: int(c.span()) for row, c in fs.items()} or None}


def _int(v: float | None) -> int | None:
    return None if v is None else int(v)


def findings(io: dict[str, Any] | None, make: Any) -> list[Any]:
    """``make(kind, message, advice)`` for each: a stall that came with the job's own I/O
    burst (``io_burst``), one that came with another job's load (``foreign_io``), a rank
    that read or wrote far more than the others (``io_imbalance``)."""
    if not io:
        return []
    out = []
    own = [b for b in io["bursts"] if _own_burst(b)]
    if own:
        b = max(own, key=lambda b: (b.get("write_bytes") or 0) + (b.get("read_bytes") or 0))
        what = []
        if b.get("write_bytes"):
            what.append(f"the ranks wrote {fmt_bytes(b['write_bytes'])}"
                        + (f" ({b['write_times_job_rate']:g}x their rate over the job)" if b.get("write_times_job_rate")
                           else ""))
        if b.get("read_bytes") and (b.get("read_times_job_rate") or 0) >= BURST:
            what.append(f"read {fmt_bytes(b['read_bytes'])} ({b['read_times_job_rate']:g}x their rate)")
        if b.get("checkpoint_saves"):
            what.append(f"{b['checkpoint_saves']} checkpoint save(s) blocked the loop up to {b['checkpoint_s']:.1f} s")
        more = f" ({len(own) - 1} more stalls like it)" if len(own) > 1 else ""
        out.append(make("io_burst", f"the job-wide stall at +{b['start_s']:.0f} s ({b['end_s'] - b['start_s']:.1f} s) "
                        f"came with an I/O burst{more}: " + "; ".join(what),
                        "checkpoint less often or asynchronously (torch.distributed.checkpoint.async_save, "
                        "hpcml.ckpt's node-local tier drained in the background), or stage the data the burst read"))
    foreign = [b for b in io["bursts"] if _foreign(b) and not _own_burst(b)]
    if foreign:
        b = foreign[0]
        fs = sum((b.get("fs_bytes") or {}).values())
        mine = (b.get("read_bytes") or 0) + (b.get("write_bytes") or 0)
        out.append(make("foreign_io", f"the job-wide stall at +{b['start_s']:.0f} s came while the node's filesystem "
                        f"client moved {fmt_bytes(fs)} and the job's ranks {fmt_bytes(mine)}: another job's load on "
                        "the shared filesystem", "nothing in the job to change; tell the centre if it recurs (the "
                        "filesystem's load at that time)"))
    for key, verb in (("read_chars", "read"), ("write_chars", "wrote")):
        vals = [(r["rank"], r[key]) for r in io["ranks"] if r.get(key) is not None]
        if len(vals) < 2:
            continue
        top_rank, top = max(vals, key=lambda rv: rv[1])
        others = float(np.median([v for r, v in vals if r != top_rank]))
        if top >= IMBALANCE_MIN and top >= IMBALANCE * max(others, 1.0):
            out.append(make("io_imbalance", f"rank {top_rank} {verb} {fmt_bytes(top)}, "
                            f"{top / max(others, 1.0):.1f}x the other ranks' median ({fmt_bytes(int(others))})",
                            "one rank doing the job's I/O: its data shard or its checkpoint writes are uneven "
                            "(expected where only rank 0 saves)"))
    return out


def _own_burst(b: dict[str, Any]) -> bool:
    return bool(b.get("checkpoint_saves")) or (b.get("write_times_job_rate") or 0) >= BURST \
        or (b.get("read_times_job_rate") or 0) >= BURST


def _foreign(b: dict[str, Any]) -> bool:
    fs = sum((b.get("fs_bytes") or {}).values())
    mine = (b.get("read_bytes") or 0) + (b.get("write_bytes") or 0)
    return fs >= FOREIGN_MIN and fs >= FOREIGN * mine
