"""A rank's heartbeat: how far it has got, for a launcher that watches the job live.

Why a file per rank beside the store, and not the store itself: the store is Arrow IPC
streams a reader must parse from the start, and at 1,024 ranks the launcher would re-read
gigabytes to learn one number each. The recorder already sees every batch the rank logs
(``observe.log``/``observe.section`` through its pipe), so it keeps a few numbers of
progress and rewrites one fixed-size record in place (``pwrite`` of ``SIZE`` bytes at
offset 0: no rename, no new inode, one write per interval; on Lustre or GPFS as cheap as a
metadata-free write can be). The rank does nothing more than it did: nothing measurable.

Recent step times are two flat lists (``recent_steps``, ``recent_s``), not pairs: at 1,024
ranks a list per step made the launcher's parse mostly garbage-collector work.

A reader that catches a record being written (a torn read) sees JSON that does not parse
and keeps the previous one. Progress is a new step number (``observe.log(step=…)``, or a
section with a step) or a section that ended; step times come from a section named
``step`` when the program has one, else from the time between step numbers.

Whose record it is: the job directory is the user's program's too, and a record it writes
(a copied file, a test that fakes a rank, a script gone wrong) must not pass for a rank's.
``hpcml run`` gives each task wrapper a key for its rank (``rank_key`` of a secret made
anew for each attempt), which the wrapper sets with ``sign_with`` before its recorder
starts; every record that process writes ends in ``"sig"``, an HMAC of the bytes before it.
``Trust`` is the launcher's side: a record counts only for a rank the attempt started, only
with that rank's signature, and only when it is not older than the last one taken.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import operator
import os
import re
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, TypedDict

from hpcml.files import load_json_bounded
from hpcml.samplers.clockreasons import MASK_MAX
from hpcml.schemas import tag

SCHEMA = tag("observe.beat", 1)
SIZE = 4096                    # bytes of one record: 128 recent steps fit with room to spare
RECENT = 128                   # step times kept: what the live straggler model looks at
BEATS = "beat"                 # the directory in an observe store
STEP_SECTION = "step"
WAIT_SECTION = "collective_wait"   # a step's time in collectives (hpcml.observe.api.WAIT)
LIMIT = 1 << 62                # integers beyond this are not a rank's (and would not fit numpy's int64)
SIG = b',"sig":"'              # a signed record ends in SIG, 64 hex digits, '"}'
SIG_BYTES = len(SIG) + 64 + 2
MAX_GPUS = 16                  # GPUs named in one record (gpu_uuids): more than any node holds
GPU_UUID = re.compile(r"[A-Za-z0-9-]{1,96}")   # NVML's names (GPU-..., MIG-...): printed as they are
_key: bytes | None = None      # this process's rank key (``sign_with``): what its writers sign with


def rank_key(secret: bytes, rank: int) -> bytes:
    """The key of one rank, from the attempt's secret: a wrapper that holds its own rank's
    key cannot sign for another rank."""
    return hmac.new(secret, f"hpcml beat rank {rank}".encode(), hashlib.sha256).digest()


def sign_with(key: bytes | None) -> None:
    """Sign every record this process writes from now on with ``key`` (the task wrapper,
    before its recorder starts: the recorder makes its writer itself)."""
    global _key
    _key = key


def _signature(key: bytes, body: bytes) -> bytes:
    return hmac.new(key, body, hashlib.sha256).hexdigest().encode()


def beat_dir(observe: Path) -> Path:
    return Path(observe) / BEATS


def beat_path(observe: Path, rank: int) -> Path:
    return beat_dir(observe) / f"rank-{rank:05d}.json"


@dataclass(slots=True)
class Beat:
    """One rank's record as the launcher took it: the typed form of what ``BeatWriter``
    writes (``read_beats`` builds it from a record ``_valid`` passed; the schema,
    ``observe.beat.schema.json``, is generated from this class). A dataclass, not a pydantic
    model (and not frozen, whose __init__ costs a setattr call a field): the watch reads 10,752
    of them a scan, and the recorder imports no pydantic. Nothing changes one once read."""

    rank: int
    node: str | None = None
    recorder: int | None = None      # the recorder's pid
    pid: int | None = None           # the rank's (the recorder's child)
    step: int | None = None          # the highest step number seen
    steps: int = 0                   # steps completed
    restarts: int = 0                # times the step numbering started again
    progress: float | None = None    # epoch seconds of the last progress (this node's clock)
    first: float | None = None       # of the first step completed
    gap_s: float | None = None       # median seconds between two progresses
    recent_steps: list[int] = field(default_factory=list)
    recent_s: list[float] = field(default_factory=list)
    recent_wait: list[float] | None = None   # each recent step's seconds in collectives, when measured
    beat: float | None = None        # when the record was written (this node's clock)
    exit: int | None = None          # the rank's exit code, once it ended (128 + signal)
    signal: int | None = None        # the signal that ended it, when one did (not an exit(137) it chose)
    snapshot: int | None = None      # the last snapshot request the recorder answered
    cpu_wait_s: float | None = None  # seconds the rank's threads waited for a CPU, since it started (run delay)
    steal_s: float | None = None     # seconds stolen from the node's CPUs by its hypervisor, per CPU, since boot
    gpu_throttled_s: float | None = None  # seconds its GPUs' clocks were held back (power, heat), since it started
    gpu_throttle: int | None = None  # the slowdown reasons seen since it started (NVML's mask, hpcml.samplers.clockreasons)
    cpu_throttled_s: float | None = None  # seconds its cores ran throttled for heat, mean over them, since boot
    workers: int | None = None       # the rank's worker processes now (DataLoader workers), while it has any
    cores: float | None = None       # the cores the rank may run on (affinity, cgroup quota)
    workers_cpu_percent: float | None = None  # its workers' CPU use in the last sample, percent of one core
    gpu_uuids: list[str] | None = None  # the GPUs proven the rank's (those its clocks count), by NVML's UUID

    @classmethod
    def of(cls, doc: Mapping[str, Any]) -> Beat:
        """From a record ``_valid`` accepted (the envelope, ``schema`` and ``sig``, left out)."""
        return cls(**{k: v for k, v in doc.items() if v is not None and k in _FIELDS})


class _Fixed(TypedDict):
    """What opens every record of one writer."""

    schema: str
    rank: int
    node: str
    recorder: int


class _ProgressDoc(TypedDict):
    step: int | None
    steps: int
    restarts: int
    progress: float | None
    first: float | None
    gap_s: float | None
    recent_steps: list[int]
    recent_s: list[float]


class ProgressDoc(_ProgressDoc, total=False):
    """``Progress.to_json``: a record's progress fields, in the order written."""

    recent_wait: list[float]


