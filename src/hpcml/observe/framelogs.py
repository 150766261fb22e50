"""The last values a training script logged through its framework's own logger, read where
the framework writes them, so that ``hpcml farm results`` shows a sweep's losses without a
change to the script:

* **HF Trainer**: ``trainer_state.json`` (``Trainer._save_checkpoint`` writes one into each
  ``checkpoint-N/``, ``save_state()`` into ``output_dir``): its ``log_history``, a list of
  the dicts ``Trainer.log`` received (``loss``, ``grad_norm``, ``learning_rate``,
  ``epoch``, ``eval_*``, the final ``train_loss``). The one with the highest
  ``global_step`` is read.
* **Lightning's CSVLogger** (its default logger where tensorboard is not installed):
  ``<save_dir>/<name>/version_N/metrics.csv``, one row per ``log_dict`` flush, each row
  holding only the columns logged at that step. The newest version is read.
* **A JSON-lines file** the sweep names (``metrics_file:``): one object per line, the last
  value of each numeric key.

TensorBoard event files are not read: their records are protobuf messages, and the one
well-kept reader (the ``tensorboard`` package) is not a dependency of hpcml.

Each file is someone else's program's output, read as hostile: found under the task's
directory only (``os.walk`` never follows a link out of it, a found file is not read through
a link), within a depth, a count of directories and a byte budget (a log's first and last
bytes, ``hpcml.files.read_ends``), values kept only when numbers. A last value of NaN or
an infinity is said as such (``Logged.non_finite``), never replaced by the one before.
"""

from __future__ import annotations

import csv
import heapq
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from hpcml import logs
from hpcml.files import inside, load_json_bounded, read_ends

log = logs.get(__name__)

HF_STATE = "trainer_state.json"
LIGHTNING_CSV = "metrics.csv"
MAX_DEPTH = 5                     # directories below the task's own where logs are looked for
MAX_DIRS = 2000                   # directories looked at, at most (a dataset unpacked in the task dir)
STATE_MAX = 64 << 20              # a trainer_state.json of a long run (log_history) fits
HEAD, TAIL = 64 << 10, 4 << 20    # a log's header and its latest rows
#: HF's bookkeeping in log_history, not a training metric (its speed is hpcml's own measure)
HF_SKIP = re.compile(r"^(step|total_flos|.*_runtime|.*_samples_per_second|.*_steps_per_second)$")
_VERSION = re.compile(r"^version_(\d+)$")
#: directories where frameworks write their logs (HF's output_dir and checkpoint-N, Lightning's
#: lightning_logs/version_N), looked at first at each depth
LIKELY = re.compile(r"^(out|output|outputs|results|runs|logs|lightning_logs|checkpoints?|checkpoint-\d+|version_\d+)"
                    r"([-_].*)?$")
SKIP_DIRS = ("__pycache__", "wandb", "node_modules")
STATES_READ = 3                   # trainer_state.json files parsed at most: the newest few


@dataclass(frozen=True)
class Logged:
    """What one framework log said last: each metric's last value, the last step it names
    (None where it names none), and where it was read (relative to the task's directory). A
    metric whose last value was NaN or infinite (a loss that diverged) is in ``non_finite``,
    not ``values``: never an older finite value in its place."""

    kind: str                     # "hf_trainer" | "lightning_csv" | "jsonl"
    source: str
    values: dict[str, float]
    step: int | None = None
    non_finite: dict[str, str] = field(default_factory=dict)     # metric -> "nan", "inf" or "-inf"

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind, "source": self.source, "values": self.values, "step": self.step,
                **({"non_finite": self.non_finite} if self.non_finite else {})}


def _put(values: dict[str, float], non_finite: dict[str, str], name: str, f: float) -> None:
    """``name``'s value is now ``f``: the last one logged wins, a number or not."""
    if math.isfinite(f):
        values[name] = f
        non_finite.pop(name, None)
    else:
        values.pop(name, None)
        non_finite[name] = "nan" if math.isnan(f) else ("inf" if f > 0 else "-inf")


def read_task_logs(task_dir: str | os.PathLike, metrics_file: str | None = None) -> list[Logged]:
    """The framework logs found in one task's directory (and ``metrics_file``, relative to
    it), each read once; [] where there are none or the directory is missing."""
    root = Path(task_dir)
    if root.is_symlink() or not root.is_dir():        # the task's directory itself a link: not the task's
        return []
    states, csvs = _find(root)
    out = []
    state = _latest_state(root, states)
    if state is not None:
        out.append(state)
    if csvs:
        newest = max(csvs, key=_version_order)
        got = _csv(root, newest)
        if got is not None:
            out.append(got)
    if metrics_file:
        got = _jsonl(root, metrics_file)
        if got is not None:
            out.append(got)
    return out


