"""Hang analysis from PyTorch Flight Recorder dumps (one pickle per rank).

What a dump says about each process group the rank belongs to:

- ``pg_config``: the group's name, description and global ranks (the membership; a rank
  with no entry in a group is still a member);
- ``pg_status``: the rank's ``last_enqueued_collective``, ``last_started_collective`` and
  ``last_completed_collective`` in that group (``-1``: none, or not tracked), keyed by the
  rank's local id of the group, not its name (see ``_status_names``);
- ``entries``: its recent collectives (a ring buffer) with the group's sequence number
  (``collective_seq_id``). Dumps taken with ``onlyActive=True`` hold only the collectives
  still pending, so a rank that never reached the collective has an empty list.

The rules, per process group, in this order (the first that applies is the finding):

1. **never entered**: ranks whose last enqueued collective is behind the group's furthest
   rank are stuck before the collective the others wait in. Progress comes from
   ``pg_status``, else from the highest sequence number in the entries; a member with
   neither, in a dump of pending collectives only, has nothing pending and so is behind
   (only when some member has a collective pending there: else all may be done with it).
2. **never started**: every member enqueued the same collective, but some never started
   theirs (``last_started_collective`` behind the others'; only when the dumps track start
   times): their GPU stream is stuck before it.
3. **mismatch**: at a sequence number every member still records, ranks issued a different
   operation, or different sizes or dtypes (``_shape``: what PyTorch's analyser compares).
   A coalesced collective (member entries sharing the number, closed by a ``*coalesced``
   record) is compared as a whole, and one left unclosed on a rank differs. The culprits
   are the ranks outside the majority (more than half of the members); without a majority
   no culprit is named and the finding says so.

Point-to-point entries (``is_p2p``, or named ``send a->b`` / ``recv b<-a``) have their own
numbering (``p2p_seq_id``, per rank and group) and are never compared as collectives: how
many a rank posts depends on its pipeline stage (the first and last stages post fewer). On a
group that carries them, pg_status is not read either, as torch sets it from whichever
operation came last, a send's or receive's own number included; the collective progress
there comes from the collective entries and the ``collective_seq_id`` stamped on each p2p
entry. Sends are paired with receives per group and peer in each rank's own issue order
(``_p2p_findings``), and a rank waiting on a peer that never enqueued its side names that
peer: the waiting rank waits, the peer is late.

Each finding lists the ranks that wait (``waiting``) apart from those they wait for
(``late``); ``culprits`` keeps its meaning (the ranks to look at first in that group).

Members without a dump are listed as missing, never a group's culprits: their state is unknown. Culprits
are sorted, each with its evidence (enqueued / started / completed against the group's).

Across groups, a culprit is not necessarily a root cause. A rank behind in group A that
has a collective of its own pending in group B, where it entered and B's culprits did
not, is *blocked* behind B's culprits: it cannot reach A's collective until B's completes
(as with NVRx's "lock_gil" fault: ranks 8-15 look behind on the default group, but all
except 9 and 14 wait inside an expert-parallel all_to_all for 9 and 14). These waits form
a graph over the culprits; the chains are followed to the culprits that wait for nobody,
the **roots**. A group's members without a dump count among those a rank pending there
may wait for: they can be roots, and are marked so. Ranks that wait for each other (a cycle with no way out: collectives issued
in a different order on two groups) are all roots, and the cycle is reported.

A dump is a file named as torch names it, ``<prefix><rank>`` (``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``'s
prefix, ``hpcml run``'s ``rank-NNNNN``), a regular file: one prefix, one dump per rank, each
bounded (``MAX_DUMP_BYTES``, ``MAX_ENTRIES``) and only what the analysis reads of it kept.

Dumps are pickles written by another process: they are read with hpcml's restricted
unpickler and an empty allowlist, because the format is plain data (dicts, lists, str,
int, float, None, bool, tuples) and imports nothing. A dump that tries to import anything
is refused and reported, never executed.
"""

from __future__ import annotations

import os
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from hpcml.errors import UsageError
from hpcml.scan.loader import RestrictedUnpickler
from hpcml.scan.policy import Policy
from hpcml.schemas import tag
from hpcml.words import natural_key, ranges

_DUMP_NAME = re.compile(r"(.*?)(\d+)", re.S)   # <prefix><rank>: TORCH_NCCL_DEBUG_INFO_TEMP_FILE's prefix, the rank
#: one dump's bytes, at most (as ``arrivals.LIVE_DUMP_MAX``): torch's default ring of 2,000
#: entries is ~0.3 MB without stacks (tests/fixtures/gpu-h200/run), a few MB with them
MAX_DUMP_BYTES = 64 << 20
#: one dump's ``entries``, at most: torch keeps a ring of 2,000 by default
#: (``TORCH_FR_BUFFER_SIZE``, ``TORCH_NCCL_TRACE_BUFFER_SIZE`` before 2.5); 50 times that
#: leaves room for a raised buffer, while a pickle's memo can make millions of entries of
#: a few bytes each (30M in 57 MB: a minute and 2 GB to analyse)
MAX_ENTRIES = 100_000
MAX_GROUPS = 1 << 14             # a dump's pg_config or pg_status groups, at most
MAX_DUMPS = 1 << 15              # dumps read from one directory where the world size is not known
MAX_LISTED = 1 << 17             # the directory's names looked at, at most
#: what the analysis reads of an entry: the rest (its stack frames above all) is dropped as read
_ENTRY_KEYS = ("record_id", "pg_id", "process_group", "collective_seq_id", "p2p_seq_id", "op_id", "profiling_name",
               "input_sizes", "output_sizes", "input_dtypes", "output_dtypes", "state", "is_p2p",
               "time_created_ns", "duration_ms")
