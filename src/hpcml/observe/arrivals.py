"""Who arrives last at each collective: a straggler as the Flight Recorder sees it.

Why: in a synchronous job every rank waits in the collective for the slowest, so its step
times name no one. On CPU (gloo) hpcml times each rank's wait around the collectives
(``hpcml.observe.collectives``); on GPUs NCCL only queues the collective on a stream, so a
CPU-side timer measures no wait at all.
The Flight Recorder keeps, per rank and per
collective (process group, ``collective_seq_id``), when the rank issued it
(``time_created_ns``) and, with ``TORCH_NCCL_ENABLE_TIMING=1`` (``hpcml run`` sets it), how
long it ran on the GPU (``duration_ms``, CUDA events recorded on the NCCL stream around the
kernel: the start event fires once the stream has the inputs, so it is the rank's arrival,
and the end once every member has arrived and the data moved).

Two measures, the better one where every member's entry allows it:

- ``kernel duration`` (NCCL with timing): a collective ends on every member at about the same
  moment, so a rank that arrives later by d runs d shorter; its arrival relative to the
  others is minus its duration. No clock is compared between hosts, and the CUDA events are
  exact. (``time_discovered_started_ns`` is not the kernel's start but when the watchdog
  thread noticed it, on a poll every 100 ms or so; it is not used.)
- ``enqueue`` (gloo, whose collectives run on the CPU as issued): when the rank issued it,
  from each host's clock. NCCL without timing is not judged: its host issues ahead of the
  GPU and waits where it synchronises, so its enqueue times do not say who arrived last on
  the GPU.

Per collective every member of its group recorded, each rank's lateness is its arrival less
the median arrival of the others (leave-one-out, as ``hpcml.observe.stragglers`` scores step
times). Per rank: how many such collectives (``collectives``), the share it arrived last
(``last_share``: the recurrence), its median lateness, its median time in them when timed
(``busy_s``: the straggler waits least), and ``stability``: the share of the judged
collectives' thirds (oldest to newest) in which it was the rank last most often. A
straggler (``straggler``) is last in at least ``RECURRENCE`` of them (more in a small group:
two ranks are each last half the time by chance) and late by ``LATE_FACTOR`` times the
others' typical lateness, at least ``MIN_LATE_S``, and, where the step time is known, more
than the straggler model's chronic share of a step (``stragglers.CHRONIC``).

Members come from each dump's ``pg_config``; a group it does not name (gloo's generic recorder
writes a placeholder there) has as members the ranks whose dumps have its entries.

Point-to-point
entries have their own numbering and are not scored (a pipeline's stages post different
numbers of them). But in a pipeline a rank that waits for a slow neighbour's activations or
gradients reaches its collectives late too, passing the lateness on: so the timed receives
(``recv`` entries with ``duration_ms``) are summed per rank (``recv_share``: the share of
its dump's time it spent receiving), and a candidate that received for longer than the
others' median by the chronic share is a victim, not the straggler: the next latest rank is
judged instead (``CANDIDATES``). (gloo's
recorder keeps no point-to-point entries; ``hpcml run``'s hooks time its ``dist.recv``.)

The chance a rank of a group of ``m`` is last is 1/m; the recurrence asked of a rank is set
by the groups it was judged in (``group_size``: the median of their member counts), not by
the job's size: in a pipeline of 2-stage replicas every data-parallel group has 2 members.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpcml.observe.hang import check_size, collectives_of, groups_of, p2p_receive
from hpcml.observe.stragglers import CHRONIC, onset, others_median

RECURRENCE = 0.5       # last at this share of the judged collectives, at least ...
SMALL_GROUP = 1.5      # ... and at this many times the share chance gives (1 / members): 0.75 with 2 ranks
LATE_FACTOR = 5.0      # late by this many times the other ranks' median lateness (0 where early) ...
MIN_LATE_S = 1e-3      # ... and at least this long
MIN_COLLECTIVES = 10   # no verdict from fewer collectives
CANDIDATES = 3         # the latest ranks judged in turn when one was a pipeline's victim
RECENT = 2000          # the newest collectives of each group judged
LIVE = "flight-recorder-live"    # <observe>/LIVE/rank-NNNNN: each rank's periodic dump (hpcml run's sitecustomize)
LIVE_DUMP_MAX = 64 << 20         # bytes of one periodic dump read, at most (2,000 entries without stacks: ~1 MB)
NS_MAX = 2.0 ** 63     # an epoch time in ns torch can write
MS_MAX = 1e9           # a collective's duration_ms, at most (11 days)


@dataclass
class RankArrival:
    rank: int
    collectives: int
    last_share: float
    late_s: float                      # median seconds after the others' median arrival
    busy_s: float | None = None        # median seconds its collectives ran (NCCL timing); None: not timed
    stability: float = 0.0
    measure: str = "enqueue"
    group_size: int = 2                # the median member count of the groups it was judged in
    recv_share: float | None = None    # the share of its dump's span spent in timed p2p receives (NCCL)
    since_t: float | None = None       # when it began to arrive last (epoch s, the change point); None: from the start

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "collectives": self.collectives, "last_share": round(self.last_share, 3),
                "late_s": round(self.late_s, 6), "busy_s": None if self.busy_s is None else round(self.busy_s, 6),
                "stability": round(self.stability, 3), "measure": self.measure, "group_size": self.group_size,
                "recv_share": None if self.recv_share is None else round(self.recv_share, 4),
                "since_t": self.since_t}


def _num(v: Any, limit: float) -> float | None:
    """A finite number in [0, limit) as written (ints of any size, floats), else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) and 0 <= f < limit else None


