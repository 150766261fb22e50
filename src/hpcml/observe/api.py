"""``observe.log`` and ``observe.section``: cheap in the training loop, never in its way.

A call appends tuples to an in-memory list (an atomic operation under the GIL) and
returns; a daemon thread turns the list into an Arrow batch every flush interval and
writes it: to the recorder's pipe when ``hpcml observe record`` started this process
(``HPCML_OBSERVE_FD``), else to this rank's own file in the job directory. Any error is
counted (``problems()``) and reported in the store, never raised into the caller.

A program logs its own steps once it gives ``log`` or ``section`` a step number or records
a section named ``step``; until then ``hpcml run``'s optimizer hooks
(``hpcml.observe.optimsteps``) record each optimizer step here as that section would, and
from then on they record nothing, so that no step is counted twice.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from typing import Any

STEP = "step"                   # the section whose times are step times (hpcml.observe.beat, the report)
WAIT = "collective_wait"        # of each step, the seconds the rank waited in collectives (observe.collectives)
CHECKPOINT = "checkpoint"       # time a save blocked the training loop (hpcml.ckpt, the script's torch.save): the ledger's
FLUSH_SECONDS = float(os.environ.get("HPCML_OBSERVE_FLUSH", "1.0") or 1.0)
MAX_BUFFERED = 2_000_000        # rows kept while the writer is stuck; newer rows are dropped

_buf: list[tuple] = []
_lock = threading.Lock()
_state: dict[str, Any] = {"thread": None, "writer": None, "step": None, "errors": 0,
                          "dropped": 0, "write_errors": 0, "reported": (0, 0, 0), "own": False,
                          "waits": None}
_time_ns = time.time_ns
_perf_ns = time.perf_counter_ns


def rank_from_env(env=os.environ) -> int:
    """This rank's number, in hpcml.cluster.ranks's one order (torch.distributed first)."""
    from hpcml.cluster.ranks import ranks
    return ranks(env).rank


def log(step: int | None = None, **metrics: float) -> None:
    """Record ``metrics`` (numbers) at ``step``; a few microseconds, never raises."""
    try:
        ts = _time_ns()
        if step is not None:
            _state["step"] = step
            _state["own"] = True
        append = _buf.append
        for name, value in metrics.items():
            append((ts, "metric", name, float(value), step, None))
        if _state["thread"] is None:
            _start()
    except Exception:  # noqa: BLE001 - the training loop must never see our errors
        _state["errors"] += 1


class section:
    """``with observe.section("dataload", step=i):`` records the block's wall time (s).

    Without ``step`` the section is labelled with the last step given to ``log``.
    """

    __slots__ = ("name", "t0", "step")

    def __init__(self, name: str, step: int | None = None) -> None:
        self.name = name
        self.step = step

    def __enter__(self) -> section:
        self.t0 = _perf_ns()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            t1 = _perf_ns()
            if self.step is not None or self.name == STEP:
                _state["own"] = True
            step = _state["step"] if self.step is None else self.step
            end = _time_ns()
            _buf.append((end, "section", self.name, (t1 - self.t0) / 1e9, step, None))
            if self.name == STEP:
                _wait_row(end - (t1 - self.t0), end, step)
            if _state["thread"] is None:
                _start()
        except Exception:  # noqa: BLE001
            _state["errors"] += 1


def under_run() -> bool:
    """Whether ``hpcml run``'s recorder takes this process's rows (it set the pipe): parts
    of hpcml that record on their own (the Checkpointer's blocking) do so only then, never
    starting a store of their own in a program that did not ask for one."""
    return bool(os.environ.get("HPCML_OBSERVE_FD"))


def blocked(name: str, seconds: float) -> None:
    """A section of ``seconds`` that ended now (measured by the caller); never raises."""
    try:
        _buf.append((_time_ns(), "section", name, seconds, _state["step"], None))
        if _state["thread"] is None:
            _start()
    except Exception:  # noqa: BLE001
        _state["errors"] += 1


def own_steps() -> bool:
    """Whether the program logs its own steps (a step number given, or a ``step`` section)."""
    return _state["own"]


def optimizer_step(step: int, seconds: float, end_ns: int) -> bool:
    """One optimizer step seen by ``hpcml.observe.optimsteps``, recorded as
    ``section("step", step=step)`` around it would be (``end_ns``: epoch ns of its end).
    Nothing, and False, once the program logs its own steps; later sections without a step
    number are labelled with this one."""
    try:
        if _state["own"]:
            return False
        _state["step"] = step
        _buf.append((end_ns, "section", STEP, seconds, step, None))
        _wait_row(end_ns - int(seconds * 1e9), end_ns, step)
        if _state["thread"] is None:
            _start()
        return True
    except Exception:  # noqa: BLE001 - inside optimizer.step(): never raise
        _state["errors"] += 1
        return False


def waits_from(take: Any) -> None:
    """``take(since_ns, until_ns)``: the seconds this rank waited in collectives between two
    epoch times (``hpcml.observe.collectives``); each step is then followed by a ``WAIT``
    section of its own waits, which the straggler model subtracts from the step's time."""
    _state["waits"] = take


def _wait_row(start_ns: int, end_ns: int, step: int | None) -> None:
    """After a step's row, its waits in collectives (when something measures them)."""
    if _state["waits"] is not None:
        _buf.append((end_ns, "section", WAIT, _state["waits"](start_ns, end_ns), step, None))


def start() -> None:
    """The writer thread, and with it the exit handler that writes what is left."""
    if _state["thread"] is None:
        _start()


def problems() -> dict[str, int]:
    """What went wrong so far: call errors, rows dropped, failed writes."""
    return {"errors": _state["errors"], "dropped": _state["dropped"],
            "write_errors": _state["write_errors"]}


def _open_writer():
    from hpcml.observe.store import RankWriter
    rank = rank_from_env()
    fd = os.environ.get("HPCML_OBSERVE_FD", "")
    if fd.isdigit():
        return RankWriter(os.fdopen(int(fd), "wb", buffering=0), rank)
    job_dir = os.environ.get("HPCML_OBSERVE_DIR") or \
        f"hpcml-observe-{os.environ.get('SLURM_JOB_ID', 'local')}"
    os.makedirs(job_dir, exist_ok=True)
    return RankWriter.create(job_dir, rank)


def _take() -> list[tuple]:
    n = len(_buf)
    rows = _buf[:n]
    del _buf[:n]
    counts = (_state["errors"], _state["dropped"], _state["write_errors"])
    if counts != _state["reported"]:
        _state["reported"] = counts
        ts = _time_ns()
        rows += [(ts, "problem", name, float(v), None, None)
                 for name, v in zip(("api_errors", "rows_dropped", "write_errors"), counts)]
    return rows


def flush() -> None:
    """Write what is buffered now (the background thread does this every interval)."""
    with _lock:
        rows = _take()
        if not rows:
            return
        try:
            if _state["writer"] is None:
                _state["writer"] = _open_writer()
            _state["writer"].write_rows(rows)
        except Exception:  # noqa: BLE001 - a full disk or a dead recorder: count, keep going
            _state["write_errors"] += 1
            if len(_buf) > MAX_BUFFERED:
                _state["dropped"] += len(_buf) - MAX_BUFFERED
                del _buf[:len(_buf) - MAX_BUFFERED]


def _loop() -> None:
    # The writer (pyarrow's import, a second or more on a loaded machine) is opened before
    # the first interval, not by the first flush: a rank killed soon after its last step
    # loses at most one interval of rows, never its first ones to the import.
    with _lock:
        if _state["writer"] is None:
            try:
                _state["writer"] = _open_writer()
            except Exception:  # noqa: BLE001 - flush() tries again and counts the failure
                pass
    while True:
        time.sleep(FLUSH_SECONDS)
        flush()


def _close() -> None:
    flush()
    writer = _state["writer"]
    if writer is not None:
        try:
            writer.close()
        except Exception:  # noqa: BLE001
            pass


def _start() -> None:
    # The first batch is converted by the exit handler when the program ends within a flush
    # interval, and pyarrow's first conversion imports pandas where it is installed; pandas
    # (3.x) and pyarrow.pandas_compat import concurrent.futures.thread, whose import
    # registers a threading exit hook and raises at interpreter shutdown: every row was
    # lost. Imported now (a few ms, once), it is already there at exit.
    import concurrent.futures.thread  # noqa: F401
    with _lock:
        if _state["thread"] is not None:
            return
        t = threading.Thread(target=_loop, name="hpcml-observe-writer", daemon=True)
        _state["thread"] = t
        t.start()
        atexit.register(_close)