MAX_RANKS_TEXT = 1 << 23         # pg_config's ranks as text: 8 MiB holds a million ranks
#: operations whose per-rank sizes legitimately differ: sizes are undecidable there
SIZE_UNDECIDABLE = frozenset({"all_to_all", "alltoall", "all_to_all_single", "alltoall_base", "all_to_allv"})
PENDING = ("scheduled", "started")
PROGRESS = ("enqueued", "started", "completed")


@dataclass
class Finding:
    pg: str                      # process group name (and description)
    seq: int | None              # collective_seq_id (p2p_seq_id for point-to-point; None: the dump gave none)
    kind: str                    # "never-entered", "never-started" or "mismatch"
    culprits: list[int]          # ranks to look at first, sorted; empty: no culprit can be named
    detail: str
    entered: list[int] = field(default_factory=list)
    evidence: dict[int, dict[str, int | None]] = field(default_factory=dict)   # rank -> its progress
    group: dict[str, int | None] = field(default_factory=dict)                 # the furthest member's
    waiting: list[int] = field(default_factory=list)   # ranks that wait in it for others (not at fault here)
    late: list[int] = field(default_factory=list)      # ranks the waiting ones wait for (behind, or never posted)


@dataclass
class HangReport:
    tag: ClassVar[str] = tag("observe.hang", 1)   # the schema of `hpcml observe hang --json`
    dumps: dict[int, Path]
    refused: dict[str, str]      # file (``<prefix><rank>``: those so named) -> why it was not read
    missing: list[int]           # ranks of the world without a dump
    findings: list[Finding]
    last_seq: dict[str, dict[int, int]]   # pg -> rank -> last enqueued collective_seq_id
    roots: list[int] = field(default_factory=list)               # culprits (or ranks without a dump) waiting for no one
    blocked: dict[int, list[int]] = field(default_factory=dict)  # culprit -> the roots it waits for
    cycles: list[list[int]] = field(default_factory=list)        # culprits that wait for each other
    backends: list[str] = field(default_factory=list)            # the entries' backends (nccl, gloo...), sorted
    pending: list[int] = field(default_factory=list)             # ranks with a collective of theirs not completed

    def summary(self) -> str:
        """One line: the roots first, blocked ranks apart, grouped by what they wait for."""
        if not self.roots:
            return "no culprit named"
        unknown = [r for r in self.roots if r in self.missing]
        parts = [f"roots: {_rank_list(self.roots)}" + (f" (no dump from {ranges(unknown)})" if unknown else "")]
        behind: dict[tuple[int, ...], list[int]] = {}
        for r, roots in sorted(self.blocked.items()):
            behind.setdefault(tuple(roots), []).append(r)
        parts += [f"{_rank_list(rs)} blocked behind {ranges(list(roots))}" for roots, rs in behind.items()]
        parts += [f"{_rank_list(c)} wait for each other (collectives in a different order on two groups)"
                  for c in self.cycles]
        return "; ".join(parts)


def _rank_list(ranks: list[int]) -> str:
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {ranges(ranks)}"


def load_dump(path: str | os.PathLike, max_bytes: int = MAX_DUMP_BYTES, *,
              follow_symlinks: bool = True) -> dict[str, Any]:
    """One Flight Recorder dump; anything that imports a global is refused. Read as a file
    the job's own program may have replaced (``files.read_bounded``: a FIFO is not waited on,
    a device not read, at most ``max_bytes``, a symlink followed only if asked): ValueError
    or OSError then, ValueError too for more entries or groups than a recorder keeps
    (``check_size``)."""
    import io

    from hpcml.files import read_bounded
    raw = read_bounded(path, max_bytes, follow_symlinks=follow_symlinks)
    data = RestrictedUnpickler(io.BytesIO(raw), policy=Policy(block_unknown=True)).load()
    del raw
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise pickle.UnpicklingError("not a Flight Recorder dump (no 'entries' list)")
    check_size(data)
    return data


def check_size(dump: dict) -> None:
    """ValueError where a dump holds more entries (``MAX_ENTRIES``) or groups (``MAX_GROUPS``)
    than a Flight Recorder writes: checked before anything is built per entry."""
    entries = dump.get("entries")
    if isinstance(entries, (list, tuple)) and len(entries) > MAX_ENTRIES:
        raise ValueError(f"{len(entries):,} entries, more than {MAX_ENTRIES:,}: not a Flight Recorder's ring "
                         f"(torch keeps 2,000 by default, TORCH_FR_BUFFER_SIZE)")
    for key in ("pg_config", "pg_status"):
        groups = dump.get(key)
        if isinstance(groups, (dict, list, tuple)) and len(groups) > MAX_GROUPS:
            raise ValueError(f"{len(groups):,} groups in its {key}, more than {MAX_GROUPS:,}")