class Progress:
    """What the rank's logged rows say about its progress (fed batch by batch)."""

    def __init__(self) -> None:
        self.step: int | None = None          # the highest step number seen
        self.steps = 0                        # how many times it went up (steps completed)
        self.progress: float | None = None    # epoch seconds of the last progress
        self.first: float | None = None       # of the first step completed
        self.recent: deque[tuple[int, float]] = deque(maxlen=RECENT)   # (step, seconds)
        self.waits: deque[tuple[int, float]] = deque(maxlen=RECENT)    # (step, seconds in collectives)
        self.gaps: deque[float] = deque(maxlen=RECENT)  # seconds between two progresses: what a hang waits past
        self.restarts = 0                     # times the step numbering started again
        self._timed = False                   # a "step" section exists: its durations are the step times
        self._at: float | None = None         # when ``step`` was first seen

    def update(self, ts: list[float], kinds: list[str], names: list[str], values: list[float | None],
               steps: list[int | None]) -> None:
        """Rows in the order logged: epoch seconds, kind, name, value, step (or None). A step
        number at most half the last one is a numbering that restarted (a per-epoch count):
        still progress, and the recent times start again so that they stay ascending
        (``restarts``); one a little behind is a late value (an evaluation of an earlier
        step), not progress."""
        for t, kind, name, value, step in zip(ts, kinds, names, values, steps):
            if kind not in ("metric", "section"):
                continue
            if name == WAIT_SECTION and kind == "section":    # of the step just recorded: no progress
                if value is not None and math.isfinite(value):
                    self.waits.append((int(step) if step is not None else self.steps, max(0.0, float(value))))
                continue
            late = step is not None and self.step is not None and self.step // 2 < int(step) < self.step
            if step is not None and not late and (self.step is None or int(step) != self.step):
                step = int(step)
                if self.step is not None and step < self.step:
                    self.recent.clear()
                    self.waits.clear()
                    self.restarts += 1
                elif self.step is not None and not self._timed and self._at is not None:
                    self.recent.append((step, (t - self._at) / (step - self.step)))
                self.steps += 1          # a step number is logged as its step ends (or later)
                if self.progress is not None and t > self.progress:
                    self.gaps.append(t - self.progress)
                self.step, self._at, self.progress = step, t, t
                self.first = self.first if self.first is not None else t
            if kind == "section":
                self.progress = t
                if name == STEP_SECTION and value is not None:
                    self._timed = True
                    key = int(step) if step is not None else self.steps
                    if not self.recent or key > self.recent[-1][0]:
                        self.recent.append((key, float(value)))

    def update_batch(self, batch: Any) -> None:
        """An Arrow batch of the store's schema (``hpcml.observe.schema``)."""
        from hpcml.observe.schema import from_batch
        cols = from_batch(batch)
        kinds = cols["kind"]
        keep = [i for i, k in enumerate(kinds) if k in ("metric", "section")]
        if not keep:
            return
        ts = [cols["ts"][i] for i in keep]
        self.update(ts, [kinds[i] for i in keep], [cols["name"][i] for i in keep],
                    [cols["value"][i] for i in keep], [cols["step"][i] for i in keep])

    def to_json(self) -> ProgressDoc:
        """``recent_wait``, beside ``recent_s`` and only when waits were measured: each recent
        step's seconds in collectives (0 for a step without one)."""
        gaps = sorted(self.gaps)
        doc: ProgressDoc = {"step": self.step, "steps": self.steps, "restarts": self.restarts, "progress": self.progress,
                            "first": self.first, "gap_s": round(gaps[len(gaps) // 2], 6) if gaps else None,
                            "recent_steps": [s for s, _ in self.recent],
                            "recent_s": [round(v, 6) for _, v in self.recent]}
        if self.waits:
            waits = dict(self.waits)
            doc["recent_wait"] = [round(waits.get(s, 0.0), 6) for s, _ in self.recent]
        return doc


class BeatWriter:
    """The recorder's side: one record, rewritten in place."""

    def __init__(self, observe: Path, rank: int, node: str) -> None:
        beat_dir(observe).mkdir(parents=True, exist_ok=True)
        self.path = beat_path(observe, rank)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        self.fixed: _Fixed = {"schema": SCHEMA, "rank": rank, "node": node, "recorder": os.getpid()}
        self.key = _key

    def write(self, progress: Progress, now: float | None = None, **extra: float | int | list[str] | None) -> None:
        """``extra``: the record's ``pid``, ``snapshot``, ``exit``, ``cpu_wait_s``, ``steal_s``,
        ``gpu_throttled_s``, ``gpu_throttle``, ``cpu_throttled_s``, ``workers``, ``cores``, ``workers_cpu_percent``,
        ``gpu_uuids``, each written only when given.
        ``beat`` is this node's clock, like ``progress``: the launcher judges a rank's idle
        time as their difference, which clock skew between nodes does not touch."""
        body, beat = progress.to_json(), time.time() if now is None else now
        room = SIZE - (SIG_BYTES if self.key is not None else 0)

        def encode() -> bytes:
            return json.dumps({**self.fixed, **body, **extra, "beat": beat}, separators=(",", ":")).encode()

        data = encode()
        if len(data) > room and extra.get("gpu_uuids"):      # the steps first: the straggler model's
            extra = {**extra, "gpu_uuids": None}
            data = encode()
        while len(data) > room and body["recent_steps"]:      # never past the record: drop the oldest
            half = len(body["recent_steps"]) // 2
            body["recent_steps"], body["recent_s"] = body["recent_steps"][half:], body["recent_s"][half:]
            if "recent_wait" in body:
                body["recent_wait"] = body["recent_wait"][half:]
            data = encode()
        if self.key is not None:
            data = data[:-1] + SIG + _signature(self.key, data) + b'"}'
        try:
            os.pwrite(self.fd, data.ljust(SIZE), 0)
        except OSError:
            pass                          # a full disk must not stop the recorder; the watch sees no beat

    def close(self) -> None:
        os.close(self.fd)


class Trust:
    """Which records the launcher takes: those of a rank below ``world`` (the ranks it
    started), signed with that rank's key when it has the attempt's ``secret``, and not
    older (``beat``) than the rank's record it took last (an old copy put back). ``refused``:
    each record refused, by (rank, why), with its file: the watch says each once."""

    def __init__(self, world: int, secret: bytes | None = None) -> None:
        self.world, self.secret = world, secret
        self.refused: dict[tuple[int, str], str] = {}
        self._keys: dict[int, bytes] = {}

    def why_not(self, doc: dict, raw: bytes) -> str | None:
        """None when ``doc`` (read as ``raw``) is its rank's; else why it is not."""
        rank = doc["rank"]
        if rank >= self.world:
            return "not a rank of this attempt"
        if self.secret is None:
            return None
        key = self._keys.get(rank)
        if key is None:
            key = self._keys[rank] = rank_key(self.secret, rank)
        data = raw.rstrip()
        cut = data.rfind(SIG)
        if cut < 0 or len(data) - cut != SIG_BYTES or not data.endswith(b'"}'):
            return "not signed by the rank's recorder"
        if not hmac.compare_digest(data[cut + len(SIG):-2], _signature(key, data[:cut] + b"}")):
            return "not signed by the rank's recorder"
        return None


def read_beats(observe: Path, previous: dict[int, Beat] | None = None, trust: Trust | None = None) -> dict[int, Beat]:
    """Every rank's last record; a torn or unreadable one keeps ``previous``'s, and so does
    one ``trust`` refuses. orjson, not json: at 1,024 ranks the parse is most of a scan
    (about 8x less time)."""
    out = dict(previous or {})
    try:
        entries = list(os.scandir(beat_dir(observe)))
    except OSError:
        return out
    for entry in entries:
        name = entry.name
        if not (name.startswith("rank-") and name.endswith(".json")):
            continue
        try:
            doc, raw = load_json_bounded(entry.path, SIZE, loads=_parsed)    # a record is SIZE bytes
        except (OSError, ValueError):
            continue
        if not _valid(doc):
            continue
        if trust is not None:
            why = trust.why_not(doc, raw)
            if why is not None:
                trust.refused.setdefault((doc["rank"], why), name)
                continue
            last = out.get(doc["rank"])
            if last is not None and last.beat is not None and _number(doc.get("beat")) \
                    and doc["beat"] < last.beat:
                continue
        out[doc["rank"]] = Beat.of(doc)
    return out


_FIELDS = frozenset(Beat.__dataclass_fields__)


def _parsed(data: bytes) -> tuple[object, bytes]:
    """The record and its bytes: the signature is over the bytes as written."""
    import orjson
    return orjson.loads(data), data


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


_INT, _NUMBERS = {int}, {int, float}          # exact types: bool is not a number here


def _finite(xs: list) -> bool:
    """Numbers, all finite. Here and for the steps, whole-list passes in C (``map``, ``set``):
    at 10,752 ranks the per-element generators were half of a scan's CPU (bench_watch.py
    --alps: 0.5-0.65 s, now 0.14 s)."""
    return set(map(type, xs)) <= _NUMBERS and all(map(math.isfinite, xs))


def _valid(doc: object) -> bool:
    """A record of the right shape: anything in the job directory may have been written by
    the user's program, and the launcher must not fall over on it (a record that is not
    valid keeps the rank's previous one)."""
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        return False
    if not isinstance(doc.get("rank"), int) or isinstance(doc["rank"], bool) or doc["rank"] < 0:
        return False
    for key in ("step", "steps", "restarts", "exit", "signal", "snapshot", "pid", "recorder", "gpu_throttle", "workers"):
        if doc.get(key) is not None and (not isinstance(doc[key], int) or isinstance(doc[key], bool)):
            return False
    if doc.get("gpu_throttle") is not None and not 0 <= doc["gpu_throttle"] < MASK_MAX:
        return False
    for key in ("progress", "first", "beat", "gap_s", "cpu_wait_s", "steal_s", "gpu_throttled_s", "cpu_throttled_s", "cores",
                "workers_cpu_percent"):
        if doc.get(key) is not None and not (_number(doc[key]) and math.isfinite(doc[key])):
            return False
    for key in ("cpu_wait_s", "steal_s", "gpu_throttled_s", "cpu_throttled_s", "workers", "cores",
                "workers_cpu_percent"):
        # cumulative seconds, counts, cores, percent: never negative, never past LIMIT
        if doc.get(key) is not None and not 0 <= doc[key] < LIMIT:
            return False
    for key in ("rank", "step", "steps", "restarts", "exit", "signal", "snapshot", "pid", "recorder"):
        if isinstance(doc.get(key), int) and not -LIMIT < doc[key] < LIMIT:
            return False
    steps, times = doc.get("recent_steps", []), doc.get("recent_s", [])
    if not isinstance(steps, list) or not isinstance(times, list) or len(steps) != len(times):
        return False
    if steps and not (set(map(type, steps)) <= _INT and all(map(operator.lt, steps, islice(steps, 1, None)))
                      and 0 <= steps[0] and steps[-1] < LIMIT):
        return False                                   # ascending, as the recorder writes them
    if not _finite(times):
        return False
    waits = doc.get("recent_wait")
    if waits is not None and (not isinstance(waits, list) or len(waits) != len(steps) or not _finite(waits)
                              or (waits and min(waits) < 0)):
        return False
    if doc.get("sig") is not None and not isinstance(doc["sig"], str):
        return False
    uuids = doc.get("gpu_uuids")
    if uuids is not None and not (isinstance(uuids, list) and len(uuids) <= MAX_GPUS and set(map(type, uuids)) <= {str}
                                  and all(map(GPU_UUID.fullmatch, uuids))):
        return False                          # printed in the watch's lines: NVML's own names only
    return doc.get("node") is None or isinstance(doc["node"], str)
