"""Hang analysis from PyTorch Flight Recorder dumps (one pickle per rank).

Each rank's dump lists its recent collectives with a per-process-group sequence number
(``collective_seq_id``). In a hang, the ranks that never entered the collective the
others are waiting in are the likely culprits (they are stuck before it); ranks that
entered the same sequence number with a different operation or different sizes are a
mismatch (a code path that differs by rank). The dump is a ring buffer, so only sequence
numbers every rank still holds are compared.

Dumps are pickles written by another process: they are read with hpcml's restricted
unpickler and an empty allowlist, because the format is plain data (dicts, lists, str,
int, float, None, bool, tuples) and imports nothing. A dump that tries to import anything
is refused and reported, never executed.
"""

from __future__ import annotations

import ast
import os
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from hpcml.errors import UsageError
from hpcml.scan.loader import RestrictedUnpickler
from hpcml.scan.policy import Policy

_RANK_SUFFIX = re.compile(r"(\d+)$")
MAX_DUMP_BYTES = 1 << 30


@dataclass
class Finding:
    pg: str                      # process group name (and description)
    seq: int                     # collective_seq_id
    kind: str                    # "never-entered" or "mismatch"
    culprits: list[int]          # ranks to look at first
    detail: str
    entered: list[int] = field(default_factory=list)


@dataclass
class HangReport:
    tag: ClassVar[str] = "hpcml.observe.hang/1"   # the schema of `hpcml observe hang --json`
    dumps: dict[int, Path]
    refused: dict[str, str]      # file -> why it was not read
    missing: list[int]           # ranks of the world without a dump
    findings: list[Finding]
    last_seq: dict[str, dict[int, int]]   # pg -> rank -> last collective_seq_id


def load_dump(path: str | os.PathLike) -> dict[str, Any]:
    """One Flight Recorder dump; anything that imports a global is refused."""
    p = Path(path)
    if p.stat().st_size > MAX_DUMP_BYTES:
        raise pickle.UnpicklingError(f"larger than {MAX_DUMP_BYTES >> 20} MiB")
    with open(p, "rb") as fh:
        data = RestrictedUnpickler(fh, policy=Policy(block_unknown=True)).load()
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise pickle.UnpicklingError("not a Flight Recorder dump (no 'entries' list)")
    return data


def _world(dumps: dict[int, dict]) -> set[int]:
    """Ranks of the default process group, from any dump's pg_config."""
    for d in dumps.values():
        for pg in (d.get("pg_config") or {}).values():
            ranks = pg.get("ranks") if isinstance(pg, dict) else None
            try:
                parsed = ast.literal_eval(ranks) if isinstance(ranks, str) else ranks
            except (ValueError, SyntaxError):
                continue
            if isinstance(parsed, (list, tuple)) and parsed:
                return {int(r) for r in parsed}
    return set(dumps)


def _collectives(entries: list[dict]) -> dict[str, dict[int, dict]]:
    """pg name -> seq -> entry, collectives only (p2p have their own numbering)."""
    out: dict[str, dict[int, dict]] = {}
    for e in entries:
        if not isinstance(e, dict) or e.get("is_p2p") or e.get("collective_seq_id") is None:
            continue
        pg = e.get("process_group") or (str(e.get("pg_id")), "")
        name = f"{pg[0]} ({pg[1]})" if len(pg) > 1 and pg[1] else str(pg[0])
        out.setdefault(name, {})[int(e["collective_seq_id"])] = e
    return out


def analyse(dump_dir: str | os.PathLike) -> HangReport:
    d = Path(dump_dir)
    if not d.is_dir():
        raise UsageError("not a directory of Flight Recorder dumps", file=str(d))
    dumps: dict[int, dict] = {}
    paths: dict[int, Path] = {}
    refused: dict[str, str] = {}
    for f in sorted(d.iterdir()):
        m = _RANK_SUFFIX.search(f.name)
        if not f.is_file() or not m:
            continue
        try:
            dumps[int(m.group(1))] = load_dump(f)
            paths[int(m.group(1))] = f
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, OSError, AttributeError,
                IndexError, KeyError, MemoryError) as exc:
            refused[f.name] = f"{type(exc).__name__}: {exc}"
    if not dumps and not refused:
        raise UsageError("no Flight Recorder dumps here (files named <prefix><rank>)", file=str(d))
    world = _world(dumps) | set(dumps)
    missing = sorted(world - set(dumps))
    per_rank = {r: _collectives(dump["entries"]) for r, dump in dumps.items()}
    findings: list[Finding] = []
    last_seq: dict[str, dict[int, int]] = {}
    for pg in sorted({pg for c in per_rank.values() for pg in c}):
        seqs = {r: c.get(pg, {}) for r, c in per_rank.items()}
        members = [r for r, s in seqs.items() if s]
        last_seq[pg] = {r: max(s) for r, s in seqs.items() if s}
        if len(members) < 2:
            continue
        first_common = max(min(seqs[r]) for r in members)       # older entries fell out of some buffers
        for seq in range(first_common, max(last_seq[pg].values()) + 1):
            entered = [r for r in members if seq in seqs[r]]
            absent = [r for r in members if seq not in seqs[r]]
            if absent:
                e = seqs[entered[0]][seq]
                findings.append(Finding(pg, seq, "never-entered", absent,
                                        f"{e.get('profiling_name')} {e.get('input_sizes')}: ranks "
                                        f"{absent} never entered it (stuck before it)", entered))
                break
            shapes = {(seqs[r][seq].get("profiling_name"), repr(seqs[r][seq].get("input_sizes")))
                      for r in members}
            if len(shapes) > 1:
                groups: dict[tuple, list[int]] = {}
                for r in members:
                    e = seqs[r][seq]
                    groups.setdefault((e.get("profiling_name"), repr(e.get("input_sizes"))), []).append(r)
                minority = min(groups.values(), key=len)
                findings.append(Finding(pg, seq, "mismatch", minority,
                                        "; ".join(f"ranks {rs}: {n} {s}" for (n, s), rs in groups.items()),
                                        members))
                break
    return HangReport(dumps=paths, refused=refused, missing=missing, findings=findings, last_seq=last_seq)
