"""``hpcml score selftest``: does the score rank and classify two known workloads correctly?

For an operator on a GPU node: the development machines have no GPU, so this is the check
that the real sampler path (DCGM through a host engine, or NVML GPM without one) does what
the model assumes. The compute-bound workload must come out compute-bound, the
memory-bound one memory-bound, and each must beat the other on its own part by a margin.
The verdict names the sampler it verified.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from hpcml.errors import UsageError

MIN_PART = 0.3       # the bounding part must reach at least this on a workload built to saturate it
MARGIN = 0.15        # and beat the other workload's value of that part by at least this
FAILED = 4


def judge(compute: dict[str, Any], memory: dict[str, Any]) -> list[str]:
    """What the score got wrong about the two reports (empty: it got them right)."""
    wrong = []
    for name, rep, part in (("compute-bound", compute, "compute"), ("memory-bound", memory, "memory")):
        if rep["temporal_only"]:
            wrong.append(f"{name}: only NVML utilisation was recorded, no saturation fields")
            continue
        got = rep["breakdown"].get(part)
        if rep["bound"] != part:
            wrong.append(f"{name}: classified {rep['bound']}-bound, expected {part}-bound")
        if got is None or got < MIN_PART:
            wrong.append(f"{name}: {part} part {got} is below {MIN_PART}")
    if not wrong:
        for part, mine, other in (("compute", compute, memory), ("memory", memory, compute)):
            if mine["breakdown"][part] < (other["breakdown"][part] or 0) + MARGIN:
                wrong.append(f"{part} part does not separate the workloads: {mine['breakdown'][part]:.2f} "
                             f"vs {other['breakdown'][part] or 0:.2f}")
    return wrong


def samplers_used(*reports: dict[str, Any]) -> str:
    """The GPU samplers that recorded the reports, by kind: "gpm", "dcgm", "dcgm, nvml" ..."""
    kinds = {str(label.get("kind")) for rep in reports
             for label in ((rep.get("meta") or {}).get("samplers") or {}).values() if isinstance(label, dict)}
    return ", ".join(sorted(kinds)) or "unknown"


def _check_gpu() -> None:
    try:
        import torch
    except ImportError:
        raise UsageError("the selftest needs torch: pip install 'hpcml[torch]'") from None
    if not torch.cuda.is_available():
        raise UsageError("no CUDA GPU visible to torch: run the selftest on a GPU node "
                         "(srun -N1 --gpus=1 hpcml score selftest)")


def run(*, seconds: float, keep: Path | None, gpu_metrics: str = "auto") -> int:
    from hpcml.observe.recorder import record
    from hpcml.score.importers import load
    from hpcml.score.report import build
    from hpcml.score.terminal import print_summary
    _check_gpu()
    base = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="hpcml-selftest-"))
    reports = {}
    for kind in ("compute", "memory"):
        d = base / kind
        rc = record([sys.executable, "-m", "hpcml.score.workloads", kind, "--seconds", str(seconds)],
                    d, interval=0.5, gpu_metrics=gpu_metrics)
        if rc != 0:
            print(f"selftest: the {kind} workload exited with {rc}")
            return FAILED
        reports[kind] = build(load(d, "store"))
        print(f"--- {kind}-bound workload")
        print_summary(reports[kind], None)
    wrong = judge(reports["compute"], reports["memory"])
    used = samplers_used(reports["compute"], reports["memory"])
    for w in wrong:
        print(f"selftest: FAILED ({used} sampler): {w}")
    if not wrong:
        print(f"selftest: passed: both workloads ranked and classified correctly; verified the {used} sampler")
    print(f"recordings: {base}")
    return FAILED if wrong else 0
