"""``hpcml run --vet PROTOCOL``'s vetting workers, started before the launcher imports itself.

A vetting worker's start on each node (srun's step, the interpreter, the checks' imports)
takes about as long as the launcher's own start-up (pydantic and the job model, the job
directory). Started first, from ``hpcml.run.fastrun``, the two overlap: the workers wait on
stdin for the spec the launcher sends once it has validated the protocol
(``hpcml.vet.launch.Step``), and a run that ends up not vetting closes their stdin, on which
they exit having run nothing. Only where the launcher would start them anyway: in a Slurm
allocation, outside its steps and outside a farm task, with a protocol file named (not
``--vet auto``, which may choose no checks). Where the protocol has only hpcml's own node
checks, their spec is sent at once too: the checks then run while the launcher starts.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpcml.run.config import Options
    from hpcml.vet.launch import Step


#: hpcml's own checks, which use no shared directory (``hpcml.vet.checks``; the collective,
#: which does, spans the allocation and is never in the node phase)
BUILTIN = "hpcml.vet.checks."


@dataclass
class Early:
    """Workers started on ``nodes``, and what starting them cost the launcher."""

    step: Step
    nodes: tuple[str, ...]
    start: float
    wall_s: float
    cpu_s: float


def start(opts: Options) -> Early | None:
    """The workers on every node of the allocation, started now; None where the launcher
    would not vet through srun (or the early start failed: it will start them itself)."""
    if opts.vet is None or str(opts.vet) == "auto" or str(opts.vet).startswith("auto:"):
        return None
    if os.environ.get("HPCML_RUN_BACKEND", "").strip() or os.environ.get("HPCML_RUN_LOCAL"):
        return None
    from hpcml.cluster.allocation import current
    from hpcml.cluster.taskenv import current as farm_task
    allocation = current()
    if not allocation.job_id or allocation.step_id is not None or farm_task() is not None:
        return None
    if not os.path.isfile(opts.vet):
        return None                                  # bad input: the launcher says so, in one line
    from hpcml.vet import launch
    t, cpu, t0 = time.time(), time.process_time(), time.perf_counter()
    try:
        step = launch.start_workers(list(allocation.nodes), preload=launch.preload_hint(opts.vet))
    except OSError:                                  # no srun here: the launcher finds out and says so
        return None
    try:
        _tell(step, opts.vet, opts.job_dir, allocation)
    except BaseException:                            # Ctrl-C, or a bug: no workers left behind
        step.cancel()
        raise
    return Early(step, allocation.nodes, t, time.perf_counter() - t0, time.process_time() - cpu)


def _tell(step: Step, protocol: Path, job_dir: Path | None, allocation: Any) -> None:
    """Send the workers their spec now, while the launcher imports itself, where nothing in it
    depends on the launcher: every node check is one of hpcml's own, none of which uses the
    run's directory (a site's check may, and that directory is made by the launcher). A
    protocol that does not validate is left to the launcher, which says why in one line."""
    from hpcml.errors import UsageError
    from hpcml.vet.launch import spec
    from hpcml.vet.protocol import load
    try:
        proto = load(protocol)
        proto.unset_variables()
    except UsageError:
        return
    evals = [e for e in proto.evals if e.scope == "node"]
    if not evals or not all(e.check.startswith(BUILTIN) for e in evals):
        return
    d = Path(job_dir) if job_dir else Path(f"hpcml-run-{allocation.job_id}")
    step.protocol = proto
    step.send(spec(proto, evals, list(allocation.nodes), time.time() + proto.deadline, str(d / "vet" / "work")))
