"""A snapshot of every rank on the watch's request: its Python stack now (py-spy).

The launcher that watches a job cannot reach ranks on other nodes, but each rank's task
wrapper (the recorder) is its parent on its own node. So the launcher writes one request
file in the store (``beat/snapshot.json``, ``{"id": N}``); every recorder looks for a new id
once per interval (one ``stat``), takes the snapshot in a thread of its own, writes
``stacks/rank-NNNNN.json`` and says ``"snapshot": N`` in its next heartbeat. A rank whose
recorder is gone, or whose stack cannot be read, is simply absent: the analysis says so.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from hpcml.files import load_json_bounded, read_json, write_atomic
from hpcml.observe import beat
from hpcml.observe.beat import Trust, beat_dir
from hpcml.observe.stacks import Stack
from hpcml.schemas import check, tag

REQUEST = "snapshot.json"
STACKS = "stacks"
FLIGHT_RECORDER = "flight-recorder"      # where the ranks dump it (hpcml.run.inject writes these names itself)
SCHEMA = tag("observe.stack", 1)
REQUEST_SCHEMA = tag("observe.snapshot", 1)
MAX_STACK_BYTES = 64 << 20               # of one stack file: py-spy's bounded stack fits many times over


def stack_path(observe: Path, rank: int) -> Path:
    return Path(observe) / STACKS / f"rank-{rank:05d}.json"


def request(observe: Path, ident: int) -> None:
    """Ask every rank of the store for a snapshot numbered ``ident``."""
    beat_dir(observe).mkdir(parents=True, exist_ok=True)
    write_atomic(beat_dir(observe) / REQUEST, json.dumps({"schema": REQUEST_SCHEMA, "id": ident,
                                                          "at": time.time()}).encode(), exclusive=False)


@dataclass(frozen=True, slots=True)
class RankStack:
    """A rank's stack file: which snapshot request it answers (``snapshot``), when it was
    taken (``at``) and the stack (``hpcml.observe.stacks.Stack``)."""

    rank: int
    snapshot: int | None
    at: float | None
    stack: Stack


def read_stacks(observe: Path, world: int | None = None, trust: Trust | None = None) -> dict[int, RankStack]:
    """Every rank's stack file, parsed (``Stack.of``); a file that is not one is left out,
    and so is one that is not its rank's: the rank it names must be its file name's
    (``stack_path``), below ``world`` (or ``trust.world``) where known, and, with ``trust``
    holding the attempt's secret, the file signed with that rank's key (``beat.Trust``, as
    the heartbeats are). The stacks name a hang's culprit: a file one rank wrote for
    another's must not pass for it."""
    out: dict[int, RankStack] = {}
    d = Path(observe) / STACKS
    if trust is not None:
        world = trust.world if world is None else min(world, trust.world)
    for p in sorted(d.glob("rank-*.json")) if d.is_dir() else []:
        digits = p.name.removeprefix("rank-").removesuffix(".json")
        if not (digits.isascii() and digits.isdigit() and len(digits) <= 9) or p != stack_path(observe, int(digits)):
            continue
        read: list[bytes] = []                         # the bytes parsed: what the signature is checked on
        try:
            doc = load_json_bounded(p, MAX_STACK_BYTES, follow_symlinks=False, check=read.append)
            raw = read[0]
            check(doc, SCHEMA, str(p))
        except Exception:  # noqa: BLE001 - a half-written or hostile file: that rank has no stack
            continue
        if not isinstance(doc, dict):
            continue
        rank, ident, at = doc.get("rank"), doc.get("snapshot"), doc.get("at")
        if not isinstance(rank, int) or isinstance(rank, bool) or rank != int(digits) \
                or (world is not None and not 0 <= rank < world):
            continue
        if trust is not None and trust.why_not(doc, raw) is not None:
            continue
        out[rank] = RankStack(rank=rank, snapshot=ident if isinstance(ident, int) and not isinstance(ident, bool)
                              else None,
                              at=float(at) if isinstance(at, (int, float)) and not isinstance(at, bool) else None,
                              stack=Stack.of(doc))
    return out


class Responder:
    """The recorder's side: ``poll()`` each interval; ``handled`` goes into the heartbeat."""

    def __init__(self, observe: Path, rank: int, pid: int) -> None:
        self.observe, self.rank, self.pid = Path(observe), rank, pid
        self.key = beat._key                  # the rank's key (``beat.sign_with``): its stack files are signed
        self.handled = 0
        self._seen: float | None = None
        self._thread: threading.Thread | None = None

    def poll(self) -> None:
        path = beat_dir(self.observe) / REQUEST
        try:
            mtime = os.stat(path).st_mtime
        except OSError:
            return
        if mtime == self._seen or (self._thread is not None and self._thread.is_alive()):
            return
        self._seen = mtime
        try:
            ident = int(read_json(path, REQUEST_SCHEMA)["id"])
        except Exception:  # noqa: BLE001 - a torn or foreign request: wait for the next
            return
        if ident > self.handled:
            self._thread = threading.Thread(target=self._take, args=(ident,), name="hpcml-snapshot", daemon=True)
            self._thread.start()

    def _take(self, ident: int) -> None:
        from hpcml.observe.stacks import dump
        stack = dump(self.pid)
        doc = {"schema": SCHEMA, "rank": self.rank, "snapshot": ident, "at": time.time(), **stack.to_json()}
        data = json.dumps(doc, separators=(",", ":")).encode()
        if self.key is not None:                    # signed as a heartbeat is (``beat.Trust`` checks it)
            data = data[:-1] + beat.SIG + beat._signature(self.key, data) + b'"}'
        try:
            (self.observe / STACKS).mkdir(parents=True, exist_ok=True)
            write_atomic(stack_path(self.observe, self.rank), data, exclusive=False)
        except OSError:
            pass
        self.handled = ident