def _ranks(value: Any) -> list[int] | None:
    """pg_config's ``ranks``: a string such as "[0, 1, 2]" (or a list). Read by hand, not by
    ``ast.literal_eval``: the dump may be hostile, and a crafted literal costs the parser
    memory and recursion it cannot bound."""
    if isinstance(value, str):
        text = value.strip()
        if len(text) > MAX_RANKS_TEXT or not (text.startswith("[") and text.endswith("]")):
            return None
        items = [x.strip() for x in text[1:-1].split(",")]
        if items == [""]:
            return []
        if not all(x.isascii() and x.isdigit() and len(x) < 10 for x in items):
            return None
        return [int(x) for x in items]
    if isinstance(value, (list, tuple)) and all(type(r) is int for r in value):
        return [int(r) for r in value]
    return None


def _pg_label(name: str, desc: str | None) -> str:
    return f"{name} ({desc})" if desc else name


def _groups(dumps: dict[int, dict]) -> dict[str, tuple[str, list[int]]]:
    """pg name -> (label, member ranks), from every dump's pg_config."""
    out: dict[str, tuple[str, list[int]]] = {}
    for d in dumps.values():
        config = d.get("pg_config")
        if not isinstance(config, dict):
            continue
        for key, pg in config.items():
            if not isinstance(pg, dict):
                continue
            name = str(pg.get("name", key))
            ranks = _ranks(pg.get("ranks"))
            if not name or not ranks:
                continue                     # gloo writes a placeholder {"name": "", "ranks": "[]"}
            label = _pg_label(name, str(pg["desc"]) if pg.get("desc") else None)
            if name not in out or len(ranks) > len(out[name][1]):
                out[name] = (label, sorted(set(ranks)))
    return out


def _seq(e: dict, key: str = "collective_seq_id") -> int | None:
    """A sequence number as torch writes it (an int; PyTorch's own test fixtures write str)."""
    v = e.get(key)
    try:
        return int(v) if v is not None and not isinstance(v, bool) else None
    except (TypeError, ValueError, OverflowError):
        return None


def _pg_of(e: dict) -> str:
    pg = e.get("process_group") or (str(e.get("pg_id")), "")
    return str(pg[0]) if isinstance(pg, (tuple, list)) and pg else str(pg)


def _collectives(entries: list[dict]) -> dict[str, dict[int, list[dict]]]:
    """pg name -> seq -> the entries of that collective, in record order (p2p have their
    own numbering). One entry, except a coalesced collective: its member operations share
    the sequence number and a ``*coalesced`` record closes them (NCCL's slow path for
    ``_coalescing_manager`` broadcasts, FSDP's gathers and reduce-scatters)."""
    out: dict[str, dict[int, list[dict]]] = {}
    for e in entries:
        if not isinstance(e, dict) or _is_p2p(e) or (seq := _seq(e)) is None:
            continue
        out.setdefault(_pg_of(e), {}).setdefault(seq, []).append(e)
    return out


def collectives_of(entries: list[dict]) -> dict[str, dict[int, list[dict]]]:
    """``_collectives``: pg name -> seq -> that collective's entries (``hpcml.observe.arrivals``)."""
    return _collectives(entries)


def p2p_receive(e: dict) -> bool:
    """A point-to-point receive (``nccl:recv 1<-0``): the entry a pipeline stage waits in for
    its neighbour (``hpcml.observe.arrivals``)."""
    return isinstance(e, dict) and _is_p2p(e) and _op(e).strip().startswith("recv")


def groups_of(dumps: dict[int, dict]) -> dict[str, tuple[str, list[int]]]:
    """``_groups``: pg name -> (label, member ranks) (``hpcml.observe.arrivals``)."""
    return _groups(dumps)


def _is_p2p(e: dict) -> bool:
    """A point-to-point entry: ``is_p2p`` (torch >= 2.5), else its name (``nccl:send 0->1``,
    ``nccl:recv 1<-0``), which every torch version writes."""
    return bool(e.get("is_p2p")) or _P2P.match(_op(e).strip()) is not None


def _p2p_levels(entries: list[dict]) -> dict[str, int]:
    """pg name -> the highest ``collective_seq_id`` a point-to-point entry of the rank
    records there. torch stamps a p2p entry with the group's collective counter at the
    time (its last enqueued collective) next to its own ``p2p_seq_id``: a lower bound on
    the rank's collective progress in that group, never a p2p count."""
    out: dict[str, int] = {}
    for e in entries:
        if isinstance(e, dict) and _is_p2p(e) and (seq := _seq(e)) is not None:
            pg = _pg_of(e)
            out[pg] = max(seq, out.get(pg, seq))
    return out


def _p2p_groups(dumps: dict[int, dict]) -> set[str]:
    """The groups that carry point-to-point traffic in any dump (pipeline-parallel groups,
    and the default group where a job sends on it)."""
    return {_pg_of(e) for d in dumps.values() for e in d["entries"] if isinstance(e, dict) and _is_p2p(e)}