def reduce(dump: dict) -> dict[str, Any]:
    """What the arrivals need of one dump: its groups' config and, per group and collective,
    (enqueue s, seconds it ran on the GPU or None); the rest of the dump (its stacks, sizes) is
    dropped, so the watch keeps every rank's at little cost. ValueError for a dump with more
    entries or groups than a Flight Recorder keeps (``hang.check_size``), before any is read."""
    check_size(dump)
    times: dict[str, dict[int, tuple[float, float | None]]] = {}
    nccl: set[str] = set()
    for pg, seqs in collectives_of([e for e in dump.get("entries") or [] if isinstance(e, dict)]).items():
        for seq, entries in seqs.items():
            e = entries[0]
            created = _num(e.get("time_created_ns"), NS_MAX)
            if created is None:
                continue
            if any(str(x.get("profiling_name") or "").startswith("nccl:") for x in entries):
                nccl.add(pg)
            # coalesced ops: torch times only the record that closes them (its members have
            # no events), so the duration is the last one written for the sequence number
            took = next((t for x in reversed(entries) if (t := _num(x.get("duration_ms"), MS_MAX)) is not None),
                        None)
            times.setdefault(pg, {})[seq] = (created / 1e9, None if took is None else took / 1000.0)
    config = dump.get("pg_config")
    return {"pg_config": config if isinstance(config, dict) else {}, "times": times, "recv": _receives(dump),
            "nccl": sorted(nccl)}


#: what is said where NCCL's dumps carry no timing (the report's ``unjudged``, the watch's line)
UNTIMED = ("who arrived last at each collective (the Flight Recorder's NCCL entries have no kernel timing: "
           "TORCH_NCCL_ENABLE_TIMING=0)")


def untimed_nccl(reduced: dict[int, dict]) -> bool:
    """Whether several ranks' reduced dumps are NCCL's with no collective timed: the arrivals
    judge none of them, which is to be said, not read as "no straggler"."""
    return len(reduced) >= 2 and any(d.get("nccl") for d in reduced.values()) and not any(
        took is not None for d in reduced.values() for seqs in d.get("times", {}).values() for _, took in seqs.values())


def _receives(dump: dict) -> tuple[float, float] | None:
    """(seconds in timed point-to-point receives, the seconds the dump's entries span), or
    None where the dump has no timed receive."""
    entries = [e for e in dump.get("entries") or [] if isinstance(e, dict)]
    took = [t for e in entries if p2p_receive(e) and (t := _num(e.get("duration_ms"), MS_MAX)) is not None]
    created = [c for e in entries if (c := _num(e.get("time_created_ns"), NS_MAX)) is not None]
    if not took or len(created) < 2:
        return None
    return sum(took) / 1000.0, (max(created) - min(created)) / 1e9


