"""Who holds up a hung job, from what the ranks left: heartbeats, stacks, Flight Recorder dumps.

In order of trust:

1. **Flight Recorder**: when the ranks' dumps are there, the hang analysis
   (``hpcml.observe.hang``) names the roots per process group from the collectives each
   rank entered, started and completed.
2. **Progress**: ranks whose last completed step is behind the furthest rank's did not
   reach the collective the others wait in (ranks that log no steps at all, as when only
   rank 0 logs, are left to the stacks).
3. **Stacks**: among ranks at the same step, those whose main thread is *not* inside a
   collective (a ``torch.distributed`` frame) are stuck elsewhere (the data loader, a
   deadlock, a C call holding the GIL); the others wait for them.

Each culprit gets the line of its own code it is stuck on: the innermost frame of its main
thread outside the interpreter's and installed packages' files (py-spy reads it without the
rank's cooperation), else the innermost frame.
"""

from __future__ import annotations

import os
import sysconfig
from collections.abc import Mapping
from typing import TYPE_CHECKING

from hpcml.jobmodel import Culprit, HangVerdict
from hpcml.observe.beat import Beat
from hpcml.observe.stacks import Stack
from hpcml.words import printable, ranges

if TYPE_CHECKING:
    from hpcml.observe.hang import HangReport

COLLECTIVE_FILES = ("torch/distributed/", "torch/nn/parallel/distributed.py")
_LIBRARY_DIRS = tuple({os.path.realpath(p) + os.sep for p in
                       (sysconfig.get_path("stdlib"), sysconfig.get_path("purelib"), sysconfig.get_path("platlib"))})


def _library(path: str) -> bool:
    try:
        return os.path.realpath(path).startswith(_LIBRARY_DIRS) or "site-packages" in path
    except (ValueError, OSError):                 # a NUL byte, or worse: not a file of the rank's code
        return True


def stack_line(stack: Stack | None) -> str | None:
    """The user's line the main thread is on: innermost frame outside libraries."""
    frames = stack.main_thread() if stack is not None else ()
    if not frames:
        return None
    own = next((f for f in frames if f.file and not _library(f.file)), frames[0])
    # the stack's names are the job's program's: printed as text, never as terminal escapes
    return printable(f"{own.file}:{own.line} in {own.name}", 500)


def in_collective(stack: Stack | None) -> bool | None:
    """Whether the main thread waits inside torch.distributed; None without a stack."""
    frames = stack.main_thread() if stack is not None else ()
    if not frames:
        return None
    return any(any(m in (f.file or "") for m in COLLECTIVE_FILES) for f in frames)


def _ranks(ranks: list[int]) -> str:
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {ranges(ranks)}"


def name(beats: Mapping[int, Beat], stacks: Mapping[int, Stack], fr: HangReport | None = None,
         done: tuple[int, ...] = ()) -> HangVerdict:
    """The culprits of a hang; ``fr`` is ``hpcml.observe.hang.analyse``'s report, if dumps came;
    ``done``: the ranks that already ended with exit 0 (not in ``beats``)."""
    def culprit(rank: int, why: str) -> Culprit:
        return Culprit(rank=rank, node=b.node if (b := beats.get(rank)) else None, where=stack_line(stacks.get(rank)), why=why)

    ranks = sorted(beats)
    roots = list(fr.roots) if fr is not None else []
    if fr is not None and not roots:
        roots = sorted({r for f in fr.findings for r in f.culprits})
    if fr is not None and roots:
        blocked = sorted(r for r in ranks if r not in roots)
        details = {r: f.detail for f in fr.findings for r in f.culprits}
        return HangVerdict(method="flight-recorder", culprits=[
            culprit(r, details.get(r, "root of the hang (Flight Recorder)")) for r in roots], blocked=blocked, note="")
    alive = [r for r, b in beats.items() if b.exit is None]
    if fr is not None and "nccl" in fr.backends and not fr.findings and not fr.missing \
            and set(fr.dumps) >= set(ranks) and alive and set(fr.pending) >= set(alive):
        # every rank's GPU view is here, every rank waits in a collective on it, and they agree
        # on all of them: the host-side positions below (the step each CPU reached, whether its
        # stack is in torch.distributed) say where each CPU synchronised with its GPU (a
        # loss.item() blocks first), not who holds the GPUs up. (A mismatch is a finding; a
        # rank stuck in host code with nothing pending on its GPU is left to the rules below.)
        return HangVerdict(method="none", culprits=[], blocked=[], note=(
            "the Flight Recorder names no root: every rank reached the collectives on its GPU (NCCL); "
            "a network or GPU fault, not one rank (the ranks' steps and stacks show where their CPUs "
            "waited for the GPU, not who is late)"))
    # (restarts of the step numbering, step): a per-epoch count compares by epoch first
    steps = {r: (b.restarts, b.step) for r, b in beats.items() if b.exit is None and b.step is not None}
    if steps and min(steps.values()) < max(steps.values()):   # ranks that log no step are not judged here
        top = max(steps.values())
        behind = sorted(r for r, s in steps.items() if s < top)
        return HangVerdict(method="progress", culprits=[
            culprit(r, f"behind: last step {steps[r][1]}, others at {top[1]}") for r in behind],
            blocked=sorted(r for r in steps if r not in behind), note="")
    running = sorted(r for r, b in beats.items() if b.exit is None)
    if done and running and not any(in_collective(stacks.get(r)) for r in running):
        # the others ended their work well: nobody waits for these ranks, they are stuck on their own
        return HangVerdict(method="progress", culprits=[
            culprit(r, f"still running, stepless, after {_ranks(list(done))} ended with exit 0") for r in running],
            blocked=[], note="")
    waiting = {r: in_collective(stacks.get(r)) for r, b in beats.items() if b.exit is None}
    outside = sorted(r for r, w in waiting.items() if w is False)
    inside = sorted(r for r, w in waiting.items() if w)
    if outside and inside:
        return HangVerdict(method="stacks", culprits=[
            culprit(r, "not in a collective while the others wait in one") for r in outside], blocked=inside, note="")
    missing = sorted(r for r, w in waiting.items() if w is None)
    note = ("every rank waits in a collective: a network or GPU fault, or a mismatch the Flight Recorder would show"
            if inside and not outside else "no rank waits in a collective" if outside else "no stack could be read")
    if missing:
        note += f"; no stack from ranks {ranges(missing)}"
    return HangVerdict(method="none", culprits=[], blocked=[], note=note)