def _closes(e: dict) -> bool:
    """The record that ends a coalesced group: ``nccl:coalesced``, ``ALLGATHER_coalesced``..."""
    return _op(e).endswith("coalesced") and _op(e) not in ("allreduce_coalesced",)


def _labels_from_entries(entries: list[dict]) -> dict[str, str]:
    out = {}
    for e in entries:
        pg = e.get("process_group") if isinstance(e, dict) else None
        if isinstance(pg, (tuple, list)) and pg:
            out[str(pg[0])] = _pg_label(str(pg[0]), str(pg[1]) if len(pg) > 1 and pg[1] else None)
    return out


def _status_names(dump: dict, rank: int) -> dict[str, str]:
    """pg_status key -> group name. Torch keys pg_status by the backend's local id (a
    per-process counter over the groups this rank is a member of, in creation order), but
    pg_config and the entries by the group's name, so on a subgroup the two differ (rank 9
    in its third group: key "2", name "6"). The entries pair them (pg_id, process_group);
    for groups with no entry left, local ids follow the creation order of the rank's groups,
    which is the order of their names where torch numbered them (a counter every rank
    advances alike), where the pairs the entries give bear that order out. A dump with no
    entry (``onlyActive``: nothing pending) proves no order: its other keys are unknown, not
    guessed. The default group is local id 0, named "0"."""
    pairs: dict[str, str] = {}
    for e in dump.get("entries") or []:
        pg = e.get("process_group") if isinstance(e, dict) else None
        if isinstance(e, dict) and isinstance(e.get("pg_id"), int) and isinstance(pg, (tuple, list)) and pg:
            pairs[str(e["pg_id"])] = str(pg[0])
    config = dump.get("pg_config")
    mine = [str(g.get("name")) for g in (config.values() if isinstance(config, dict) else [])
            if isinstance(g, dict) and rank in (_ranks(g.get("ranks")) or [])]
    if pairs and mine and all(n.isdigit() for n in mine):
        order = {str(i): n for i, n in enumerate(sorted(set(mine), key=int))}
        if all(order.get(k) == v for k, v in pairs.items()):
            pairs = {**order, **pairs}
    pairs.setdefault("0", "0")
    return pairs


def _statuses(dump: dict, rank: int) -> dict[str, dict[str, int | None]]:
    """The rank's pg_status by group name: enqueued / started / completed (None: not known)."""
    raw = dump.get("pg_status")
    if not isinstance(raw, dict):
        return {}
    names = _status_names(dump, rank)
    out: dict[str, dict[str, int | None]] = {}
    for key, st in raw.items():
        if str(key) not in names or not isinstance(st, dict):
            continue                     # a group this dump cannot name: better unknown than misread
        p: dict[str, int | None] = {}
        for k in PROGRESS:
            v = st.get(f"last_{k}_collective")
            p[k] = int(v) if isinstance(v, int) and v >= 0 else None
        out[names[str(key)]] = p
    return out


def _pending_only(dumps: dict[int, dict]) -> bool:
    """True when the dumps hold pending collectives only (``onlyActive=True``)."""
    states = [e.get("state") for d in dumps.values() for e in d["entries"] if isinstance(e, dict)]
    return bool(states) and all(s in PENDING for s in states)


def _op(entry: dict) -> str:
    name = str(entry.get("profiling_name") or "")
    return name.split(":", 1)[-1]


def _shape(entry: dict) -> tuple:
    """What must agree across ranks for one operation, as PyTorch's analyser compares it:
    its name (the backend prefix, nccl, gloo, xccl, ..., is not compared), its dtypes and
    sizes, except what differs by rank legitimately: every size of an all_to_all, a
    scatter's inputs and a gather's outputs (only the root's hold data), a broadcast's or a
    scatter's input dtypes."""
    op = _op(entry)
    undecidable = op in SIZE_UNDECIDABLE
    ins = "-" if undecidable or op == "scatter" else repr(entry.get("input_sizes"))
    outs = "-" if undecidable or op == "gather" else repr(entry.get("output_sizes"))
    in_dt = "-" if op in ("scatter", "broadcast") else repr(entry.get("input_dtypes"))
    out_dt = "-" if op == "gather" else repr(entry.get("output_dtypes"))
    sizes = "(sizes differ by rank legitimately)" if undecidable else f"{ins} -> {outs}"
    return (op, f"{in_dt} -> {out_dt}", sizes)


def _unit_shape(unit: list[dict]) -> tuple:
    """What must agree across ranks at one sequence number: every operation of a coalesced
    group, in order, and whether the group was closed (an unclosed one is incomplete)."""
    if len(unit) == 1:
        return _shape(unit[0])
    closed = _closes(unit[-1])
    members = tuple(_shape(e) for e in unit if not _closes(e))
    return ("coalesced" if closed else "coalesced, incomplete (no closing record)",
            repr([m[1] for m in members]), repr([(m[0], m[2]) for m in members]))


def _unit_text(unit: list[dict]) -> str:
    if len(unit) == 1:
        return f"{unit[0].get('profiling_name')} {unit[0].get('input_sizes')}"
    ops = [f"{_op(e)} {e.get('input_sizes')}" for e in unit if not _closes(e)]
    close = _op(unit[-1]) if _closes(unit[-1]) else "no closing record"
    return f"coalesced group [{', '.join(ops)}] ({close})"


