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
from pathlib import Path
from typing import Any

from hpcml.files import read_json, write_atomic
from hpcml.observe.beat import beat_dir
from hpcml.schemas import tag

REQUEST = "snapshot.json"
STACKS = "stacks"
FLIGHT_RECORDER = "flight-recorder"      # where the ranks dump it (hpcml.run.inject writes these names itself)
SCHEMA = tag("observe.stack", 1)
REQUEST_SCHEMA = tag("observe.snapshot", 1)


def stack_path(observe: Path, rank: int) -> Path:
    return Path(observe) / STACKS / f"rank-{rank:05d}.json"


def request(observe: Path, ident: int) -> None:
    """Ask every rank of the store for a snapshot numbered ``ident``."""
    beat_dir(observe).mkdir(parents=True, exist_ok=True)
    write_atomic(beat_dir(observe) / REQUEST, json.dumps({"schema": REQUEST_SCHEMA, "id": ident,
                                                          "at": time.time()}).encode(), exclusive=False)


def read_stacks(observe: Path) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    d = Path(observe) / STACKS
    for p in sorted(d.glob("rank-*.json")) if d.is_dir() else []:
        try:
            doc = read_json(p, SCHEMA)
        except Exception:  # noqa: BLE001 - a half-written or hostile file: that rank has no stack
            continue
        if isinstance(doc, dict) and isinstance(doc.get("rank"), int):
            out[doc["rank"]] = doc
    return out


class Responder:
    """The recorder's side: ``poll()`` each interval; ``handled`` goes into the heartbeat."""

    def __init__(self, observe: Path, rank: int, pid: int) -> None:
        self.observe, self.rank, self.pid = Path(observe), rank, pid
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
        doc = {"schema": SCHEMA, "rank": self.rank, "snapshot": ident, "at": time.time(), **stack}
        try:
            (self.observe / STACKS).mkdir(parents=True, exist_ok=True)
            write_atomic(stack_path(self.observe, self.rank), json.dumps(doc).encode(), exclusive=False)
        except OSError:
            pass
        self.handled = ident
