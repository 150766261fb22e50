"""Who arrives last at each collective: a straggler as the Flight Recorder sees it.

Why: in a synchronous job every rank waits in the collective for the slowest, so its step
times name no one. On CPU (gloo) hpcml times each rank's wait around the collectives
(``hpcml.observe.collectives``); on GPUs NCCL only queues the collective on a stream, so a
CPU-side timer measures no wait at all. The Flight Recorder keeps, per rank and per
collective (process group, ``collective_seq_id``), when the rank issued it
(``time_created_ns``) and, with ``TORCH_NCCL_ENABLE_TIMING=1``, when its kernel started on the
GPU (``time_discovered_started_ns``) and how long it ran (``duration_ms``): the last rank to
start a collective is the one the others waited for, and it waits least.

Per collective every member of its group recorded, each rank's lateness is its start less
the median start of the others (leave-one-out, as ``hpcml.observe.stragglers`` scores step
times). Per rank: how many such collectives (``collectives``), the share it started last
(``last_share``: the recurrence), its median lateness, its median time in them when timed,
and ``stability``: the share of the judged collectives' thirds (oldest to newest) in which
it was the rank last most often. A straggler (``straggler``) is last in at least
``RECURRENCE`` of them (more in a small group: two ranks are each last half the time by
chance) and late by ``LATE_FACTOR`` times the others' typical lateness, and at least
``MIN_LATE_S``.

The start used is the kernel's where every member's entry has it (``measure``: ``kernel
start``), else the enqueue (``enqueue``: gloo, or NCCL without timing). Point-to-point
entries have their own numbering and are not scored (a pipeline's stages post different
numbers of them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hpcml.observe.hang import collectives_of, groups_of

RECURRENCE = 0.5       # last at this share of the judged collectives, at least ...
SMALL_GROUP = 1.5      # ... and at this many times the share chance gives (1 / members): 0.75 with 2 ranks
LATE_FACTOR = 5.0      # late by this many times the other ranks' median lateness (0 where early) ...
MIN_LATE_S = 1e-3      # ... and at least this long
MIN_COLLECTIVES = 10   # no verdict from fewer collectives
RECENT = 2000          # the newest collectives of each group judged


@dataclass
class RankArrival:
    rank: int
    collectives: int
    last_share: float
    late_s: float                      # median seconds after the others' median start
    busy_s: float | None = None        # median seconds its collectives ran (NCCL timing); None: not timed
    stability: float = 0.0
    measure: str = "enqueue"

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "collectives": self.collectives, "last_share": round(self.last_share, 3),
                "late_s": round(self.late_s, 6), "busy_s": None if self.busy_s is None else round(self.busy_s, 6),
                "stability": round(self.stability, 3), "measure": self.measure}


def _start(e: dict) -> tuple[int | None, int | None, float | None]:
    """(enqueue ns, kernel start ns, duration s) of one entry, each None where absent."""
    def num(v: Any) -> Any:
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None
    created, started, took = num(e.get("time_created_ns")), num(e.get("time_discovered_started_ns")), num(e.get("duration_ms"))
    return (int(created) if created is not None else None, int(started) if started is not None else None,
            took / 1000.0 if took is not None else None)


def arrivals(dumps: dict[int, dict]) -> list[RankArrival]:
    """Every rank's arrival figures over the collectives all members of their group
    recorded in ``dumps`` (rank -> Flight Recorder dump, ``hang.load_dump``)."""
    groups = groups_of(dumps)
    per_rank = {r: collectives_of([e for e in d.get("entries") or [] if isinstance(e, dict)]) for r, d in dumps.items()}
    rows: list[tuple[list[int], np.ndarray, np.ndarray | None, bool]] = []    # members, starts, busy, kernel
    for pg, (_, members) in groups.items():
        if len(members) < 2 or any(m not in per_rank for m in members):
            continue
        common = set.intersection(*(set(per_rank[m].get(pg, {})) for m in members))
        for seq in sorted(common)[-RECENT:]:
            got = [_start(per_rank[m][pg][seq][0]) for m in members]
            kernel = all(g[1] is not None for g in got)
            starts = [g[1] if kernel else g[0] for g in got]
            if any(s is None for s in starts):
                continue
            took = [g[2] for g in got]
            timed = [b for b in took if b is not None]
            rows.append((members, np.asarray(starts, np.float64) / 1e9,
                         np.asarray(timed, np.float64) if kernel and len(timed) == len(took) else None, kernel))
    if not rows:
        return []
    late: dict[int, list[float]] = {}
    last: dict[int, list[bool]] = {}
    busy: dict[int, list[float]] = {}
    kernel_all = all(k for *_, k in rows)
    leaders: list[int] = []
    for members, t, b, _ in rows:
        n = len(members)
        srt = np.sort(t)
        for i, r in enumerate(members):
            others = np.delete(t, i)
            late.setdefault(r, []).append(float(t[i] - np.median(others)))
            last.setdefault(r, []).append(bool(t[i] == srt[-1] and (n < 2 or srt[-1] > srt[-2])))
            if b is not None:
                busy.setdefault(r, []).append(float(b[i]))
        leaders.append(members[int(np.argmax(t))])
    thirds = [leaders[k * len(leaders) // 3:(k + 1) * len(leaders) // 3] for k in range(3)]
    most = [max(set(th), key=th.count) if th else None for th in thirds]
    out = [RankArrival(rank=r, collectives=len(v), last_share=float(np.mean(last[r])), late_s=float(np.median(v)),
                       busy_s=float(np.median(busy[r])) if r in busy else None,
                       stability=sum(m == r for m in most) / 3, measure="kernel start" if kernel_all else "enqueue")
           for r, v in late.items()]
    return sorted(out, key=lambda a: (-a.last_share, -a.late_s))


def straggler(scores: list[RankArrival], members: int | None = None) -> RankArrival | None:
    """The rank the others waited for, if the arrivals name one (the rules above)."""
    if len(scores) < 2:
        return None
    n = members or len(scores)
    top = scores[0]
    others = [max(0.0, a.late_s) for a in scores[1:]]    # how late the others are (of two, one never is)
    typical = float(np.median(others)) if others else 0.0
    if top.collectives < MIN_COLLECTIVES or top.last_share < max(RECURRENCE, min(1.0, SMALL_GROUP / n)):
        return None
    if top.late_s < max(MIN_LATE_S, LATE_FACTOR * typical):
        return None
    return top