def _evidence_text(ranks: list[int], evidence: dict[int, dict], group: dict) -> str:
    def fmt(p: dict) -> str:
        return "/".join("?" if p.get(k) is None else str(p[k]) for k in PROGRESS)
    parts = [f"rank {r} {fmt(evidence[r])}" for r in ranks]
    return f"{'; '.join(parts)} (enqueued/started/completed; group's furthest {fmt(group)})"


class _Group:
    """One process group across the dumps."""

    def __init__(self, pg: str, label: str, members: list[int], dumps: dict[int, dict],
                 per_rank: dict[int, dict[str, dict[int, list[dict]]]], statuses: dict[int, dict[str, dict]],
                 pending_only: bool, p2p_levels: dict[int, dict[str, int]] | None = None,
                 carries_p2p: bool = False) -> None:
        self.pg, self.label = pg, label
        self.members = members
        self.dumped = [r for r in members if r in dumps]
        self.seqs = {r: per_rank[r].get(pg, {}) for r in self.dumped}
        self.carries_p2p = carries_p2p
        self.progress: dict[int, dict[str, int | None]] = {}
        # On a group that carries point-to-point traffic, pg_status says nothing about the
        # collectives: torch sets last_enqueued/started/completed from whichever operation
        # came last, a send's or receive's own p2p_seq_id included, and how many of those a
        # rank posts depends on its pipeline stage (the first and last post fewer). Only the
        # entries' collective_seq_id count there.
        anyone_waits = any(self.seqs[r] for r in self.dumped)
        for r in self.dumped:
            p = dict.fromkeys(PROGRESS) if carries_p2p else dict(statuses[r].get(pg) or dict.fromkeys(PROGRESS))
            top = max(self.seqs[r]) if self.seqs[r] else None
            if carries_p2p and (level := (p2p_levels or {}).get(r, {}).get(pg)) is not None:
                top = level if top is None else max(top, level)
            if top is not None and (p["enqueued"] is None or top > p["enqueued"]):
                p["enqueued"] = top
            if p["enqueued"] is None and pending_only and not self.seqs[r] and anyone_waits:
                p["enqueued"] = -1           # nothing pending: it never enqueued what the others wait in
            self.progress[r] = p
        self.furthest: dict[str, int | None] = {
            k: max((v for p in self.progress.values() if (v := p[k]) is not None), default=None) for k in PROGRESS}

    def entry(self, seq: int) -> list[dict] | None:
        for r in self.dumped:
            if seq in self.seqs[r]:
                return self.seqs[r][seq]
        return None

    def _describe(self, seq: int) -> str:
        unit = self.entry(seq)
        return _unit_text(unit) if unit else f"collective #{seq}"

    def behind(self, key: str) -> Finding | None:
        top = self.furthest[key]
        known: dict[int, int] = {r: v for r, p in self.progress.items() if (v := p[key]) is not None}
        if top is None or len(known) < 2:
            return None
        lagging = sorted(r for r, v in known.items() if v < top)
        if not lagging:
            return None
        seq = min(known[r] for r in lagging) + 1
        ahead = sorted(r for r in known if r not in lagging)
        held = sorted(q for r in ahead for q in self.seqs[r] if q >= seq)
        if self.entry(seq) is None and held:
            seq = held[0]            # a level inferred from an empty dump: the first one pending
        evidence = {r: self.progress[r] for r in lagging}
        what = "never entered it (stuck before it)" if key == "enqueued" else \
            "enqueued it but never started it (their GPU stream is stuck before it)"
        kind = "never-entered" if key == "enqueued" else "never-started"
        detail = (f"{self._describe(seq)}: late: {_rank_list(lagging)} {what}; waiting: {_rank_list(ahead)}; "
                  f"{_evidence_text(lagging, evidence, self.furthest)}")
        return Finding(self.label, seq, kind, lagging, detail, ahead, evidence, dict(self.furthest),
                       waiting=list(ahead), late=list(lagging))

    def mismatch(self) -> Finding | None:
        holders = [r for r in self.dumped if self.seqs[r]]
        if len(holders) < 2 or len(holders) < len(self.dumped):
            return None
        first = max(min(self.seqs[r]) for r in holders)        # older entries fell out of some buffers
        last = min(max(self.seqs[r]) for r in holders)
        for seq in range(first, last + 1):
            if any(seq not in self.seqs[r] for r in holders):
                continue
            groups: dict[tuple, list[int]] = {}
            for r in holders:
                groups.setdefault(_unit_shape(self.seqs[r][seq]), []).append(r)
            if len(groups) < 2:
                continue
            ranked = sorted(groups.values(), key=len, reverse=True)
            text = "; ".join(f"{_rank_list(rs)}: {shape[0]} {shape[2]}" for shape, rs in
                             sorted(groups.items(), key=lambda kv: -len(kv[1])))
            if len(ranked[0]) * 2 > len(holders):
                culprits = sorted(r for rs in ranked[1:] for r in rs)
                return Finding(self.label, seq, "mismatch", culprits,
                               f"{_rank_list(culprits)} differ from the majority: {text}", sorted(holders))
            return Finding(self.label, seq, "mismatch", [],
                           f"no majority, so no culprit can be named: {text}", sorted(holders))
        return None

    def finding(self) -> Finding | None:
        return self.behind("enqueued") or self.behind("started") or self.mismatch()

    def pending(self) -> set[int]:
        """Members with a collective of their own not completed here: waiting in this group.
        From the entries' states, else from pg_status (completed behind enqueued, or not
        tracked at all: torch leaves it at -1 unless it times the collectives)."""
        out = set()
        for r in self.dumped:
            seqs, p = self.seqs[r], self.progress[r]
            top = p["enqueued"]
            if any(e.get("state") in PENDING for unit in seqs.values() for e in unit):
                out.add(r)
            elif top is not None and top >= 0 and not self.carries_p2p \
                    and (seqs.get(top) or [{}])[-1].get("state") is None \
                    and (p["completed"] is None or p["completed"] < top):
                out.add(r)
        return out


