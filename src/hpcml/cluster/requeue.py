"""How an attempt of ``hpcml run`` learns that it ended in a requeue, not a crash.

``scontrol requeue`` makes Slurm end the job (TERM, then SIGKILL after ``KillWait``) and run
it again under the same job id with ``SLURM_RESTART_COUNT`` one higher. Seen from the
launcher alone, the ranks that were still shutting down die with exit 143 and look like a
failure. Two sources tell it apart:

- hpcml issued it: the Checkpointer's rank 0 calls ``note()`` after its final checkpoint
  committed and before it runs ``scontrol requeue``; ``note()`` writes ``requeued.json``
  (``hpcml.run.requeue/1``: step, signal, checkpoint directory) into the attempt's
  directory, which the task wrapper names in ``HPCML_RUN_DIR``.
- anyone else (an operator, a node failure with ``--requeue``): Slurm's restart count of
  the job (``scontrol show job``'s ``Restarts``) is above the attempt's own.

The launcher asks at its end; the next attempt asks again, because ``KillWait`` (2 s on the
test cluster) may kill the launcher before it writes its end.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from hpcml.cluster.ranks import restart_count
from hpcml.files import load_json_bounded, write_atomic
from hpcml.schemas import tag

SCHEMA = tag("run.requeue", 1)            # the tag of hpcml run's requeued.json (the module moved, the format did not)
MARKER = "requeued.json"
ENV_DIR = "HPCML_RUN_DIR"            # the attempt's directory, set by the task wrapper
ENV_ATTEMPT = "HPCML_RUN_ATTEMPT"
#: the exit codes of ranks that the requeue itself ended (Slurm's TERM, then its SIGKILL)
KILLED_BY_REQUEUE = (128 + 15, 128 + 9)


def note(step: int | None, signal: str | None, checkpoint: str | os.PathLike) -> Path | None:
    """Record, before ``scontrol requeue``, that this attempt checkpointed ``step`` and asks
    to be requeued. Nothing outside ``hpcml run`` (no ``HPCML_RUN_DIR``). Returns the
    marker, for ``withdraw`` when the requeue command fails."""
    where = os.environ.get(ENV_DIR)
    if not where:
        return None
    path = Path(where) / MARKER
    doc = {"schema": SCHEMA, "by": "hpcml ckpt", "step": step, "signal": signal, "checkpoint": str(checkpoint),
           "job_id": os.environ.get("SLURM_JOB_ID"), "restart_count": restart_count(),
           "attempt": _int(os.environ.get(ENV_ATTEMPT)), "time": time.time(), "host": socket.gethostname()}
    try:
        write_atomic(path, json.dumps(doc, indent=2) + "\n")
    except OSError:
        return None                      # the requeue matters more than its note
    return path


def withdraw(path: Path | None) -> None:
    if path is not None:
        path.unlink(missing_ok=True)


def _int(v: Any) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return 0


def find(attempt_dir: Path, job_id: str | None, restart: int, ask_slurm: bool) -> dict[str, Any] | None:
    """Whether the attempt in ``attempt_dir`` (Slurm restart count ``restart``) was requeued:
    its marker, else Slurm's restart count above ``restart`` (asked only with ``ask_slurm``:
    one ``scontrol`` call). None: not requeued, or Slurm cannot tell."""
    try:
        doc = load_json_bounded(attempt_dir / MARKER, 1 << 16)
    except (OSError, ValueError):
        doc = None
    if isinstance(doc, dict) and doc.get("schema") == SCHEMA and str(doc.get("job_id")) == str(job_id) \
            and _int(doc.get("restart_count")) == restart:
        return {k: doc.get(k) for k in ("by", "step", "signal", "checkpoint", "time")}
    if not (ask_slurm and job_id):
        return None
    now = restarts(job_id)
    return {"by": "slurm", "restart_count": now} if now is not None and now > restart else None


def restarts(job_id: str) -> int | None:
    """Slurm's restart count of a job (``Restarts=`` of ``scontrol show job``); None when
    Slurm cannot be asked."""
    from hpcml.cluster import slurm
    from hpcml.errors import SlurmError
    try:
        recs = slurm.scontrol_show("job", str(job_id))
    except SlurmError:
        return None
    return _int(recs[0].get("Restarts")) if recs else None


def describe(requeued: dict[str, Any]) -> str:
    """``checkpointed at step 70 and requeued (SIGUSR1)``, in the report and the log."""
    if requeued.get("by") == "slurm":
        return f"requeued by Slurm (restart count now {requeued.get('restart_count')})"
    why = f" ({requeued['signal']})" if requeued.get("signal") else ""
    return f"checkpointed at step {requeued.get('step')} and requeued{why}"


RESUMED = "resumed.json"


def note_resumed(step: int | None, checkpoint: str | os.PathLike) -> None:
    """Record in the attempt's directory that this attempt resumed from ``step``
    (``Checkpointer.load_latest`` on rank 0): the run's record says how many steps a restart
    lost. Nothing outside ``hpcml run``."""
    _note(RESUMED, "run.resumed", step=step, checkpoint=str(checkpoint))


def _note(name: str, schema: str, **fields: Any) -> None:
    """Write ``fields`` as note ``name`` in the attempt's directory (``HPCML_RUN_DIR``), with
    its schema tag, the attempt and the time; nothing outside ``hpcml run``, and a write that
    fails is dropped (the training matters more than its note)."""
    where = os.environ.get(ENV_DIR)
    if not where:
        return
    doc = {"schema": tag(schema, 1), **fields, "attempt": _int(os.environ.get(ENV_ATTEMPT)), "time": time.time()}
    try:
        write_atomic(Path(where) / name, json.dumps(doc) + "\n")
    except OSError:
        pass


def _read_note(attempt_dir: Path, name: str, schema: str) -> dict[str, Any] | None:
    """Note ``name`` of ``attempt_dir`` if it is one (bounded, its schema tag), else None:
    the attempt's directory is the job's own program's to write in too."""
    try:
        doc = load_json_bounded(attempt_dir / name, 1 << 16)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("schema") == tag(schema, 1) else None


PRINTED = "printed-step.json"


def note_printed(step: int, steps_done: int) -> None:
    """Record in the attempt's directory the first step rank 0 printed (``--step-pattern``,
    ``hpcml.observe.printedsteps``) and the optimizer steps it had done by then. Nothing
    outside ``hpcml run``."""
    _note(PRINTED, "run.printed_step", step=step, steps_done=steps_done)


def printed_origin(attempt_dir: Path) -> int | None:
    """The attempt's origin in the script's own step numbering: the first step rank 0
    printed less the optimizer steps it had done by then (``note_printed``), or None."""
    doc = _read_note(attempt_dir, PRINTED, "run.printed_step")
    if doc is None:
        return None
    step, done = doc.get("step"), doc.get("steps_done")
    if type(step) is not int or type(done) is not int or not (0 <= step < 1 << 62 and 0 <= done < 1 << 62):
        return None
    return step - done


def resumed(attempt_dir: Path) -> dict[str, Any] | None:
    """What ``note_resumed`` wrote there (step, checkpoint, time), if anything."""
    doc = _read_note(attempt_dir, RESUMED, "run.resumed")
    if doc is None:
        return None
    step = doc.get("step")
    return {"step": step if isinstance(step, int) and not isinstance(step, bool) else None,
            "checkpoint": str(doc.get("checkpoint")), "time": doc.get("time")}