def _find(root: Path) -> tuple[list[Path], list[Path]]:
    """The framework logs under ``root``, breadth first, the directories frameworks write
    (``LIKELY``) before the others of their depth: a task directory holding a dataset of
    thousands of folders spends the budget after the logs, not before."""
    states: list[Path] = []
    csvs: list[Path] = []
    queue: list[tuple[int, int, str, Path]] = [(0, 0, "", root)]
    seen = 0
    while queue:
        depth, _, _, path = heapq.heappop(queue)
        seen += 1
        if seen > MAX_DIRS:
            log.info("%s: more than %d directories, the rest not looked at for framework logs", root, MAX_DIRS)
            break
        try:
            with os.scandir(path) as it:
                entries = list(it)
        except OSError:
            continue
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):      # a link to a directory is not walked
                    if depth + 1 < MAX_DEPTH and not e.name.startswith(".") and e.name not in SKIP_DIRS:
                        heapq.heappush(queue, (depth + 1, 0 if LIKELY.match(e.name) else 1, e.name, Path(e.path)))
                elif e.name == HF_STATE:
                    states.append(Path(e.path))
                elif e.name == LIGHTNING_CSV and _VERSION.match(path.name):
                    csvs.append(Path(e.path))
            except OSError:
                continue
    return states, csvs


def _rel(root: Path, path: Path) -> str:
    return str(path.relative_to(root))


def _number(v: object) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:                                 # an integer of thousands of digits
        return None
    return f                                              # NaN and infinities too: a value logged


def _latest_state(root: Path, paths: list[Path]) -> Logged | None:
    """The ``trainer_state.json`` furthest along (``global_step``; the newest on a tie)."""
    best: tuple[tuple[float, float], Logged] | None = None
    for mtime, path in sorted(((_mtime(p), p) for p in paths), reverse=True)[:STATES_READ]:
        try:
            doc = load_json_bounded(path, STATE_MAX, follow_symlinks=False)
        except (OSError, ValueError) as exc:
            log.info("%s: not read: %s", path, exc)
            continue
        if not isinstance(doc, dict) or not isinstance(doc.get("log_history"), list):
            continue
        values: dict[str, float] = {}
        odd: dict[str, str] = {}
        for entry in doc["log_history"]:
            if isinstance(entry, dict):
                for k, v in entry.items():
                    f = _number(v)
                    if f is not None and isinstance(k, str) and not HF_SKIP.match(k):
                        _put(values, odd, k, f)
        step = doc.get("global_step")
        step = step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else None
        got = Logged("hf_trainer", _rel(root, path), values, step, odd)
        key = (float(step if step is not None else -1), mtime)
        if best is None or key > best[0]:
            best = (key, got)
    return best[1] if best is not None else None


def _mtime(path: Path) -> float:
    try:
        return os.lstat(path).st_mtime
    except OSError:
        return 0.0


def _version_order(path: Path) -> tuple[float, int]:
    m = _VERSION.match(path.parent.name)
    return (_mtime(path), int(m[1]) if m else -1)


def _lines(path: Path) -> tuple[str, list[str]] | None:
    """(the header line, the latest complete lines): a file cut in the middle of a row (the
    logger writing now) loses that row, never a value."""
    try:
        head, tail, whole = read_ends(path, HEAD, TAIL)
    except (OSError, ValueError) as exc:
        log.info("%s: not read: %s", path, exc)
        return None
    text = tail.decode("utf-8-sig" if whole else "utf-8", "replace")
    lines = text.split("\n")
    if not text.endswith("\n"):
        lines = lines[:-1]                                # the row being written
    if whole:
        header = lines[0] if lines else ""
        rows = lines[1:]
    else:
        header = head.decode("utf-8-sig", "replace").split("\n", 1)[0]
        rows = lines[1:]                                  # the first is cut at the tail's start
    return header, [r for r in rows if r.strip()]


def _csv(root: Path, path: Path) -> Logged | None:
    got = _lines(path)
    if got is None:
        return None
    header, rows = got
    if not header:
        return None
    values: dict[str, float] = {}
    odd: dict[str, str] = {}
    step: int | None = None
    try:
        names = next(csv.reader([header]), [])
        parsed = [next(csv.reader([r]), []) for r in rows]   # row by row: a stray quote spoils its row only
    except csv.Error as exc:                            # a field over csv's limit, a NUL: not Lightning's
        log.info("%s: not read: %s", path, exc)
        return None
    for row in parsed:
        for name, cell in zip(names, row):
            try:
                f = float(cell) if cell.strip() else None
            except ValueError:
                f = None
            if f is None:
                continue
            if name == "step":
                step = int(f) if math.isfinite(f) and f.is_integer() and f >= 0 else step
            else:
                _put(values, odd, name, f)
    return Logged("lightning_csv", _rel(root, path), values, step, odd)


def _jsonl(root: Path, name: str) -> Logged | None:
    try:
        path = inside(root, name)                         # symlinks followed: it must stay in the task's directory
        if not path.is_file():
            return None
        _, tail, whole = read_ends(path, 0, TAIL)
    except (OSError, ValueError, RuntimeError) as exc:    # RuntimeError: a symlink loop (Path.resolve)
        log.info("%s: %s: not read: %s", root, name, exc)
        return None
    values: dict[str, float] = {}
    odd: dict[str, str] = {}
    step: int | None = None
    lines = tail.split(b"\n")
    if not whole:
        lines = lines[1:]                                 # cut at the tail's start
    for line in lines:
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except (ValueError, RecursionError):
            continue                                      # a line being written, or not JSON
        if not isinstance(doc, dict):
            continue
        for k, v in doc.items():
            f = _number(v)
            if f is None:
                continue
            if k == "step":
                step = int(f) if math.isfinite(f) and f.is_integer() and f >= 0 else step
            else:
                _put(values, odd, k, f)
    return Logged("jsonl", name, values, step, odd)