_P2P = re.compile(r"^(send|recv)\s+(\d+)\s*(->|<-)\s*(\d+)$")


def _p2p_ops(dump: dict, rank: int, groups: dict[str, tuple[str, list[int]]]
             ) -> list[tuple[str, str, int, dict]]:
    """The rank's point-to-point entries as (pg, "send"/"recv", peer's global rank, entry),
    in the order the rank issued them (its own ``p2p_seq_id`` per group, else record order).
    torch writes ``send 0->1`` / ``recv 1<-0`` in the group's local ranks: the i-th of its
    sorted global ranks, as PyTorch's analyser maps them."""
    out = []
    for i, e in enumerate(dump.get("entries") or []):
        if not isinstance(e, dict) or not _is_p2p(e):
            continue
        m = _P2P.match(_op(e).strip())
        pg = _pg_of(e)
        members = groups.get(pg, ("", []))[1]
        if not m or not members:
            continue
        kind, b = m.group(1), int(m.group(4))
        if b >= len(members):          # send me->peer, recv me<-peer: the peer is b
            continue
        out.append((i, pg, kind, members[b], e))
    out.sort(key=lambda x: (x[1], _seq(x[4], "p2p_seq_id") is None, _seq(x[4], "p2p_seq_id") or 0, x[0]))
    return [(pg, kind, peer, e) for _, pg, kind, peer, e in out]


def _p2p_unmatched(label: str, me: int, kind: str, peer: int, e: dict, n: int) -> Finding:
    verb = "a receive from" if kind == "recv" else "a send to"
    never = "the send" if kind == "recv" else "the receive"
    return Finding(label, _seq(e, "p2p_seq_id"), "p2p-unmatched", [peer],
                   f"rank {me} waits in {verb} rank {peer} ({_op(e)}, its #{n + 1} towards rank {peer}, "
                   f"p2p_seq_id {_seq(e, 'p2p_seq_id')}); rank {peer} never enqueued {never}; "
                   f"waiting: rank {me}; late: rank {peer}", [me], waiting=[me], late=[peer])


def _p2p_findings(dumps: dict[int, dict], groups: dict[str, tuple[str, list[int]]],
                  pending_only: bool) -> list[Finding]:
    """Sends paired with receives, per group and peer, in the order each rank issued them
    (each rank's own ``p2p_seq_id``: the numbers of two ranks are never compared, as a
    pipeline stage posts as many as its place in the pipeline makes it). A rank waiting in
    a receive (or a send) that its peer never enqueued names the peer; paired operations
    whose sizes differ are a mismatch.

    Full dumps: only when both hold every p2p entry they made (the ring buffer did not
    wrap), the n-th send paired with the n-th receive. Dumps of pending operations only
    (``onlyActive``): what completed is gone on both sides, so only the first pending
    operation of a rank towards a peer is judged: it waits on nothing of its own before it
    on that pair, and it cannot complete without the peer's side, so a peer with no pending
    matching operation never posted it (sizes are not compared there: counts of completed
    eager sends may differ)."""
    ops = {r: _p2p_ops(d, r, groups) for r, d in dumps.items()}
    out: list[Finding] = []
    if pending_only:
        for me, mine in sorted(ops.items()):
            order = {id(e): i for i, e in enumerate(dumps[me]["entries"])}
            first_coll: dict[str, int] = {}      # pg -> the first pending collective's place
            for i, x in enumerate(dumps[me]["entries"]):
                if isinstance(x, dict) and not _is_p2p(x) and x.get("state") in PENDING:
                    first_coll.setdefault(_pg_of(x), i)
            seen: set[tuple[str, int]] = set()
            for pg, kind, peer, e in mine:
                if (pg, peer) in seen or e.get("state") not in PENDING or peer not in dumps or peer == me:
                    continue
                if order[id(e)] > first_coll.get(pg, len(order)):
                    continue                      # behind a collective of its own on that group: waits there first
                seen.add((pg, peer))              # the first pending one towards this peer only
                other = "recv" if kind == "send" else "send"
                if not any((p, k, q) == (pg, other, me) and x.get("state") in PENDING for p, k, q, x in ops[peer]):
                    out.append(_p2p_unmatched(groups.get(pg, (pg, []))[0], me, kind, peer, e, 0))
        return out
    wrapped = {r for r, d in dumps.items()
               if any(isinstance(e, dict) and e.get("record_id") not in (None, 0) for e in d["entries"][:1])}
    for me, mine in sorted(ops.items()):
        for pg, kind, peer, e in mine:
            if e.get("state") not in PENDING or peer not in dumps or {me, peer} & wrapped:
                continue
            other = "recv" if kind == "send" else "send"
            mine_same = [x for p, k, q, x in mine if (p, k, q) == (pg, kind, peer)]
            theirs = [x for p, k, q, x in ops[peer] if (p, k, q) == (pg, other, me)]
            n = next(i for i, x in enumerate(mine_same) if x is e)
            label = groups.get(pg, (pg, []))[0]
            if n >= len(theirs):
                out.append(_p2p_unmatched(label, me, kind, peer, e, n))
                continue
            mine_size = e.get("input_sizes" if kind == "send" else "output_sizes")
            x = theirs[n]
            their_size = x.get("output_sizes" if kind == "send" else "input_sizes")
            if kind == "send" and mine_size != their_size:
                out.append(Finding(label, _seq(e, "p2p_seq_id"), "mismatch", [],
                                   f"rank {me} sends {mine_size} to rank {peer}, which receives "
                                   f"{their_size}: no culprit can be named", sorted({me, peer})))
    return out


