"""``hpcml.vet.launch``: the workers' step, harvested as soon as every node answered."""

from __future__ import annotations

import sys
import time

from hpcml.vet.launch import SRUN_GRACE, Step

#: stands in for srun: each node's report on the wire (as srun relays its workers' lines),
#: then it stays, as an srun whose tasks exited can still be tearing its I/O down
LINGERING = """
import sys, time
from hpcml.vet import wire
for node in ("n1", "n2"):
    sys.stdout.write(wire.encode(node, {"node": node, "results": [], "reachable": True, "message": "",
                                        "sent_at": time.time()}))
sys.stdout.flush()
time.sleep(120)
"""


def test_a_step_whose_every_node_answered_is_judged_without_waiting_for_its_end():
    """Every node's result is in: the harvest returns while the step still runs (the verdict
    waits for nothing srun's end could tell it), and the step is then stopped after
    ``SRUN_GRACE``, not left running. The step is a local process in srun's place: what is
    tested is the harvest's order, which needs no Slurm."""
    step = Step([sys.executable, "-c", LINGERING], expected=2)
    step.send(None)
    result = step.harvest(time.time() + 60)
    assert sorted(result.reports) == ["n1", "n2"] and not result.timed_out
    assert step.proc.poll() is None                  # judged before the step's end
    step.proc.wait(timeout=SRUN_GRACE + 30)          # the reaper stops it: nothing left running
    assert step.proc.returncode is not None and step.proc.returncode != 0
