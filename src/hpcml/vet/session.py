"""One vetting of the allocation, as ``hpcml vet run`` and ``hpcml run --vet`` do it.

Node workers are started before the protocol is validated (their start-up overlaps it),
the protocol runs on every node, and report.json, bad-nodes and good-nodes are written.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

from hpcml import logs
from hpcml.errors import UsageError
from hpcml.phases import phase

log = logs.get(__name__)


def vet_job(protocol: Path, *, min_nodes: int | None = None, deadline: str | None = None, nodes: str | None = None,
            out: Path | None = None, exclude_file: Path | None = None, good_file: Path | None = None,
            workdir: Path | None = None, venv_root: Path | None = None, local: bool = False,
            allocation: Any = None, only: Collection[str] | None = None,
            started: Any = None) -> tuple[Any, dict[str, Path]]:
    """``(VetRun, output paths)``; bad input raises a UsageError (one line, exit 2).
    ``only``: the protocol's checks to run (``--vet auto``'s tier), by name. ``started``:
    workers already started on every node of the allocation (``launch.Step``), used and
    then owned here (stopped on bad input)."""
    from hpcml.cluster import allocation as alloc_mod
    from hpcml.cluster.hostlist import expand
    from hpcml.vet import launch
    early = started
    try:   # bad input ends the command, after stopping early workers
        allocation = allocation or alloc_mod.current()
        subset = expand(nodes) if nodes else None
        if subset and (unknown := [n for n in subset if n not in allocation.nodes]):
            raise UsageError(f"not in this allocation: {', '.join(unknown)}", key="nodes")
        if early is not None and (local or venv_root or subset):
            early.cancel()                        # not workers these nodes and this interpreter can use
            early = None
        if early is None and not local and not venv_root and allocation.under_slurm and allocation.step_id is None:
            with phase("vet.fan-out"):            # srun's step: every node's worker starts in parallel
                early = launch.start_workers(subset or list(allocation.nodes), preload=launch.preload_hint(protocol))
        from hpcml.vet import engine, report, setup
        from hpcml.vet.protocol import load, positive_seconds
        if early is not None and early.sent is not None and only is not None:
            early.cancel()                        # told the whole protocol: not what --vet auto chose
            early = None
        proto = early.protocol if early is not None and early.protocol is not None else load(protocol)
        proto.unset_variables()
        if only is not None:
            from dataclasses import replace
            proto = replace(proto, evals=[e for e in proto.evals if e.name in only])
        try:
            limit = positive_seconds(deadline) if deadline is not None else None
        except ValueError as exc:
            raise UsageError(str(exc), key="deadline") from None
        out_dir = out or Path(f"hpcml-vet-{allocation.job_id or 'local'}")
        report.check_writable(out_dir, exclude_file=exclude_file, good_file=good_file, workdir=workdir)
        python = setup.python_of(proto, venv_root)
        if venv_root and proto.requirements() and python is None:
            log.info(f"hpcml vet: requirements not set up in {venv_root}: run "
                  f"`hpcml vet setup {protocol} --venv-root {venv_root}`; checks that need "
                  "them will end in error")
        run_ = engine.vet(proto, allocation, nodes=subset, min_nodes=min_nodes, deadline=limit,
                          workdir=str(workdir or out_dir / "work"),
                          use_srun=False if local else None, python=python, started=early)
        early = None
        with phase("vet.write"):
            try:
                paths = report.write_outputs(run_, out_dir, exclude_file=exclude_file, good_file=good_file)
            except OSError as exc:    # checked before the run, yet gone (a full disk): the verdict stands
                why = exc.strerror or str(exc)
                log.error(f"hpcml vet: error: {why}; the verdict ({run_.verdict.decision.value}) stands")
                run_.notes.append(f"outputs not written: {why}")
                paths = report.output_paths(out_dir, exclude_file=exclude_file, good_file=good_file)
    finally:
        if early is not None:
            early.cancel()
    return run_, paths