def _attribute(groups: list[tuple[Finding | None, set[int], list[int]]]
               ) -> tuple[list[int], dict[int, list[int]], list[list[int]]]:
    """Roots, blocked culprits (-> the roots they wait for) and cycles, from each group's
    finding (or None), its members with a collective pending there and its members
    without a dump.

    A culprit waits for the culprits of every group where it entered the collective and
    has it pending, and for the members of that group that left no dump (unknown, so
    possibly the ones it waits for: better named than letting the waiting rank pass for a
    root). Every culprit reaches at least one strongly connected component that waits for
    no one outside itself: its members are the roots (one rank, or a cycle)."""
    waits: dict[int, set[int]] = {r: set() for f, _, _ in groups if f for r in f.culprits}
    for f, pending, missing in groups:
        culprits = f.culprits if f else []
        if not culprits and not missing:
            continue
        for r in pending & waits.keys():
            if f is None or (r in f.entered and r not in culprits):
                waits[r].update(culprits, missing)
    for r in {q for qs in waits.values() for q in qs} - waits.keys():
        waits[r] = set()                 # a member without a dump: waits for no one known
    comp = _components(waits)
    members: dict[int, list[int]] = {}
    for r, c in comp.items():
        members.setdefault(c, []).append(r)
    roots_of: dict[int, set[int]] = {}
    sinks: set[int] = set()
    for c in sorted(members):            # a component's successors are numbered before it
        after = {comp[q] for r in members[c] for q in waits[r]} - {c}
        if after:
            roots_of[c] = set().union(*(roots_of[c2] for c2 in after))
        else:
            roots_of[c] = set(members[c])
            sinks.add(c)
    roots = sorted(r for c in sinks for r in members[c])
    blocked = {r: sorted(roots_of[comp[r]]) for r in sorted(waits) if comp[r] not in sinks}
    cycles = sorted(sorted(members[c]) for c in sinks if len(members[c]) > 1)
    return roots, blocked, cycles