def arrivals(dumps: dict[int, dict], since: float | None = None) -> list[RankArrival]:
    """Every rank's arrival figures over the collectives all members of their group
    recorded in ``dumps`` (rank -> Flight Recorder dump, ``hang.load_dump``, or its
    ``reduce``); ``since`` (epoch s): only the collectives issued since then, the live
    window, but at least each group's ``MIN_COLLECTIVES`` newest. Each group is a members x
    collectives matrix: the leave-one-out medians in one pass (``stragglers.others_median``),
    no loop over ranks and collectives. Each rank's ``since_t``: the change point of its
    being last, in time (``stragglers.onset`` over its collectives in order)."""
    reduced = {r: d if "times" in d else reduce(d) for r, d in dumps.items()}
    groups = groups_of({r: {"pg_config": d["pg_config"]} for r, d in reduced.items()})
    # gloo's generic recorder names no group in its pg_config (a placeholder, name ""): a group
    # only its entries name is judged over the ranks whose dumps have it
    for pg in sorted({pg for d in reduced.values() for pg in d["times"]} - set(groups)):
        groups[pg] = (pg, sorted(r for r, d in reduced.items() if pg in d["times"]))
    sizes: dict[int, list[int]] = {}
    late: dict[int, list[np.ndarray]] = {}
    last: dict[int, list[np.ndarray]] = {}
    busy: dict[int, list[np.ndarray]] = {}
    at: dict[int, list[np.ndarray]] = {}           # when each judged collective was issued (its latest member)
    leaders: list[tuple[float, int]] = []           # (when, the last rank) of every collective judged
    used: set[str] = set()                          # the measures the judged groups used
    for pg, (_, members) in groups.items():
        if len(members) < 2 or any(m not in reduced for m in members):
            continue
        rows = [reduced[m]["times"].get(pg, {}) for m in members]
        common = sorted(set.intersection(*(set(r) for r in rows)))[-RECENT:]
        if not common:
            continue
        got = np.array([[rows[i][q] for q in common] for i in range(len(members))], dtype=object)
        created = np.array([[c[0] for c in row] for row in got], np.float64)
        took = np.array([[np.nan if c[1] is None else c[1] for c in row] for row in got], np.float64)
        if since is not None:                        # the live window, never under MIN_COLLECTIVES
            keep = created.max(axis=0) >= since
            keep[-MIN_COLLECTIVES:] = True
            created, took = created[:, keep], took[:, keep]
        timed = ~np.isnan(took).any(axis=0)
        if timed.any():
            # NCCL with timing: the collectives every member timed (the watchdog fills a duration
            # in once it sees the kernel end: the newest few have none yet); arrival is minus the
            # duration, as all members end together
            created, took = created[:, timed], took[:, timed]
            t = -took
            used.add("kernel duration")
        elif any(pg in reduced[m].get("nccl", ()) for m in members):
            # NCCL without timing (TORCH_NCCL_ENABLE_TIMING=0, or a dump taken before any
            # kernel's end was seen): its enqueue times are the host's, which runs ahead of
            # the GPU and waits where it synchronises; they say nothing of who arrived last
            # on the GPU, so the group is not judged
            continue
        else:
            t = created                              # gloo: the collective runs on the host
            used.add("enqueue")
        lateness = t - others_median(t)
        top = t.max(axis=0)
        alone = (t == top).sum(axis=0) == 1
        when = created.max(axis=0)
        for i, m in enumerate(members):
            sizes.setdefault(m, []).append(len(members))
            late.setdefault(m, []).append(lateness[i])
            last.setdefault(m, []).append((t[i] == top) & alone)
            at.setdefault(m, []).append(when)
            if timed.any():
                busy.setdefault(m, []).append(took[i])
        leaders += list(zip(when.tolist(), [members[j] for j in np.argmax(t, axis=0)]))
    if not late:
        return []
    leaders.sort()
    order = [r for _, r in leaders]
    thirds = [order[k * len(order) // 3:(k + 1) * len(order) // 3] for k in range(3)]
    most = [max(set(th), key=th.count) if th else None for th in thirds]
    out = []
    for r, parts in late.items():
        v = np.concatenate(parts)
        recv = reduced[r].get("recv")
        was_last = np.concatenate(last[r])
        out.append(RankArrival(rank=r, collectives=len(v), last_share=float(np.mean(was_last)),
                               late_s=float(np.median(v)),
                               busy_s=float(np.median(np.concatenate(busy[r]))) if r in busy else None,
                               stability=sum(m == r for m in most) / 3,
                               measure=" and ".join(sorted(used)), group_size=int(np.median(sizes[r])),
                               recv_share=recv[0] / recv[1] if recv and recv[1] > 0 else None,
                               since_t=_began(np.concatenate(at[r]), was_last)))
    return sorted(out, key=lambda a: (-a.last_share, -a.late_s))


def _began(when: np.ndarray, was_last: np.ndarray) -> float | None:
    """When a rank began to arrive last: the change point of its last-or-not over its
    collectives in time order (two levels, ``stragglers.onset``, on 1 and 2 for not and
    last), where it is mostly last after and not before; None when no split fits (it was
    last from the first judged collective, or never mostly)."""
    order = np.argsort(when, kind="stable")
    i = onset(1.0 + was_last[order].astype(float), 1.5)
    return None if i is None else float(when[order][i])


def straggler(scores: list[RankArrival], members: int | None = None,
              step_s: float | None = None) -> RankArrival | None:
    """The rank the others waited for, if the arrivals name one (the rules above); with the
    job's median ``step_s``, only if it is late by more than the straggler model's chronic
    share of a step too (a rank 5% slower is not a straggler by either measure). A candidate
    that waited in receives for a neighbour (a pipeline victim) is passed over for the next
    latest, up to ``CANDIDATES``."""
    if len(scores) < 2:
        return None
    floor = CHRONIC * step_s if step_s is not None and step_s > 0 and math.isfinite(step_s) else 0.0
    for k, top in enumerate(scores[:CANDIDATES]):
        rest = scores[:k] + scores[k + 1:]
        n = min(members or top.group_size, top.group_size)
        others = [max(0.0, a.late_s) for a in rest]       # how late the others are (of two, one never is)
        typical = float(np.median(others)) if others else 0.0
        if top.collectives < MIN_COLLECTIVES or top.last_share < max(RECURRENCE, min(1.0, SMALL_GROUP / n)):
            return None
        if top.late_s < max(MIN_LATE_S, LATE_FACTOR * typical, floor):
            return None
        received = [a.recv_share for a in rest if a.recv_share is not None]
        if top.recv_share is not None and received and top.recv_share > float(np.median(received)) + CHRONIC:
            continue              # it waited for a neighbour's data: a pipeline passing the lateness on
        return top
    return None