def _components(graph: dict[int, set[int]]) -> dict[int, int]:
    """Tarjan's strongly connected components, iteratively (chains can be thousands of
    ranks long): node -> component number, numbered in reverse topological order (a
    component's successors come first)."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    comp: dict[int, int] = {}
    stack: list[int] = []
    on_stack: set[int] = set()
    count = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                n = count
                count += 1
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp[w] = n
                    if w == v:
                        break
    return comp


def _dump_names(d: Path, world: int | None, prefix: str | None
                ) -> tuple[dict[int, Path], dict[str, str]]:
    """The dumps to read: rank -> file, and the files passed over -> why. A dump is named as
    torch names it, ``<prefix><rank>`` (``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``'s prefix, the
    rank as written, or padded to 5 digits as ``hpcml run`` writes it), a regular file (a
    symlink is not followed); all of one prefix (``prefix``, else the one most files have),
    one per rank, below ``world`` where known, at most ``MAX_DUMPS`` otherwise."""
    named: dict[str, dict[int, list[str]]] = {}
    listed = 0
    refused: dict[str, str] = {}
    with os.scandir(d) as it:
        for entry in it:
            listed += 1
            if listed > MAX_LISTED:
                refused["..."] = f"more than {MAX_LISTED:,} files here: the rest were not looked at"
                break
            m = _DUMP_NAME.fullmatch(entry.name)
            if m is None or entry.name.startswith(".") or len(m[2]) > 9 or m[2] not in (str(int(m[2])),
                                                                                         f"{int(m[2]):05d}"):
                continue
            try:
                if not entry.is_file(follow_symlinks=False):
                    continue
            except OSError:
                continue
            named.setdefault(m[1], {}).setdefault(int(m[2]), []).append(entry.name)
    if not named:
        return {}, refused
    chosen = prefix if prefix is not None else min(named, key=lambda k: (-sum(map(len, named[k].values())),
                                                                          natural_key(k)))
    for other in sorted(set(named) - {chosen}, key=natural_key):
        n = sum(map(len, named[other].values()))
        refused[f"{other}<rank>"] = (f"{n} {'file' if n == 1 else 'files'} not read: the dumps here are named "
                                     f"{chosen}<rank>")
    ranks = sorted(named.get(chosen, {}))
    if world is not None:
        beyond = [r for r in ranks if not 0 <= r < world]
        ranks = [r for r in ranks if 0 <= r < world]
        if beyond:
            refused[f"{chosen}<rank>"] = f"ranks {ranges(beyond)} not read: the job has {world}"
    elif len(ranks) > MAX_DUMPS:
        refused[f"{chosen}<rank>"] = f"ranks {ranges(ranks[MAX_DUMPS:])} not read: more than {MAX_DUMPS:,} dumps"
        ranks = ranks[:MAX_DUMPS]
    paths: dict[int, Path] = {}
    for r in ranks:
        first, *more = sorted(named[chosen][r], key=natural_key)
        paths[r] = d / first
        refused.update({f: f"a second dump for rank {r} ({first} read)" for f in more})
    return paths, refused


def _slim(dump: dict) -> dict[str, Any]:
    """What the analysis reads of a dump, kept while the others are read: each entry's
    ``_ENTRY_KEYS`` (a dump's stack frames are most of it), the groups' config and status."""
    return {"entries": [{k: e[k] for k in _ENTRY_KEYS if k in e} if isinstance(e, dict) else None
                        for e in dump["entries"]],
            "pg_config": dump.get("pg_config"), "pg_status": dump.get("pg_status")}


def _read(d: Path, world: int | None = None, prefix: str | None = None
          ) -> tuple[dict[int, dict], dict[int, Path], dict[str, str]]:
    dumps: dict[int, dict] = {}
    names, refused = _dump_names(d, world, prefix)
    paths: dict[int, Path] = {}
    for r, f in names.items():
        try:
            dumps[r] = _slim(load_dump(f, follow_symlinks=False))
            paths[r] = f
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, OSError, AttributeError,
                IndexError, KeyError, MemoryError) as exc:
            refused[f.name] = f"{type(exc).__name__}: {exc}"
    return dumps, paths, refused


def analyse(dump_dir: str | os.PathLike, world: int | None = None, prefix: str | None = None) -> HangReport:
    """The hang analysis of a directory of Flight Recorder dumps (``_dump_names``: which are
    read); ``world``: the job's ranks, where known; ``prefix``: the dumps' names before the
    rank (``hpcml run``'s: ``rank-``), else the one most files here have."""
    d = Path(dump_dir)
    if not d.is_dir():
        raise UsageError("not a directory of Flight Recorder dumps", file=str(d))
    dumps, paths, refused = _read(d, world, prefix)
    if not dumps and not refused:
        raise UsageError("no Flight Recorder dumps here (files named <prefix><rank>)", file=str(d))
    groups = _groups(dumps)
    per_rank = {r: _collectives(dump["entries"]) for r, dump in dumps.items()}
    labels: dict[str, str] = {}
    for dump in dumps.values():
        labels.update(_labels_from_entries(dump["entries"]))
    # groups known only from entries (no pg_config): the ranks that have entries there
    for pg in {pg for c in per_rank.values() for pg in c} - set(groups):
        groups[pg] = (labels.get(pg, pg), sorted(r for r, c in per_rank.items() if pg in c))
    known = {r for _, members in groups.values() for r in members} | set(dumps)
    missing = sorted(r for r in known - set(dumps) if world is None or r < world)
    pending_only = _pending_only(dumps)
    statuses = {r: _statuses(dump, r) for r, dump in dumps.items()}
    p2p_levels = {r: _p2p_levels(dump["entries"]) for r, dump in dumps.items()}
    p2p_groups = _p2p_groups(dumps)
    findings: list[Finding] = []
    waiting: list[tuple[Finding | None, set[int], list[int]]] = []
    last_seq: dict[str, dict[int, int]] = {}
    for pg in sorted(groups, key=natural_key):
        label, members = groups[pg]
        g = _Group(pg, label, members, dumps, per_rank, statuses, pending_only, p2p_levels, pg in p2p_groups)
        last_seq[label] = {r: p["enqueued"] for r, p in g.progress.items() if p["enqueued"] is not None}
        found = g.finding()
        if found is not None:
            findings.append(found)
        waiting.append((found, g.pending(), [r for r in members if r not in dumps]))
    for found in _p2p_findings(dumps, groups, pending_only):
        findings.append(found)
        waiting.append((found, set(found.entered), []))
    roots, blocked, cycles = _attribute(waiting)
    names = (str(e.get("profiling_name") or "") for dump in dumps.values() for e in dump["entries"]
             if isinstance(e, dict))
    backends = sorted({n.partition(":")[0] for n in names if ":" in n})
    pending = sorted({r for _, waits, _ in waiting for r in waits})
    return HangReport(dumps=paths, refused=refused, missing=missing, findings=findings, last_seq=last_seq,
                      roots=roots, blocked=blocked, cycles=cycles, backends=backends, pending=pending)
